import { DummyDriver, SingleConnectionProvider, Transaction, sql, type ConnectionProvider, type DatabaseConnection, type Dialect, type Kysely } from 'kysely';
import { returnsLastResult } from './last-result-pool.js';
import { MergingConnection } from './merging-connection.js';
import { transientStoreFault } from './pg-errors.js';
import { isLeaseLost } from './sql/complete-and-commit.js';
import { commitTransaction, rollbackTransaction } from './sql/transaction-control.js';

/**
 * What became of {@link LeadingStatements}: `pending` (not sent, free to ride with any round
 * trip), `queued` (handed to a round trip that has not ended), `committed`, `refused` (they
 * raised the lease-lost SQLSTATE: the claim lost the key, nothing committed) or `unknown` (a
 * transient fault cut the round trip off: they may or may not have committed).
 */
export type LeadState = 'pending' | 'queued' | 'committed' | 'refused' | 'unknown';

/**
 * Literal SQL that commits on its own just ahead of another round trip's work, in the same
 * string: an external step's record held back until the run's next call (see
 * `protocol/job-steps.ts`). It must be safe to run alone, and fail only by raising the
 * lease-lost SQLSTATE (or by a transient fault), so that a failed string can be attributed.
 * The round trip that carries it moves {@link LeadingStatements.state} on from `queued`.
 */
export class LeadingStatements {
  /** Where the statements are: see {@link LeadState}. Moved on by the round trip that carries them. */
  state: LeadState = 'pending';
  constructor(
    /** The literal SQL (a step's record), self-contained, that may ride ahead of a round trip's own statements. */
    readonly text: string,
  ) {}

  /** Takes the statements for a round trip; false when they are not `pending` (sent already, or on their way). */
  take(): boolean {
    if (this.state !== 'pending') return false;
    this.state = 'queued';
    return true;
  }

  /** What a failed round trip that carried the statements means for them. */
  failedWith(error: unknown): void {
    this.state = isLeaseLost(error) ? 'refused' : transientStoreFault(error) === undefined ? 'committed' : 'unknown';
  }
}

/**
 * Sends `lead` alone, as one statement in autocommit: no round trip came by to carry it. Its
 * state says how it went; a transient fault is thrown as well.
 */
export async function sendLeadingStatements(db: Kysely<any>, lead: LeadingStatements): Promise<void> {
  if (!lead.take()) return;
  try {
    await sql.raw(lead.text).execute(db);
    lead.state = 'committed';
  } catch (error) {
    lead.state = isLeaseLost(error) ? 'refused' : 'unknown';
    if (lead.state === 'unknown') throw error;
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
 * with a statement: BEGIN with the body's first statement (on a connection that can answer a
 * string of statements, see `returnsLastResult`), and the last write with the COMMIT (Kysely's
 * `db.transaction()` sends both on their own). The body runs on one pooled connection, then
 * `end`; on any error a ROLLBACK (safe even when `end` already ended the transaction: Postgres
 * only warns; skipped when not even BEGIN went out) and the error is rethrown. The body
 * receives a real Kysely `Transaction` over that connection, with the instance's plugins.
 *
 * `lead`, when given and still pending, rides in front of the BEGIN as `begin; …; commit` (a
 * held step record): committed before this transaction starts, in the same round trip as its
 * first statement. Its state tells afterwards whether it went (it did whenever this resolves).
 */
export function runTransaction<T>(
  db: Kysely<any>,
  body: (tx: Transaction<any>) => Promise<TransactionEnd<T>>,
  lead?: LeadingStatements,
): Promise<T> {
  const mergeStatements = returnsLastResult(db);
  let connection!: MergingConnection;
  const carried = lead?.take() ? lead : undefined;
  return onOneConnection(
    db,
    async (tx) => {
      // `lead` goes first, as a transaction of its own (committed before this one begins, so
      // nothing here runs before it is durable). Refused, it leaves the connection in an
      // aborted block: what follows in the string is skipped, and every later statement fails
      // until the ROLLBACK below, so none can run outside a transaction.
      if (carried) connection.defer('begin', carried.text, 'commit');
      // BEGIN rides with the transaction's first statement (see MergingConnection). Read
      // committed, whatever the server's default: the claim protocol relies on it (a duplicate
      // waits on the key's index entry, then sees the committed row), where serializable would
      // fail that duplicate with a serialization error.
      connection.defer(BEGIN_READ_COMMITTED);
      try {
        const { value, end } = await body(tx);
        await end(tx);
        if (carried?.state === 'queued') carried.state = 'committed';
        return value;
      } catch (error) {
        const unsent = connection.deferred.length > 0;
        // Still queued: its string went through (committed), or never went out (still pending).
        if (carried?.state === 'queued') carried.state = unsent && connection.deferred.includes(carried.text) ? 'pending' : 'committed';
        if (unsent) connection.discard(); // never sent: nothing to roll back
        else await rollbackTransaction(tx).catch(() => {});
        throw error;
      }
    },
    (inner) =>
      (connection = new MergingConnection(inner, {
        mergeStatements,
        recover: async (error, sent) => {
          if (carried && sent.includes(carried.text)) carried.failedWith(error);
          return undefined;
        },
      })),
  ).catch((error: unknown) => {
    // The pool could not lend a connection: nothing went out.
    if (carried?.state === 'queued') carried.state = 'pending';
    throw error;
  });
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
 * connection, and that sends no BEGIN, COMMIT or ROLLBACK of its own. A
 * `SingleConnectionProvider` lets one statement run at a time; a provider that hands out its
 * connection at once lets several callers send at once (a gathered group's jobs).
 */
export function transactionOn(db: Kysely<any>, provider: ConnectionProvider): Transaction<any> {
  return new Transaction<any>({
    config: { dialect: NO_DIALECT },
    dialect: NO_DIALECT,
    driver: new DummyDriver(),
    executor: db.getExecutor().withConnectionProvider(provider),
  });
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
