import { CompiledQuery, type DatabaseConnection, type QueryResult } from 'kysely';
import { inlineParameters } from './inline-parameters.js';
import { sqlStateOf } from './pg-errors.js';
import { LEASE_LOST_STATE } from './sql/complete-and-commit.js';

/**
 * One transaction shared by several jobs, one after another on one connection (group commit):
 * each job runs inside its own savepoint, so a job that fails rolls back only itself, and the
 * group pays for one BEGIN and one COMMIT (one WAL flush) in all.
 *
 * Control statements never take a round trip of their own. They wait in `#pending` and go out
 * at the front of the next statement sent on the connection, as one simple-protocol string: a
 * job's closing statement (its fenced completion, say), `RELEASE SAVEPOINT` and the next job's
 * `SAVEPOINT` travel with that job's first statement (its claim, or the first statement of its
 * effect), or with the COMMIT. To share a string with control statements, the job's statement
 * is written with its parameters inlined as literals ({@link inlineParameters}); the connection
 * must answer a string of statements with the last one's rows (`returnsLastResult`). When it
 * cannot, or a statement carries binary values, the pending statements go out on their own
 * first.
 *
 * A job's closing statement may fail on purpose: a lost lease raises `LEASE_LOST_STATE`.
 * Postgres then skips the rest of the string; the recovery rolls back to that job's savepoint
 * and sends what was skipped, and the job reports the error. Any other error in a string that
 * carried a job's statement is that statement's (the control statements before it succeeded).
 *
 * A job that has started must end (`endJob` or `abortJob`) before the next `startJob`.
 */
export class GroupTransaction {
  readonly #connection: DatabaseConnection;
  readonly #mergeStatements: boolean;
  #pending: string[] = ['begin'];
  #jobs = 0;
  /** The job whose closing statement is in `#pending`, not yet confirmed by Postgres. */
  #unconfirmed: { savepoint: string; onError: (error: unknown) => void } | undefined;

  /** `mergeStatements`: the connection returns a multi-statement string's last result (see above). */
  constructor(connection: DatabaseConnection, options: { mergeStatements: boolean }) {
    this.#connection = connection;
    this.#mergeStatements = options.mergeStatements;
  }

  /** The connection the group's jobs run their statements on (wrap the pooled one with it). */
  get connection(): DatabaseConnection {
    return {
      executeQuery: (query) => this.#executeJobStatement(query),
      streamQuery: (query, chunkSize) => this.#streamJobStatement(query, chunkSize),
    };
  }

  /** Opens the next job's savepoint (sent with the job's first statement). */
  startJob(): void {
    this.#jobs++;
    this.#pending.push(`savepoint ${this.#savepoint()}`);
  }

  /**
   * The current job succeeded: `closing` (literal SQL, may be empty) runs next, then its
   * savepoint is released, both sent with the next statement. If `closing` fails, `onError` gets
   * the error and the job's work is rolled back; the group goes on.
   */
  endJob(closing: string | undefined, onError: (error: unknown) => void): void {
    const savepoint = this.#savepoint();
    this.#pending.push(...(closing ? [closing] : []), `release savepoint ${savepoint}`);
    this.#unconfirmed = { savepoint, onError };
  }

  /** The current job failed or has nothing to commit: its work is rolled back with the next statement. */
  abortJob(): void {
    const savepoint = this.#savepoint();
    this.#pending.push(`rollback to savepoint ${savepoint}`, `release savepoint ${savepoint}`);
  }

  /** Sends what is pending and COMMIT (one round trip). Throws when the group could not commit. */
  commit(): Promise<void> {
    return this.#sendPending(['commit']);
  }

  /** Ends the group without keeping anything (after a failure that left it unusable). */
  async rollback(): Promise<void> {
    this.#pending = [];
    this.#unconfirmed = undefined;
    await this.#connection.executeQuery(CompiledQuery.raw('rollback'));
  }

  #savepoint(): string {
    return `job_${this.#jobs}`;
  }

  async #executeJobStatement<R>(query: CompiledQuery): Promise<QueryResult<R>> {
    if (this.#pending.length === 0) return this.#connection.executeQuery<R>(query);
    const inlined = this.#mergeStatements ? inlineParameters(query.sql, query.parameters) : undefined;
    if (inlined === undefined) {
      await this.#sendPending([]);
      return this.#connection.executeQuery<R>(query);
    }
    const statements = this.#takePending();
    const unconfirmed = this.#unconfirmed;
    this.#unconfirmed = undefined;
    try {
      return await this.#connection.executeQuery<R>(CompiledQuery.raw([...statements, inlined].join(';\n')));
    } catch (error) {
      if (!unconfirmed || sqlStateOf(error) !== LEASE_LOST_STATE) throw error; // the job statement's own error
      // The previous job's closing failed, so nothing after it ran: roll that job back, then
      // send the rest again with this statement.
      this.#pending = [...this.#recoveryFor(unconfirmed.savepoint), ...afterRelease(statements, unconfirmed.savepoint)];
      unconfirmed.onError(error);
      return this.#executeJobStatement<R>(query);
    }
  }

  async *#streamJobStatement<R>(query: CompiledQuery, chunkSize?: number): AsyncIterableIterator<QueryResult<R>> {
    await this.#sendPending([]);
    yield* this.#connection.streamQuery<R>(query, chunkSize);
  }

  /** Sends the pending statements and `next` as one string (no job statement with them). */
  async #sendPending(next: string[]): Promise<void> {
    const statements = [...this.#takePending(), ...next];
    const unconfirmed = this.#unconfirmed;
    this.#unconfirmed = undefined;
    if (statements.length === 0) return;
    try {
      await this.#connection.executeQuery(CompiledQuery.raw(statements.join(';\n')));
    } catch (error) {
      // Only an SQL error can be the closing statement's (a broken connection has no SQLSTATE);
      // if the transaction is gone (the COMMIT itself failed), the recovery fails and so does the group.
      if (!unconfirmed || sqlStateOf(error) === undefined) throw error;
      const rest = [...this.#recoveryFor(unconfirmed.savepoint), ...afterRelease(statements, unconfirmed.savepoint)];
      await this.#connection.executeQuery(CompiledQuery.raw(rest.join(';\n')));
      unconfirmed.onError(error);
    }
  }

  #takePending(): string[] {
    const statements = this.#pending;
    this.#pending = [];
    return statements;
  }

  #recoveryFor(savepoint: string): string[] {
    return [`rollback to savepoint ${savepoint}`, `release savepoint ${savepoint}`];
  }
}

/** The statements after the release of `savepoint` (those a failed closing statement skipped). */
function afterRelease(statements: string[], savepoint: string): string[] {
  return statements.slice(statements.indexOf(`release savepoint ${savepoint}`) + 1);
}
