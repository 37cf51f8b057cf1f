import { CompiledQuery, type DatabaseConnection, type QueryResult } from 'kysely';
import { MergingConnection } from './merging-connection.js';
import { sqlStateOf } from './pg-errors.js';
import { LEASE_LOST_STATE } from './sql/complete-and-commit.js';

/** A job that ended with a closing statement Postgres has not confirmed yet. */
interface EndedJob {
  readonly onError: (error: unknown) => void;
  readonly undo: readonly string[];
}

/** The work running now, in its own savepoint: a job, or shared work between jobs. */
interface RunningWork {
  readonly savepoint: string;
  /** The first SQL error one of its statements raised: its savepoint is aborted from then on. */
  failure?: unknown;
}

/**
 * One transaction shared by several jobs, one after another on one connection (group commit):
 * each job runs inside its own savepoint, so a job that fails rolls back only itself, and the
 * group pays for one BEGIN and one COMMIT (one WAL flush) in all.
 *
 * Control statements never take a round trip of their own ({@link MergingConnection}): a job's
 * closing statement (its fenced completion, say), `RELEASE SAVEPOINT` and the next job's
 * `SAVEPOINT` travel with that job's first statement (its claim, or the first statement of its
 * effect), and the last job's with the COMMIT. Jobs that send no statement of their own (an
 * external effect whose result is stored) pile their closing statements up in one string.
 *
 * A failure is its own job's, never a group-mate's. A closing statement may fail (a lost lease
 * raises `LEASE_LOST_STATE` on purpose), and Postgres then skips the rest of the string; which
 * statement failed shows in which savepoint exists afterwards, since the jobs' savepoints are
 * opened and released one after another: the failed part's is the one left. The recovery rolls
 * back to each candidate in turn (the savepoint of the work whose statement ended the string,
 * and those of the jobs whose closing statements rode in it) until one exists. A job whose
 * closing statement failed reports the error and its work is undone; what came after it in the
 * string is sent again. The running work's own statement failing is thrown to it as usual. If
 * no candidate exists (the COMMIT itself failed), the recovery fails, and so does the group.
 *
 * A job whose statement failed cannot commit (its savepoint is aborted), even if it caught the
 * error: its further statements fail at once, and {@link statementFailure} tells the group to
 * roll it back and fail it with that error; the group goes on.
 *
 * A job that has started must end (`endJob` or `abortJob`) before the next `startJob`;
 * {@link runShared} runs between jobs.
 */
