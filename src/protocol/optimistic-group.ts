import type { Kysely, Transaction } from 'kysely';
import { MergingConnection } from '../store/merging-connection.js';
import { BEGIN_READ_COMMITTED, onOneConnection } from '../store/one-trip-commit.js';
import { sqlStateOf } from '../store/pg-errors.js';
import type { CompletedKeyRow } from '../store/sql/insert-completed-keys.js';
import { rollbackTransaction } from '../store/sql/transaction-control.js';

/**
 * A job's optimistic variant: its work on a group's transaction with no savepoint and no claim
 * statement of its own; what it writes for its key goes out at the group's end, with the COMMIT.
 */
export interface OptimisticJob<T> {
  /** The key it writes: two jobs of one key never share an optimistic group. */
  readonly identity: string;
  readonly run: (tx: Transaction<any>) => Promise<OptimisticJobEnd<T>>;
}

/** What an optimistic job leaves for the group's end. */
export interface OptimisticJobEnd<T> {
  readonly value: T;
  /**
   * Literal SQL run at the group's end, before the COMMIT (a fenced completion). It must fail,
   * not quietly do nothing, when it cannot do its part: its failure sends the group the careful way.
   */
  readonly closing?: string;
  /** A key the group inserts at its end, as `completed` with its result (the fast path's). */
  readonly newKey?: CompletedKeyRow;
}

/** How an optimistic group ended. */
export type OptimisticVerdict =
  /** Committed: each job's value, by position. */
  | { readonly kind: 'committed'; readonly values: readonly unknown[] }
  /** Rolled back for sure (a job threw, or Postgres refused a statement): run every job again, the careful way. */
  | { readonly kind: 'run-again'; readonly cause: unknown }
  /** The connection failed at the end: the COMMIT may or may not have been applied. */
  | { readonly kind: 'unknown'; readonly error: unknown };

/** How the group's end writes its new keys (the store's statements; see `insert-completed-keys.ts`). */
export type InsertCompletedKeys = (rows: readonly CompletedKeyRow[]) => string[];

/**
 * Runs one optimistic group: BEGIN (riding with the first job's first statement), the jobs one
 * after another on one connection, each taken from `take` while it offers more, then one string
 * of every job's closing statement, one insert of every new key, and the COMMIT: one round trip.
 * No savepoints, so no subtransaction ids and no SAVEPOINT/RELEASE statements per job.
 *
 * The price of a failure is the whole group: anything thrown by a job, or any statement
 * Postgres refuses at the end (a lost lease, a key that has a row, a result jsonb refuses, a
 * deferred constraint at COMMIT), rolls everything back, and the verdict says so; the caller
 * runs the jobs again the careful way, where each fails or commits alone. Group commit only
 * runs effects on this database's transaction, so a rolled-back run is invisible outside the
 * job's own code (which may run more than once; one run commits).
 *
 * `take` is asked for more jobs until it has none. Nothing is taken when no connection could be
 * had: that error is thrown.
 */
export async function runOptimisticGroup(
  db: Kysely<any>,
  take: () => ReadonlyArray<OptimisticJob<unknown>>,
  insertCompletedKeys: InsertCompletedKeys,
  mergeStatements: boolean,
): Promise<OptimisticVerdict> {
  const ends: Array<OptimisticJobEnd<unknown>> = [];
  let connection!: MergingConnection;
  let failure: OptimisticVerdict | undefined;
  await onOneConnection(
    db,
    async (tx) => {
      connection.defer(BEGIN_READ_COMMITTED);
      try {
        for (let batch = take(); batch.length > 0; batch = take()) {
          for (const job of batch) ends.push(await job.run(tx));
        }
      } catch (cause) {
        failure = { kind: 'run-again', cause };
        await abandon(connection, tx);
        return;
      }
      if (ends.length === 0) {
        connection.discard(); // another group took the jobs first: BEGIN never went out
        return;
      }
      const closings = ends.flatMap((end) => (end.closing ? [end.closing] : []));
      const newKeys = ends.flatMap((end) => (end.newKey ? [end.newKey] : []));
      try {
        await connection.flush([...closings, ...insertCompletedKeys(newKeys), 'commit']);
      } catch (error) {
        // A refused statement skipped the rest of the string, COMMIT included: nothing committed.
        // No SQLSTATE: the connection failed, and the COMMIT may have been applied.
        failure = sqlStateOf(error) === undefined ? { kind: 'unknown', error } : { kind: 'run-again', cause: error };
        await abandon(connection, tx);
      }
    },
    (inner) => (connection = new MergingConnection(inner, { mergeStatements })),
  );
  return failure ?? { kind: 'committed', values: ends.map((end) => end.value) };
}

/** Ends a failed group's transaction: nothing to send if not even BEGIN went out, else ROLLBACK. */
async function abandon(connection: MergingConnection, tx: Transaction<any>): Promise<void> {
  if (connection.deferred.length > 0) connection.discard(); // BEGIN never went out
  else await rollbackTransaction(tx).catch(() => {});
}
