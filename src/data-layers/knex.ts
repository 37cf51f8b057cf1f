import type { Knex } from 'knex';
import type { DataLayer, RunStatement } from '../store/data-layer.js';
import { AbortedTransactionError } from '../store/transaction-control.js';
import { unwrapDriverError } from './driver-error.js';
import { questionMarkPlaceholders } from './statement-text.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** Options of {@link knexDataLayer}. */
export interface KnexDataLayerOptions {
  /** How errors name the data layer. @defaultValue `'Knex'` */
  readonly name?: string;
}

/** The query context of the adapter's statements: see {@link KNEX_QUERY_CONTEXT}. */
export interface KnexQueryContext {
  /** Always `true`: the statement is the library's. */
  readonly idempotentJobs: true;
}

/**
 * The query context the adapter's statements carry (`.queryContext(...)`), so that a
 * `postProcessResponse` or `wrapIdentifier` of your Knex configuration can leave them alone.
 */
export const KNEX_QUERY_CONTEXT: KnexQueryContext = Object.freeze({ idempotentJobs: true });

/**
 * Your Knex instance (client `pg`) as a data layer: the effect runs on a Knex transaction opened
 * with `knex.transaction({ isolationLevel: 'read committed' })`, and the key's fenced completion
 * runs last in it through `trx.raw(statement, values)`. Write the effect with `trx` as you would
 * with `knex` (query builder, `trx.raw`).
 *
 * The adapter commits with `trx.commit()` itself, rather than handing Knex a callback, to read
 * Postgres's answer: Knex takes a COMMIT that Postgres answered with ROLLBACK (a statement of
 * the transaction failed earlier and its error was caught) as committed; here it rejects.
 *
 * The store reads its statements' rows by column name (`fence`, `locked_until`, …): a
 * `postProcessResponse` that renames columns (to camelCase, say) must return the results of
 * statements whose query context is {@link KNEX_QUERY_CONTEXT} unchanged.
 *
 * @example
 * ```ts
 * import knex from 'knex';
 * import { databaseOnly, type DatabaseOnlyContext } from 'idempotent-jobs';
 * import { knexDataLayer } from 'idempotent-jobs/knex';
 *
 * const db = knex({ client: 'pg', connection: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres' });
 *
 * // A database-only handler: claim, effect and completion in one Knex transaction.
 * export default databaseOnly(knexDataLayer(db), async (trx, ctx: DatabaseOnlyContext<{ orderId: number; cents: number }>) => {
 *   await trx('ledger').insert({ order_id: ctx.data.orderId, cents: ctx.data.cents });
 *   return { booked: true };
 * });
 * ```
 */
export function knexDataLayer(db: Knex, options: KnexDataLayerOptions = {}): DataLayer<Knex.Transaction> {
  refuseUnknownOptions(options, optionNames<KnexDataLayerOptions>()(['name']), 'knexDataLayer(db, options)');
  return {
    name: options.name ?? 'Knex',
    async transaction(body) {
      const trx = await db.transaction({ isolationLevel: 'read committed' });
      try {
        const value = await body(trx, knexStatementsOn(trx));
        const reply: unknown = await trx.commit();
        // A COMMIT that failed (its connection lost) resolves `commit()` and rejects this.
        await trx.executionPromise;
        // Postgres answers COMMIT in an aborted transaction with ROLLBACK, and no error.
        if (commitCommandOf(reply) === 'ROLLBACK') throw new AbortedTransactionError();
        return value;
      } catch (error) {
        // `rollback()` resolves even when its ROLLBACK fails (the connection is gone: Knex's
        // pool then discards the connection); the effect's error is the one to report.
        if (!trx.isCompleted()) await trx.rollback();
        throw error;
      }
    },
    driverError: unwrapDriverError,
    statementsOn: knexStatementsOn,
  };
}

/** The raw-SQL call on a Knex transaction (also MikroORM's, which runs on Knex). */
export function knexStatementsOn(trx: Knex.Transaction): RunStatement {
  return async (text, parameters) => {
    const statement = questionMarkPlaceholders(text, parameters);
    // On client pg, `raw` answers node-postgres's result, rows in `rows`.
    const result: unknown = await trx.raw(statement.text, statement.values as Knex.RawBinding[]).queryContext(KNEX_QUERY_CONTEXT);
    const rows = (result as { rows?: unknown } | null)?.rows;
    return { rows: Array.isArray(rows) ? (rows as Array<Record<string, unknown>>) : [] };
  };
}

/**
 * The command tag of the reply to Knex's COMMIT: `trx.commit()` resolves with Knex's query
 * object, node-postgres's result in `response`.
 */
export function commitCommandOf(reply: unknown): unknown {
  return (reply as { response?: { command?: unknown } } | null | undefined)?.response?.command;
}
