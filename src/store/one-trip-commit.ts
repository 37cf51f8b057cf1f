import { DummyDriver, SingleConnectionProvider, Transaction, type CompiledQuery, type ConnectionProvider, type DatabaseConnection, type Dialect, type Kysely } from 'kysely';
import { DeferringConnection } from './deferring-connection.js';
import { markPipelining, pipelines, sendStatements, type PipelineReply } from './pipeline.js';
import { transientStoreFault } from './pg-errors.js';
import { isLeaseLost } from './sql/complete-and-commit.js';
import { BEGIN, BEGIN_READ_COMMITTED, COMMIT, commitTransaction, isStoreTransactionControl, rollbackTransaction } from './transaction-control.js';
import { screenStatement } from './statement-screen.js';
import { TransactionControlError } from '../errors.js';

/**
 * What became of a {@link HeldRecord}:
 * - `pending`: not sent, or sent and certainly not committed (its round trip failed before it,
 *   or rolled it back with what came after it): free to ride with any round trip;
 * - `queued`: handed to a round trip that has not ended;
 * - `committed`: Postgres confirmed its COMMIT;
 * - `refused`: it raised the lease-lost SQLSTATE: the claim lost the key, nothing committed;
 * - `failed`: it raised another error (kept in `error`): nothing committed;
 * - `unknown`: the connection failed before its COMMIT was confirmed: it may or may not have committed.
 *
 * Not stable: may change in a minor release.
 *
 * @experimental
 */
export type HeldRecordState = 'pending' | 'queued' | 'committed' | 'refused' | 'failed' | 'unknown';

/**
 * One statement that commits on its own just ahead of another round trip's work: an external
 * step's record, held back until the run's next call (see `protocol/job-steps.ts`). It must be
 * safe to run alone, and fail by raising the lease-lost SQLSTATE when the claim lost its key.
 * The round trip that carries it reads its fate from Postgres's answer to it (see {@link HeldRecordState}).
 *
 * Not stable: may change in a minor release.
 *
 * @experimental
 */
export class HeldRecord {
  /** Where the statement is: see {@link HeldRecordState}. Moved on by the round trip that carries it. */
  state: HeldRecordState = 'pending';
  /** What it failed with (`failed`), or what cut its round trip off (`unknown`). */
  error: unknown;

  constructor(
    /** The statement (a step's record), self-contained, that may ride ahead of a round trip's own statements. */
    readonly statement: CompiledQuery,
  ) {}

  /** Takes the statement for a round trip; false when it is not `pending` (sent already, or on its way). */
  take(): boolean {
    if (this.state !== 'pending') return false;
    this.state = 'queued';
    return true;
  }
}

/**
 * Reads the held record's fate from a pipeline that carried it at index `at`, committed by the statement
 * at `committedAt` (its own COMMIT, or the statement itself in autocommit), which is also the last
 * one of its transaction: `reply` undefined when the connection failed.
 */
export function noteHeldRecordFate(heldRecord: HeldRecord, reply: PipelineReply | undefined, at: number, committedAt: number): void {
  if (reply === undefined) {
    heldRecord.state = 'unknown';
    return;
  }
  if (reply.results.length > committedAt) {
    heldRecord.state = 'committed';
    return;
  }
  const failure = reply.failure;
  if (failure && failure.index >= at && failure.index <= committedAt) {
    heldRecord.error = failure.error;
    const fault = transientStoreFault(failure.error);
    // The server ending the session (an administrator, a shutdown) may do so after its COMMIT
    // was applied; a conflict or a timeout certainly undid it, and it may go again.
    if (fault === 'connection') heldRecord.state = 'unknown';
    else if (fault !== undefined) heldRecord.state = 'pending';
    else heldRecord.state = isLeaseLost(failure.error) ? 'refused' : 'failed';
    return;
  }
  // Failed (or never reached) before the statement, or undone with the rest of its implicit
  // transaction: not committed, and free to go again.
  heldRecord.state = 'pending';
}

/**
 * Sends `heldRecord` alone, as one statement in autocommit: no round trip came by to carry it. Its
 * state says how it went; a failed connection is thrown as well.
 */
export async function sendHeldRecord(db: Kysely<any>, heldRecord: HeldRecord): Promise<void> {
  if (!heldRecord.take()) return;
  let reply: PipelineReply | undefined;
  try {
    reply = await sendStatements(db, [heldRecord.statement]);
  } catch (error) {
    heldRecord.error = error;
    throw error;
  } finally {
    noteHeldRecordFate(heldRecord, reply, 0, 0);
  }
}

/** What the body of {@link runTransaction} hands back: its value, and the statement that ends the transaction. */
export interface TransactionEnd<T> {
  readonly value: T;
  /**
   * Commits: runs the transaction's last write and `COMMIT` together (one round trip), or a
   * plain COMMIT or ROLLBACK. It must leave no transaction open when it resolves; when it
   * throws, the transaction is rolled back.
   */
  readonly end: (tx: Transaction<any>) => Promise<void>;
}

// A Transaction object only runs queries through its executor; the driver and dialect are
// consulted for transaction control and introspection, which a Transaction refuses anyway.
const NO_DIALECT: Dialect = {
  createDriver: () => new DummyDriver(),
  createQueryCompiler: () => {
    throw new Error('not available inside an idempotent-jobs transaction');
  },
  createAdapter: () => {
    throw new Error('not available inside an idempotent-jobs transaction');
  },
  createIntrospector: () => {
    throw new Error('introspection is not available inside an idempotent-jobs transaction');
  },
};

