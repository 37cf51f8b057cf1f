import { sql, type Transaction } from 'kysely';
import { sqlStateOf } from './pg-errors.js';

/**
 * One transaction shared by several jobs, one after another on one connection (group commit):
 * each job runs inside its own savepoint, so a job that fails rolls back only itself, and the
 * group pays for one BEGIN and one COMMIT (one WAL flush) in all.
 *
 * Control statements never take a round trip of their own. They wait in `#pending` and go out
 * at the front of the next write, as one simple-protocol string: a job's closing statement
 * (its fenced completion, say) and `RELEASE SAVEPOINT` travel with the next job's `SAVEPOINT`,
 * or with the COMMIT. A job's closing statement may fail on purpose (a lost lease): Postgres
 * then skips the rest of the string, the transaction waits in the failed state, and the
 * recovery rolls back to that job's savepoint and sends what was skipped. Every other failure
 * (a dropped connection, a COMMIT refused) fails the group.
 *
 * A job that has started must end (`endJob` or `abortJob`) before the next `startJob`.
 */
export class GroupTransaction {
  readonly tx: Transaction<any>;
  #pending: string[] = ['begin'];
  #jobs = 0;
  /** The job whose closing statement is in `#pending`, not yet confirmed by Postgres. */
  #unconfirmed: { savepoint: string; onError: (error: unknown) => void } | undefined;

  constructor(tx: Transaction<any>) {
    this.tx = tx;
  }

  /** Jobs started so far. */
  get size(): number {
    return this.#jobs;
  }

  /** Opens the next job's savepoint (sent with whatever is pending: one round trip). */
  async startJob(): Promise<void> {
    this.#jobs++;
    await this.#send([`savepoint ${this.#savepoint()}`]);
  }

  /**
   * The current job succeeded: `closing` (literal SQL, may be empty) runs next, then its
   * savepoint is released, both sent with the next write. If `closing` fails, `onError` gets
   * the error and the job's work is rolled back; the group goes on.
   */
  endJob(closing: string | undefined, onError: (error: unknown) => void): void {
    const savepoint = this.#savepoint();
    this.#pending.push(...(closing ? [closing] : []), `release savepoint ${savepoint}`);
    this.#unconfirmed = { savepoint, onError };
  }

  /** The current job failed or has nothing to commit: its work is rolled back with the next write. */
  abortJob(): void {
    const savepoint = this.#savepoint();
    this.#pending.push(`rollback to savepoint ${savepoint}`, `release savepoint ${savepoint}`);
  }

  /** Sends what is pending and COMMIT (one round trip). Throws when the group could not commit. */
  commit(): Promise<void> {
    return this.#send(['commit']);
  }

  /** Ends the group without keeping anything (after a failure that left it unusable). */
  async rollback(): Promise<void> {
    this.#pending = [];
    await sql`rollback`.execute(this.tx);
  }

  #savepoint(): string {
    return `job_${this.#jobs}`;
  }

  async #send(next: string[]): Promise<void> {
    const statements = [...this.#pending, ...next];
    const unconfirmed = this.#unconfirmed;
    this.#pending = [];
    this.#unconfirmed = undefined;
    try {
      await this.#execute(statements);
    } catch (error) {
      // Only an SQL error can be the closing statement's (a broken connection has no SQLSTATE);
      // if the transaction is gone (the COMMIT itself failed), the recovery fails and so does the group.
      if (!unconfirmed || sqlStateOf(error) === undefined) throw error;
      const skipped = statements.slice(statements.indexOf(`release savepoint ${unconfirmed.savepoint}`) + 1);
      await this.#execute([`rollback to savepoint ${unconfirmed.savepoint}`, `release savepoint ${unconfirmed.savepoint}`, ...skipped]);
      unconfirmed.onError(error);
    }
  }

  async #execute(statements: string[]): Promise<void> {
    await sql.raw(statements.join(';\n')).execute(this.tx);
  }
}
