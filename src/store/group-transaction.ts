import type { DatabaseConnection } from 'kysely';
import { MergingConnection } from './merging-connection.js';
import { sqlStateOf } from './pg-errors.js';
import { LEASE_LOST_STATE } from './sql/complete-and-commit.js';

/**
 * One transaction shared by several jobs, one after another on one connection (group commit):
 * each job runs inside its own savepoint, so a job that fails rolls back only itself, and the
 * group pays for one BEGIN and one COMMIT (one WAL flush) in all.
 *
 * Control statements never take a round trip of their own ({@link MergingConnection}): a job's
 * closing statement (its fenced completion, say), `RELEASE SAVEPOINT` and the next job's
 * `SAVEPOINT` travel with that job's first statement (its claim, or the first statement of its
 * effect), and the last job's with the COMMIT.
 *
 * A job's closing statement may fail on purpose: a lost lease raises `LEASE_LOST_STATE`.
 * Postgres then skips the rest of the string; the recovery rolls back to that job's savepoint
 * and sends what was skipped again, and the job reports the error. Any other error in a string
 * that carried a job's statement is that statement's (the control statements before it
 * succeeded); in a string of control statements only, any SQL error is the closing
 * statement's. If the COMMIT itself fails, the recovery fails too, and so does the group.
 *
 * A job that has started must end (`endJob` or `abortJob`) before the next `startJob`;
 * {@link runShared} runs between jobs.
 */
export class GroupTransaction {
  readonly #connection: MergingConnection;
  #jobs = 0;
  #sharedWork = 0;
  /** The job whose closing statement is deferred, not yet confirmed by Postgres. */
  #unconfirmed: { savepoint: string; onError: (error: unknown) => void; undo: readonly string[] } | undefined;

  /** `mergeStatements`: the connection returns a multi-statement string's last result (`returnsLastResult`). */
  constructor(connection: DatabaseConnection, options: { mergeStatements: boolean }) {
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
    return this.#connection;
  }

  /** Opens the next job's savepoint (sent with the job's first statement). */
  startJob(): void {
    this.#jobs++;
    this.#confirmSent();
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
    this.#connection.defer(...(closing ? [closing] : []), `release savepoint ${savepoint}`);
    this.#unconfirmed = { savepoint, onError, undo };
  }

  /**
   * The current job failed or has nothing to commit: its work is rolled back with the next
   * statement, then `undo` runs: literal SQL that reverts what {@link runShared} did for this
   * job before its savepoint (its claim), which rolling back to the savepoint cannot reach.
   */
  abortJob(undo: readonly string[] = []): void {
    const savepoint = this.#savepoint();
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
    this.#connection.defer(`savepoint ${savepoint}`);
    try {
      const value = await work();
      this.#connection.defer(`release savepoint ${savepoint}`);
      return { value };
    } catch (error) {
      if (sqlStateOf(error) === undefined) throw error;
      this.#connection.defer(`rollback to savepoint ${savepoint}`, `release savepoint ${savepoint}`);
      return { error };
    }
  }

  /** Sends what is deferred and COMMIT (one round trip). Throws when the group could not commit. */
  commit(): Promise<void> {
    return this.#connection.flush(['commit']);
  }

  /** Ends the group without keeping anything (after a failure that left it unusable). */
  async rollback(): Promise<void> {
    this.#connection.discard();
    this.#unconfirmed = undefined;
    await this.#connection.flush(['rollback']);
  }

  #savepoint(): string {
    return `job_${this.#jobs}`;
  }

  /** A closing statement no longer deferred went out without failing. */
  #confirmSent(): void {
    const unconfirmed = this.#unconfirmed;
    if (unconfirmed && !this.#connection.deferred.includes(`release savepoint ${unconfirmed.savepoint}`)) this.#unconfirmed = undefined;
  }

  async #recover(error: unknown, sent: readonly string[], withStatement: boolean): Promise<string[] | undefined> {
    const unconfirmed = this.#unconfirmed;
    const release = unconfirmed ? sent.indexOf(`release savepoint ${unconfirmed.savepoint}`) : -1;
    const state = sqlStateOf(error);
    // Only an SQL error can be the closing statement's (a broken connection has none), and only
    // the deliberate one when a job's own statement came after it.
    const closingFailed = unconfirmed && release >= 0 && state !== undefined && (!withStatement || state === LEASE_LOST_STATE);
    if (!closingFailed) return undefined;
    this.#unconfirmed = undefined;
    // Nothing after the closing statement ran: roll its job back, then send the rest again.
    unconfirmed.onError(error);
    return [`rollback to savepoint ${unconfirmed.savepoint}`, `release savepoint ${unconfirmed.savepoint}`, ...unconfirmed.undo, ...sent.slice(release + 1)];
  }
}