/**
 * A transaction whose BEGIN and COMMIT the store sends itself, so that each shares a round trip
 * with a statement: BEGIN with the body's first statement, and the last write with the COMMIT
 * (Kysely's `db.transaction()` sends both on their own), in pipelines on a connection of
 * `createPostgresDb` (see `pipeline.ts`); elsewhere BEGIN goes on its own. The body runs on one
 * pooled connection, then `end`; on any error a ROLLBACK (safe even when `end` already ended the
 * transaction: Postgres only warns; skipped when not even BEGIN went out) and the error is
 * rethrown. The body receives a real Kysely `Transaction` over that connection, with the
 * instance's plugins; a statement of its own that would end the transaction is refused with a
 * {@link TransactionControlError}.
 *
 * `heldRecord`, when given and still pending, rides in front of the BEGIN as `begin; …; commit` (a
 * held step record): committed before this transaction starts, in the same round trip as its
 * first statement. Its state tells afterwards what became of it, read from Postgres's answer to
 * its own COMMIT; when it is refused, nothing after it runs.
 */
export function runTransaction<T>(
  db: Kysely<any>,
  body: (tx: Transaction<any>) => Promise<TransactionEnd<T>>,
  heldRecord?: HeldRecord,
): Promise<T> {
  const carried = heldRecord?.take() ? heldRecord : undefined;
  const carriedStatements = carried ? [BEGIN, carried.statement, COMMIT] : [];
  let connection!: DeferringConnection;
  return onOneConnection(
    db,
    async (tx) => {
      // `heldRecord` goes first, as a transaction of its own (committed before this one begins, so
      // nothing here runs before it is durable). BEGIN rides with the transaction's first
      // statement. Read committed, whatever the server's default: the claim protocol relies on
      // it (a duplicate waits on the key's index entry, then sees the committed row), where
      // serializable would fail that duplicate with a serialization error.
      connection.defer(...carriedStatements, BEGIN_READ_COMMITTED);
      try {
        const { value, end } = await body(tx);
        await end(tx);
        return value;
      } catch (error) {
        const unsent = connection.deferred.length > 0;
        if (unsent) connection.discard(); // never sent: nothing to roll back
        else await rollbackTransaction(tx).catch(() => {});
        throw error;
      } finally {
        if (carried?.state === 'queued') carried.state = 'pending'; // it never went out
      }
    },
    (inner) =>
      (connection = new DeferringConnection(inner, {
        pipelines: pipelines(db),
        screen: refuseEndingTheTransaction,
        onReply: (sent, reply) => {
          const at = carried ? sent.indexOf(carried.statement) : -1;
          if (at >= 0) noteHeldRecordFate(carried!, reply, at, at + 1);
        },
      })),
  ).catch((error: unknown) => {
    // The pool could not lend a connection: nothing went out.
    if (carried?.state === 'queued') carried.state = 'pending';
    throw error;
  });
}

/** The screen of a job's statements in a transaction of the store's: nothing may end it but the store. */
function refuseEndingTheTransaction(query: CompiledQuery): void {
  if (isStoreTransactionControl(query)) return;
  if (screenStatement(query.sql).effect === 'ends-transaction') throw new TransactionControlError(query.sql);
}

/**
 * Lends `body` one pooled connection as a Kysely `Transaction` object (with the instance's
 * plugins) that sends nothing by itself: BEGIN, COMMIT and ROLLBACK are the caller's to send.
 * `wrap` may put its own {@link DatabaseConnection} between the transaction and the connection.
 */
export function onOneConnection<T>(
  db: Kysely<any>,
  body: (tx: Transaction<any>) => Promise<T>,
  wrap: (connection: DatabaseConnection) => DatabaseConnection = (connection) => connection,
): Promise<T> {
  return db.getExecutor().provideConnection((connection) => body(transactionOn(db, new SingleConnectionProvider(wrap(connection)))));
}

/**
 * A Kysely `Transaction` object (with `db`'s plugins) whose statements go to `provider`'s
 * connection, and that sends no BEGIN, COMMIT or ROLLBACK of its own. It pipelines when `db`
 * does (the connection must then answer pipeline queries). A `SingleConnectionProvider` lets one
 * statement run at a time; a provider that hands out its connection at once lets several callers
 * send at once (a gathered group's jobs). `pipelining` false for a connection that cannot
 * answer pipeline queries (a data layer's, see `foreign-transaction.ts`).
 */
export function transactionOn(db: Kysely<any>, provider: ConnectionProvider, pipelining: boolean = pipelines(db)): Transaction<any> {
  const tx = new Transaction<any>({
    config: { dialect: NO_DIALECT },
    dialect: NO_DIALECT,
    driver: new DummyDriver(),
    executor: db.getExecutor().withConnectionProvider(provider),
  });
  return pipelining ? markPipelining(tx) : tx;
}

export { BEGIN_READ_COMMITTED };

/** Ends a transaction with a plain COMMIT (nothing left to write); throws when Postgres rolled it back instead. */
export const endWithCommit = (tx: Transaction<any>): Promise<void> => commitTransaction(tx);

/** Ends a transaction with ROLLBACK (nothing worth keeping). */
export const endWithRollback = (tx: Transaction<any>): Promise<void> => rollbackTransaction(tx);
