import { DummyDriver, SingleConnectionProvider, Transaction, type DatabaseConnection, type Dialect, type Kysely } from 'kysely';
import { returnsLastResult } from './last-result-pool.js';
import { MergingConnection } from './merging-connection.js';
import { commitTransaction, rollbackTransaction } from './sql/transaction-control.js';

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
 * with a statement: BEGIN with the body's first statement (on a connection that can answer a
 * string of statements, see `returnsLastResult`), and the last write with the COMMIT (Kysely's
 * `db.transaction()` sends both on their own). The body runs on one pooled connection, then
 * `end`; on any error a ROLLBACK (safe even when `end` already ended the transaction: Postgres
 * only warns; skipped when not even BEGIN went out) and the error is rethrown. The body
 * receives a real Kysely `Transaction` over that connection, with the instance's plugins.
 */
export function runTransaction<T>(db: Kysely<any>, body: (tx: Transaction<any>) => Promise<TransactionEnd<T>>): Promise<T> {
  const mergeStatements = returnsLastResult(db);
  let connection!: MergingConnection;
  return onOneConnection(
    db,
    async (tx) => {
      // BEGIN rides with the transaction's first statement (see MergingConnection). Read
      // committed, whatever the server's default: the claim protocol relies on it (a duplicate
      // waits on the key's index entry, then sees the committed row), where serializable would
      // fail that duplicate with a serialization error.
      connection.defer(BEGIN_READ_COMMITTED);
      try {
        const { value, end } = await body(tx);
        await end(tx);
        return value;
      } catch (error) {
        if (connection.deferred.length > 0) connection.discard(); // never sent: nothing to roll back
        else await rollbackTransaction(tx).catch(() => {});
        throw error;
      }
    },
    (inner) => (connection = new MergingConnection(inner, { mergeStatements })),
  );
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
  const executor = db.getExecutor();
  return executor.provideConnection((connection) =>
    body(
      new Transaction<any>({
        config: { dialect: NO_DIALECT },
        dialect: NO_DIALECT,
        driver: new DummyDriver(),
        executor: executor.withConnectionProvider(new SingleConnectionProvider(wrap(connection))),
      }),
    ),
  );
}

/**
 * The BEGIN of every transaction the store drives by hand: isolation pinned to read committed,
 * so a server or role whose `default_transaction_isolation` is stricter does not turn concurrent
 * duplicates into serialization failures.
 */
export const BEGIN_READ_COMMITTED = 'begin isolation level read committed';

/** Ends a transaction with a plain COMMIT (nothing left to write). */
export const endWithCommit = (tx: Transaction<any>): Promise<void> => commitTransaction(tx);

/** Ends a transaction with ROLLBACK (nothing worth keeping). */
export const endWithRollback = (tx: Transaction<any>): Promise<void> => rollbackTransaction(tx);
