import type { DataSource, EntityManager } from 'typeorm';
import type { DataLayer, RunStatement } from '../store/data-layer.js';
import { unwrapDriverError } from './driver-error.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** Options of {@link typeormDataLayer}. */
export interface TypeormDataLayerOptions {
  /** How errors name the data layer. @defaultValue `'TypeORM'` */
  readonly name?: string;
}

/**
 * Your TypeORM `DataSource` (driver `postgres`) as a data layer: the effect runs in
 * `dataSource.transaction('READ COMMITTED', (manager) => …)` on its `EntityManager`, and the
 * key's fenced completion runs last in it through `manager.query`.
 *
 * @example
 * ```ts
 * import { DataSource } from 'typeorm';
 * import { databaseOnly, type DatabaseOnlyContext } from 'idempotent-jobs';
 * import { typeormDataLayer } from 'idempotent-jobs/typeorm';
 *
 * const dataSource = await new DataSource({ type: 'postgres', url: process.env.DATABASE_URL }).initialize();
 *
 * export default databaseOnly(typeormDataLayer(dataSource), async (manager, ctx: DatabaseOnlyContext<{ orderId: number; cents: number }>) => {
 *   await manager.query('insert into ledger (order_id, cents) values ($1, $2)', [ctx.data.orderId, ctx.data.cents]);
 *   return { booked: true };
 * });
 * ```
 */
export function typeormDataLayer(dataSource: DataSource, options: TypeormDataLayerOptions = {}): DataLayer<EntityManager> {
  refuseUnknownOptions(options, optionNames<TypeormDataLayerOptions>()(['name']), 'typeormDataLayer(dataSource, options)');
  return {
    name: options.name ?? 'TypeORM',
    transaction(body) {
      return dataSource.transaction('READ COMMITTED', (manager) =>
        body(manager, statementsOn(manager)),
      );
    },
    driverError: unwrapDriverError,
    statementsOn,
  };
}

/** The raw-SQL call on an `EntityManager` (inside a transaction: its query runner's). */
function statementsOn(manager: EntityManager): RunStatement {
  return async (text, parameters) => {
    const rows: unknown = await manager.query(text, [...parameters]);
    return { rows: Array.isArray(rows) ? (rows as Array<Record<string, unknown>>) : [] };
  };
}
