import type pg from 'pg';
import type { DataLayer, RunStatement } from '../store/data-layer.js';
import { AbortedTransactionError } from '../store/transaction-control.js';
import { unwrapDriverError } from './driver-error.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** Options of {@link pgDataLayer}. */
export interface PgDataLayerOptions {
  /** How errors name the data layer. @defaultValue `'node-postgres'` */
  readonly name?: string;
}

/**
 * Your node-postgres pool as a data layer: `ctx.transaction(layer, async (client) => …)` (or
 * `databaseOnly(layer, async (client, ctx) => …)`) runs the effect on a `PoolClient` of `pool`
 * inside `begin isolation level read committed` … `commit`, and the key's fenced completion runs
 * last on the same client. The pool may be another than the keys' (PgBouncer in transaction
 * mode too), on the keys' database.
 *
 * A client whose connection broke during the transaction is destroyed, not returned to the pool.
 * Listen for the pool's `'error'` event as node-postgres asks: an idle client whose backend was
 * terminated emits it.
 *
 * @example
 * ```ts
 * import pg from 'pg';
 * import { createIdempotentWorker, IdempotencyKeys, createPostgresDb } from 'idempotent-jobs';
 * import { pgDataLayer } from 'idempotent-jobs/pg';
 *
 * const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres' });
 * pool.on('error', () => {}); // an idle client's backend went away: the pool replaces it
 * const ledger = pgDataLayer(pool);
 * const keys = new IdempotencyKeys({ db: createPostgresDb({ connectionString: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres' }) });
 *
 * createIdempotentWorker<{ orderId: number; cents: number }, { booked: boolean }>({
 *   queue: 'payments',
 *   connection: { url: process.env.REDIS_URL },
 *   keys,
 *   handler: (ctx) =>
 *     ctx.transaction(ledger, async (client) => {
 *       await client.query('insert into ledger (order_id, cents) values ($1, $2)', [ctx.data.orderId, ctx.data.cents]);
 *       return { booked: true };
 *     }),
 * });
 * ```
 */
export function pgDataLayer(pool: pg.Pool, options: PgDataLayerOptions = {}): DataLayer<pg.PoolClient> {
  refuseUnknownOptions(options, optionNames<PgDataLayerOptions>()(['name']), 'pgDataLayer(pool, options)');
  return {
    name: options.name ?? 'node-postgres',
    async transaction(body) {
      const client = await pool.connect();
      // A backend terminated between two statements makes the client emit 'error'; without a
      // listener that would end the process. The statement that follows fails, and says so.
      const ignore = () => {};
      client.on('error', ignore);
      let broken: Error | undefined;
      try {
        await client.query('begin isolation level read committed');
        const value = await body(client, statementsOn(client));
        const reply = await client.query('commit');
        // Postgres answers COMMIT in an aborted transaction with ROLLBACK, and no error.
        if (reply.command === 'ROLLBACK') throw new AbortedTransactionError();
        return value;
      } catch (error) {
        await client.query('rollback').catch((rollbackError: unknown) => {
          broken = rollbackError instanceof Error ? rollbackError : new Error(String(rollbackError));
        });
        throw error;
      } finally {
        client.off('error', ignore);
        client.release(broken);
      }
    },
    driverError: unwrapDriverError,
    statementsOn,
  };
}

/** The raw-SQL call on a client. */
function statementsOn(client: pg.PoolClient): RunStatement {
  return (sql, parameters) => client.query(sql, parameters as unknown[]);
}
