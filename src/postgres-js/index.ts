/**
 * `idempotent-jobs/postgres-js`: the guarantee in your own postgres.js code (an optional peer,
 * `postgres`). `postgresJsDataLayer(sql)` is a data layer whose transaction is `sql.begin`'s.
 *
 * @packageDocumentation
 * @module idempotent-jobs/postgres-js
 */
export type { PostgresJsDataLayerOptions } from '../data-layers/postgres-js.js';
export { postgresJsDataLayer } from '../data-layers/postgres-js.js';
