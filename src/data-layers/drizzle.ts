import { Param, sql, type SQL } from 'drizzle-orm';
import type { DataLayer, RunStatement } from '../store/data-layer.js';
import { unwrapDriverError } from './driver-error.js';
import { jsonAsText } from './statement-text.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** What the adapter needs of a Drizzle Postgres database (node-postgres or postgres.js driver). */
export interface DrizzlePgDatabase<Tx> {
  /** Drizzle's `db.transaction(fn, config)`. */
  transaction<T>(transaction: (tx: Tx) => Promise<T>, config?: { isolationLevel?: 'read committed' }): Promise<T>;
}

/** What the adapter needs of a Drizzle transaction: `execute` of a raw `sql`. */
export interface DrizzlePgTransaction {
  /** Drizzle's `tx.execute(sql)`. */
  execute(query: SQL): PromiseLike<unknown>;
}

/** The transaction type of a Drizzle database. */
export type DrizzleTransactionOf<D> = D extends DrizzlePgDatabase<infer Tx> ? Tx : never;

/** Options of {@link drizzleDataLayer}. */
export interface DrizzleDataLayerOptions {
  /** How errors name the data layer. @defaultValue `'Drizzle'` */
  readonly name?: string;
}

/**
 * Your Drizzle database (`drizzle-orm/node-postgres` or `drizzle-orm/postgres-js`) as a data
 * layer: the effect runs in `db.transaction(fn, { isolationLevel: 'read committed' })` on
 * Drizzle's transaction, and the key's fenced completion runs last in it through `tx.execute`.
 * Give Drizzle's node-postgres pool an `'error'` listener, as node-postgres asks; the adapter
 * gives each client the pool connects from then on one of its own (see `listenOnCheckedOutClients`).
 *
 * @example
 * ```ts
 * import { drizzle } from 'drizzle-orm/node-postgres';
 * import { integer, pgTable } from 'drizzle-orm/pg-core';
 * import { databaseOnly, type DatabaseOnlyContext } from 'idempotent-jobs';
 * import { drizzleDataLayer } from 'idempotent-jobs/drizzle';
 *
 * const ledgerTable = pgTable('ledger', { orderId: integer('order_id').primaryKey(), cents: integer('cents').notNull() });
 * const db = drizzle(process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres');
 * db.$client.on('error', () => {});
 *
 * // ctx typed where it is written: the transaction's type comes from the data layer.
 * export default databaseOnly(drizzleDataLayer(db), async (tx, ctx: DatabaseOnlyContext<{ orderId: number; cents: number }>) => {
 *   await tx.insert(ledgerTable).values({ orderId: ctx.data.orderId, cents: ctx.data.cents });
 *   return { booked: true };
 * });
 * ```
 */
export function drizzleDataLayer<D extends DrizzlePgDatabase<any>>(db: D, options: DrizzleDataLayerOptions = {}): DataLayer<DrizzleTransactionOf<D>> {
  refuseUnknownOptions(options, optionNames<DrizzleDataLayerOptions>()(['name']), 'drizzleDataLayer(db, options)');
  listenOnCheckedOutClients((db as { $client?: unknown }).$client);
  return {
    name: options.name ?? 'Drizzle',
    transaction(body) {
      return db.transaction(
        (tx: DrizzleTransactionOf<D>) => body(tx, statementsOn(tx as DrizzlePgTransaction)),
        { isolationLevel: 'read committed' },
      );
    },
    driverError: unwrapDriverError,
    statementsOn: (tx) => statementsOn(tx as DrizzlePgTransaction),
  };
}

/** The raw-SQL call on a Drizzle transaction (either driver). */
function statementsOn(tx: DrizzlePgTransaction): RunStatement {
  return async (text, parameters) => {
    // Over postgres.js, JSON parameters must be typed text (see `jsonAsText`); harmless over node-postgres.
    const result = await tx.execute(withParameters(jsonAsText(text), parameters));
    // node-postgres's driver answers a QueryResult, postgres.js's the rows themselves.
    const rows = Array.isArray(result) ? result : (result as { rows: Array<Record<string, unknown>> }).rows;
    return { rows: rows as Array<Record<string, unknown>> };
  };
}

/**
 * A statement with `$1`, `$2`, … placeholders as Drizzle's `sql`: its text around each
 * placeholder raw, each value a parameter, so Drizzle numbers them again in the same order.
 */
function withParameters(text: string, parameters: readonly unknown[]): SQL {
  const chunks: SQL[] = [];
  let last = 0;
  for (const match of text.matchAll(/\$(\d+)/g)) {
    chunks.push(sql.raw(text.slice(last, match.index)), sql`${new Param(parameters[Number(match[1]) - 1])}`);
    last = match.index + match[0].length;
  }
  chunks.push(sql.raw(text.slice(last)));
  return sql.join(chunks);
}

/**
 * A node-postgres client whose backend is terminated while Drizzle holds it emits `'error'`
 * after the failed statement (the socket's end, with no statement left to fail), and a pool
 * takes its own listener off the clients it lends: without one that error would end the
 * process. Each client the pool connects gets a listener that drops it; the client is then not
 * queryable, so Drizzle's next statement on it fails (a transient fault) and the pool discards it.
 */
function listenOnCheckedOutClients(client: unknown): void {
  const pool = client as { on?: unknown; totalCount?: unknown } | null;
  if (pool === null || typeof pool !== 'object' || typeof pool.on !== 'function' || typeof pool.totalCount !== 'number') return;
  (pool as { on(event: 'connect', listener: (client: { on(event: 'error', listener: () => void): void }) => void): void }).on('connect', (connected) =>
    connected.on('error', () => {}),
  );
}
