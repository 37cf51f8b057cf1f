import type { ReservedSql, Sql, TransactionSql } from 'postgres';
import type { DataLayer, RunStatement } from '../store/data-layer.js';
import { transientStoreFault } from '../store/pg-errors.js';
import { AbortedTransactionError } from '../store/transaction-control.js';
import { unwrapDriverError } from './driver-error.js';
import { jsonAsText } from './statement-text.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** Options of {@link postgresJsDataLayer}. */
export interface PostgresJsDataLayerOptions {
  /** How errors name the data layer. @defaultValue `'postgres.js'` */
  readonly name?: string;
}

/**
 * Your postgres.js client as a data layer: the effect runs on a connection reserved from your
 * client (`sql.reserve()`), between `begin isolation level read committed` and `commit`, and the
 * key's fenced completion runs last on it through `tx.unsafe(statement, parameters)`. Write the
 * effect with `tx` as you would with `sql` (tagged templates, `tx.unsafe`).
 *
 * Why a reserved connection and not `sql.begin`: when the backend is terminated inside
 * `sql.begin`, postgres.js 3.4 writes its ROLLBACK to the closed socket from a timer and the
 * process crashes with `TypeError: Cannot read properties of null (reading 'write')`
 * (postgres.js issues #1154, #1208). Here no ROLLBACK is sent after a connection fault: the
 * server rolled the transaction back when the connection ended, and the connection is not handed
 * back (`release()` would lend the closed connection to the next query, with the same crash):
 * postgres.js counts it among its closed connections once it has closed, and opens a new one.
 *
 * @example
 * ```ts
 * import postgres from 'postgres';
 * import { databaseOnly, type DatabaseOnlyContext } from 'idempotent-jobs';
 * import { postgresJsDataLayer } from 'idempotent-jobs/postgres-js';
 *
 * const sql = postgres(process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres');
 * const ledger = postgresJsDataLayer(sql);
 *
 * // A database-only handler: claim, effect and completion in one postgres.js transaction.
 * export default databaseOnly(ledger, async (tx, ctx: DatabaseOnlyContext<{ orderId: number; cents: number }>) => {
 *   await tx`insert into ledger (order_id, cents) values (${ctx.data.orderId}, ${ctx.data.cents})`;
 *   return { booked: true };
 * });
 * ```
 */
export function postgresJsDataLayer(sql: Sql<any>, options: PostgresJsDataLayerOptions = {}): DataLayer<ReservedSql<any>> {
  refuseUnknownOptions(options, optionNames<PostgresJsDataLayerOptions>()(['name']), 'postgresJsDataLayer(sql, options)');
  return {
    name: options.name ?? 'postgres.js',
    async transaction(body) {
      const tx = await sql.reserve();
      let connectionLost = false;
      try {
        await tx.unsafe('begin isolation level read committed');
        const value = await body(tx, statementsOn(tx));
        const reply = await tx.unsafe('commit');
        // Postgres answers COMMIT in an aborted transaction with ROLLBACK, and no error.
        if (reply.command === 'ROLLBACK') throw new AbortedTransactionError();
        return value;
      } catch (error) {
        // After a connection fault there is nothing to roll back, and writing to the closed
        // connection is what crashes postgres.js (see above).
        connectionLost = transientStoreFault(unwrapDriverError(error)) === 'connection';
        if (!connectionLost) await tx.unsafe('rollback').catch(() => undefined);
        throw error;
      } finally {
        // A connection that ended goes back to postgres.js's closed ones when it closes; handed
        // back as open, the next query would be written to its closed socket.
        if (!connectionLost) tx.release();
      }
    },
    driverError: unwrapDriverError,
    statementsOn,
  };
}

/** The raw-SQL call on a postgres.js connection or transaction. */
function statementsOn(tx: ReservedSql<any> | TransactionSql<any>): RunStatement {
  return async (text, parameters) => ({ rows: [...(await tx.unsafe(jsonAsText(text), parameters as any[]))] as Array<Record<string, unknown>> });
}
