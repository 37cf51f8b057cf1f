import type { Kysely } from 'kysely';
import { ConfigError } from '../errors.js';
import { sqlStateOf } from './pg-errors.js';
import { runInSearchPath, type ForeignStatementResult } from './sql/in-search-path.js';
import { runQualifiedCall } from './sql/queue-function-call.js';

/**
 * Runs BullMQ's PostgreSQL statements on a caller's transaction, for a producer that enqueues in
 * that transaction (the job exists if and only if it commits), and for a worker that moves its
 * job to completed in its effect's transaction. The statements are BullMQ's; this store only
 * places them: in BullMQ's schema, on the caller's connection. One call of one of BullMQ's
 * functions (the move to completed, the add of a job) goes as one statement naming the function
 * with its schema, which can share a group commit's transaction; any other statement runs with
 * `search_path` switched for it (`sql/in-search-path.ts`), which a group refuses.
 */
export class QueueTransactionStore {
  constructor(
    /** The schema BullMQ keeps the queue in. */
    readonly queueSchema: string,
    /**
     * For a worker that finishes its job in its effect's transaction: BullMQ's functions whose
     * calls end the job's statements there, on the job's own rows (the move to completed, the
     * metrics collected with it), which in a group go as postludes (`groupPostlude`), so that
     * they do not make the job interleaved.
     */
    readonly postludes?: ReadonlySet<string>,
  ) {}

  /**
   * Runs `text` with `parameters` in `tx`. Throws a {@link ConfigError} when the transaction's
   * database has no BullMQ queue in that schema (the queue lives in another database: enqueue
   * through the outbox then).
   */
  async query(tx: Kysely<any>, text: string, parameters: readonly unknown[] = []): Promise<ForeignStatementResult> {
    try {
      return (await runQualifiedCall(tx, this.queueSchema, text, parameters, this.postludes)) ?? (await runInSearchPath(tx, this.queueSchema, text, parameters));
    } catch (error) {
      // undefined_function, undefined_table, invalid_schema_name: BullMQ's objects are not there.
      if (['42883', '42P01', '3F000'].includes(sqlStateOf(error) ?? '')) {
        throw new ConfigError(
          `The transaction's database has no BullMQ queue schema "${this.queueSchema}" (${(error as Error).message}). ` +
            "Enqueueing in the caller's transaction needs the queue in the same database as the transaction; " +
            "for a queue elsewhere, use the outbox (enqueueInTransaction: 'outbox').",
          { cause: error },
        );
      }
      throw error;
    }
  }
}
