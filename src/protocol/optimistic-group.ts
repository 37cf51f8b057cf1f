import type { ConnectionProvider, DatabaseConnection, Kysely, Transaction } from 'kysely';
import { GatheringConnection, InterleavedStatements } from '../store/gathering-connection.js';
import { BEGIN_READ_COMMITTED, transactionOn } from '../store/one-trip-commit.js';
import { sqlStateOf } from '../store/pg-errors.js';
import type { CompletedKeyRow } from '../store/sql/insert-completed-keys.js';

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
  /**
   * Rolled back for sure: run every job again. The careful way (a job threw, or Postgres
   * refused a statement), or, when `interleaved`, optimistically with the jobs one after
   * another (a gathered job sent a statement after a group-mate's; see `InterleavedStatements`).
   */
  | { readonly kind: 'run-again'; readonly cause: unknown; readonly interleaved: boolean }
  /** The connection failed at the end: the COMMIT may or may not have been applied. */
  | { readonly kind: 'unknown'; readonly error: unknown };

/** How the group's end writes its new keys (the store's statements; see `insert-completed-keys.ts`). */
export type InsertCompletedKeys = (rows: readonly CompletedKeyRow[]) => string[];

/** How an optimistic group runs its jobs. */
export interface OptimisticGroupOptions {
  /** How the group's end writes its new keys. */
  readonly insertCompletedKeys: InsertCompletedKeys;
  /**
   * Run the jobs of each batch at once, their statements gathered into one string per turn
   * (see {@link GatheringConnection}); false: one after another, each statement on its own.
   */
  readonly gather: boolean;
  /** The connection answers a string of statements with every result (`returnsLastResult`). */
  readonly everyResult: boolean;
}

/**
 * Runs one optimistic group: BEGIN, riding with the first statements; the jobs, in batches
 * taken from `take` while it offers more; then one string of every job's closing statement,
 * one insert of every new key, and the COMMIT: one round trip. No savepoints, so no
 * subtransaction ids and no SAVEPOINT/RELEASE statements per job.
 *
 * Gathered (`gather`), the jobs of a batch run at once, and the statements they send in one
 * turn go out as one string: a batch of jobs of one statement each costs one round trip, not one
 * per job. A job that sends a statement after a group-mate's has run since its own previous one
 * fails the group (`interleaved`): its jobs then run again one after another.
 *
 * The price of a failure is the whole group: anything thrown by a job, or any statement
 * Postgres refuses (a lost lease, a key that has a row, a result jsonb refuses, a deferred
 * constraint at COMMIT), rolls everything back, and the verdict says so; the caller runs the
 * jobs again, the careful way, where each fails or commits alone. Group commit only runs
 * effects on this database's transaction, so a rolled-back run is invisible outside the job's
 * own code (which may run more than once; one run commits).
 *
 * Nothing is taken when no connection could be had: that error is thrown.
 */
export async function runOptimisticGroup(
  db: Kysely<any>,
  take: () => ReadonlyArray<OptimisticJob<unknown>>,
  options: OptimisticGroupOptions,
): Promise<OptimisticVerdict> {
  const ends: Array<OptimisticJobEnd<unknown>> = [];
  return db.getExecutor().provideConnection(async (inner): Promise<OptimisticVerdict> => {
    const connection = new GatheringConnection(inner, { gather: options.gather, everyResult: options.everyResult });
    const runAgain = async (cause: unknown): Promise<OptimisticVerdict> => {
      connection.fail(cause);
      await connection.rollback();
      const failure = connection.failure!.error;
      return { kind: 'run-again', cause: failure, interleaved: failure instanceof InterleavedStatements };
    };
    connection.defer(BEGIN_READ_COMMITTED);
    for (let batch = take(); batch.length > 0; batch = take()) {
      const run = (job: OptimisticJob<unknown>) =>
        job.run(transactionOn(db, sharedProvider(connection.forJob()))).catch((error: unknown) => {
          connection.fail(error); // the group is lost: its other jobs' statements go no further
          throw error;
        });
      const settled = options.gather ? await Promise.allSettled(batch.map(run)) : await oneAfterAnother(batch, run);
      if (connection.failure) return runAgain(connection.failure.error);
      for (const outcome of settled) ends.push((outcome as PromiseFulfilledResult<OptimisticJobEnd<unknown>>).value);
    }
    if (ends.length === 0) {
      connection.discard(); // another group took the jobs first: BEGIN never went out
      return { kind: 'committed', values: [] };
    }
    const closings = ends.flatMap((end) => (end.closing ? [end.closing] : []));
    const newKeys = ends.flatMap((end) => (end.newKey ? [end.newKey] : []));
    try {
      await connection.flush([...closings, ...options.insertCompletedKeys(newKeys), 'commit']);
    } catch (error) {
      // A refused statement skipped the rest of the string, COMMIT included: nothing committed.
      // No SQLSTATE: the connection failed, and the COMMIT may have been applied.
      if (connection.failure || sqlStateOf(error) !== undefined) return runAgain(error);
      await connection.rollback();
      return { kind: 'unknown', error };
    }
    return { kind: 'committed', values: ends.map((end) => end.value) };
  });
}

/** Runs each job once the one before has ended, up to the first that fails. */
async function oneAfterAnother<J, T>(jobs: readonly J[], run: (job: J) => Promise<T>): Promise<Array<PromiseSettledResult<T>>> {
  const settled: Array<PromiseSettledResult<T>> = [];
  for (const job of jobs) {
    const [outcome] = await Promise.allSettled([run(job)]);
    settled.push(outcome!);
    if (outcome!.status === 'rejected') break;
  }
  return settled;
}

/** Hands its connection to every caller at once (the gathering connection keeps them in order). */
function sharedProvider(connection: DatabaseConnection): ConnectionProvider {
  return { provideConnection: (consume) => consume(connection) };
}