export class GroupTransaction {
  readonly #inner: DatabaseConnection;
  readonly #connection: MergingConnection;
  /** What the jobs run on: the merging connection, refusing the statements of work that already failed. */
  readonly #guarded: DatabaseConnection = {
    executeQuery: <R>(query: CompiledQuery): Promise<QueryResult<R>> => {
      this.#refuseAfterFailure();
      return this.#connection.executeQuery<R>(query);
    },
    streamQuery: <R>(query: CompiledQuery, chunkSize?: number): AsyncIterableIterator<QueryResult<R>> => {
      this.#refuseAfterFailure();
      return this.#connection.streamQuery<R>(query, chunkSize);
    },
  };
  #jobs = 0;
  #sharedWork = 0;
  #running: RunningWork | undefined;
  /**
   * Jobs that ended with a closing statement, by savepoint, until the recovery attributes a
   * failure to one. Only those whose `release savepoint` is in a failed string are candidates,
   * so a confirmed one left here is never looked at again.
   */
  readonly #ended = new Map<string, EndedJob>();

  /** `mergeStatements`: the connection returns a multi-statement string's last result (`returnsLastResult`). */
  constructor(connection: DatabaseConnection, options: { mergeStatements: boolean }) {
    this.#inner = connection;
    this.#connection = new MergingConnection(connection, {
      mergeStatements: options.mergeStatements,
      recover: (error, sent, withStatement) => this.#recover(error, sent, withStatement),
    });
    this.#connection.defer('begin isolation level read committed');
  }

  /** Savepoints opened so far (jobs' and shared work's): each that writes takes a subtransaction id. */
  get savepoints(): number {
    return this.#jobs + this.#sharedWork;
  }

  /** The connection the group's jobs run their statements on. */
  get connection(): DatabaseConnection {
    return this.#guarded;
  }

  /**
   * The first SQL error a statement of the running job raised, if any: its savepoint is
   * aborted, so it must end with {@link abortJob} (it cannot commit), even if it caught the error.
   */
  get statementFailure(): unknown {
    return this.#running?.failure;
  }

  /** Opens the next job's savepoint (sent with the job's first statement). */
  startJob(): void {
    this.#jobs++;
    this.#running = { savepoint: this.#savepoint() };
    this.#connection.defer(`savepoint ${this.#savepoint()}`);
  }

  /**
   * The current job succeeded: `closing` (literal SQL, may be empty) runs next, then its
   * savepoint is released, both sent with the next statement. If `closing` fails, `onError` gets
   * the error and the job's work is rolled back, followed by `undo` (see {@link abortJob}); the
   * group goes on.
   */
  endJob(closing: string | undefined, onError: (error: unknown) => void, undo: readonly string[] = []): void {
    const savepoint = this.#savepoint();
    this.#running = undefined;
    this.#connection.defer(...(closing ? [closing] : []), `release savepoint ${savepoint}`);
    this.#ended.set(savepoint, { onError, undo });
  }

  /**
   * The current job failed or has nothing to commit: its work is rolled back with the next
   * statement, then `undo` runs: literal SQL that reverts what {@link runShared} did for this
   * job before its savepoint (its claim), which rolling back to the savepoint cannot reach.
   */
  abortJob(undo: readonly string[] = []): void {
    const savepoint = this.#savepoint();
    this.#running = undefined;
    this.#connection.defer(`rollback to savepoint ${savepoint}`, `release savepoint ${savepoint}`, ...undo);
  }

  /**
   * Runs `work` between two jobs, for several jobs at once (the fast path's claims of the jobs
   * about to run), inside a savepoint of its own: when it fails with an SQL error (a lock
   * timeout, say), only it is rolled back, and the result says so; the group goes on. Any
   * other error (a broken connection) is thrown.
   */
  async runShared<T>(work: () => Promise<T>): Promise<{ readonly value: T } | { readonly error: unknown }> {
    const savepoint = `shared_${++this.#sharedWork}`;
    this.#running = { savepoint };
    this.#connection.defer(`savepoint ${savepoint}`);
    try {
      const value = await work();
      this.#connection.defer(`release savepoint ${savepoint}`);
      return { value };
    } catch (error) {
      if (sqlStateOf(error) === undefined) throw error;
      this.#connection.defer(`rollback to savepoint ${savepoint}`, `release savepoint ${savepoint}`);
      return { error };
    } finally {
      this.#running = undefined;
    }
  }

  /** Sends what is deferred and COMMIT (one round trip). Throws when the group could not commit. */
  commit(): Promise<void> {
    return this.#connection.flush(['commit']);
  }

  /** Ends the group without keeping anything (after a failure that left it unusable). */
  async rollback(): Promise<void> {
    this.#connection.discard();
    this.#ended.clear();
    this.#running = undefined;
    await this.#connection.flush(['rollback']);
  }

  #savepoint(): string {
    return `job_${this.#jobs}`;
  }

  /** A statement of work whose savepoint is aborted would fail in Postgres anyway: fail it here, saying why. */
  #refuseAfterFailure(): void {
    const running = this.#running;
    if (running && running.failure !== undefined) throw new StatementAfterFailureError(running.failure);
  }

  async #recover(error: unknown, sent: readonly string[], withStatement: boolean): Promise<string[] | undefined> {
    // A broken connection has no SQLSTATE: nothing to attribute, the group cannot go on.
    if (sqlStateOf(error) === undefined) return undefined;
    const running = withStatement ? this.#running : undefined;
    const ended = sent.flatMap((statement) => {
      const savepoint = /^release savepoint (\S+)$/.exec(statement)?.[1];
      return savepoint !== undefined && this.#ended.has(savepoint) ? [savepoint] : [];
    });
    if (ended.length === 0) {
      // No closing statement went out: the running work's own statement failed (or the COMMIT).
      if (running) running.failure ??= error;
      return undefined;
    }
    // Try the likeliest first: a lost lease is a closing statement's; anything else, most often the statement's.
    const own = running ? [running.savepoint] : [];
    const candidates = sqlStateOf(error) === LEASE_LOST_STATE ? [...ended, ...own] : [...own, ...ended];
    for (const savepoint of candidates) {
      const found = await this.#rollBackTo(savepoint);
      if (found === 'broken') return undefined;
      if (found === 'absent') continue;
      if (savepoint === running?.savepoint) {
        // Everything before the statement ran; the statement failed, and its work is rolled back.
        running.failure ??= error;
        return undefined;
      }
      // This job's closing statement failed: the job fails alone; what came after it goes again.
      const job = this.#ended.get(savepoint)!;
      this.#ended.delete(savepoint);
      job.onError(error);
      return [`release savepoint ${savepoint}`, ...job.undo, ...sent.slice(sent.indexOf(`release savepoint ${savepoint}`) + 1)];
    }
    return undefined;
  }

  /** Rolls back to `savepoint` if it exists (in an aborted transaction, only rollbacks run): whether it did. */
  async #rollBackTo(savepoint: string): Promise<'rolled back' | 'absent' | 'broken'> {
    try {
      await this.#inner.executeQuery(CompiledQuery.raw(`rollback to savepoint ${savepoint}`));
      return 'rolled back';
    } catch (error) {
      return sqlStateOf(error) === undefined ? 'broken' : 'absent';
    }
  }
}

/**
 * A statement of a job after one of its statements failed: its savepoint is aborted, so it
 * cannot run (SQLSTATE 25P02, as Postgres would answer), and the job will be rolled back.
 */
class StatementAfterFailureError extends Error {
  readonly code = '25P02';

  constructor(failure: unknown) {
    super(
      'current transaction is aborted, commands ignored until end of transaction block: an earlier statement of this job failed ' +
        `(${failure instanceof Error ? failure.message : String(failure)}); the job's work will be rolled back`,
      { cause: failure },
    );
    this.name = 'StatementAfterFailureError';
  }
}
