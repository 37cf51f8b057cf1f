/**
 * The seam between the claim protocol and a data layer of the user's own (Prisma, Drizzle,
 * TypeORM, Knex, MikroORM, node-postgres, postgres.js): a transaction the data layer opens and commits, and one
 * call that runs a statement of the store's inside it. The library writes the key's fenced
 * completion (and on the fast path the key itself) through that call, so the user's effect and
 * the completion commit together, in the data layer's own transaction.
 */

/** The rows a statement returned, as the data layer's raw-SQL call gives them. */
export interface RawRows {
  /** The rows, each by column name (an empty list for a statement that returns none). */
  readonly rows: ReadonlyArray<Record<string, unknown>>;
}

/**
 * Runs one statement inside the data layer's open transaction: `sql` with `$1`, `$2`, …
 * placeholders and their `parameters` (strings, numbers, null).
 */
export type RunStatement = (sql: string, parameters: readonly unknown[]) => Promise<RawRows>;

/**
 * A data layer the claim protocol can complete keys in: what an adapter (`idempotent-jobs/pg`,
 * `/postgres-js`, `/drizzle`, `/prisma`, `/typeorm`, `/knex`, `/mikro-orm`) builds around the user's pool or client.
 * Write one for another data layer by implementing these two members.
 *
 * `Tx` is what the effect receives: the data layer's own transaction object (a `PoolClient`, a
 * postgres.js `TransactionSql`, a Drizzle or Prisma transaction, a TypeORM `EntityManager`, a Knex
 * transaction, a MikroORM entity manager).
 */
export interface DataLayer<Tx> {
  /** How errors name the data layer: `'Prisma'`, `'node-postgres'`, … */
  readonly name: string;
  /**
   * Opens a transaction on the user's pool or client, isolation pinned to `read committed`
   * (the claim protocol relies on it: a duplicate waits on the key's row, then sees it
   * committed), runs `body` with the data layer's transaction object and a {@link RunStatement}
   * into the same transaction, commits when `body` resolves, rolls back when it rejects and
   * rejects with its error. A COMMIT that Postgres answered with ROLLBACK must reject.
   */
  transaction<T>(body: (tx: Tx, run: RunStatement) => Promise<T>): Promise<T>;
  /**
   * The driver's error inside an error of the data layer (the one carrying Postgres's SQLSTATE
   * in `code`, or node's socket error), or `error` itself. The library classifies it: a
   * terminated backend or a dropped connection is a transient fault (the job is deferred without
   * using an attempt), the completion refused by the fence is a lost lease.
   */
  driverError(error: unknown): unknown;
  /**
   * Optional: the raw-SQL call into a transaction of this data layer that the user opened
   * themselves, for the outbox (`producer.enqueue(job, { tx: kyselyIn(dataLayer, tx) })`).
   */
  statementsOn?(tx: Tx): RunStatement;
}
