import type { Kysely } from 'kysely';
import { ValidationError } from '../errors.js';
import type { DataLayer } from '../store/data-layer.js';
import { kyselyOn } from '../store/foreign-transaction.js';

/**
 * A Kysely transaction over a transaction you opened in your data layer, for the library's calls
 * that take one: the outbox, `producer.enqueue(job, { tx: kyselyIn(dataLayer, tx) })`, whose row
 * then commits or rolls back with your own writes. It sends no BEGIN, COMMIT or ROLLBACK; call
 * it inside your transaction and use it there only.
 *
 * @example
 * ```ts
 * import pg from 'pg';
 * import { kyselyIn } from 'idempotent-jobs';
 * import { pgDataLayer } from 'idempotent-jobs/pg';
 *
 * const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres' });
 * const orders = pgDataLayer(pool);
 * await orders.transaction(async (client) => {
 *   await client.query('insert into orders (id, cents) values ($1, $2)', [43, 500]);
 *   await producer.enqueue({ name: 'charge', key: 'order-43', data: { cents: 500 } }, { tx: kyselyIn(orders, client) });
 * });
 * ```
 */
export function kyselyIn<Tx>(dataLayer: DataLayer<Tx>, tx: Tx): Kysely<any> {
  if (!dataLayer.statementsOn) {
    throw new ValidationError('INVALID_OPTIONS', 'dataLayer', `The ${dataLayer.name} data layer cannot run statements in a transaction you opened (it has no statementsOn).`);
  }
  return kyselyOn(dataLayer.statementsOn(tx), (error) => dataLayer.driverError(error));
}
