/**
 * `idempotent-jobs/drizzle`: the guarantee in your own Drizzle code (an optional peer,
 * `drizzle-orm`), over its node-postgres or postgres.js driver. `drizzleDataLayer(db)` is a data
 * layer whose transaction is `db.transaction`'s.
 *
 * @packageDocumentation
 * @module idempotent-jobs/drizzle
 */
export type { DrizzleDataLayerOptions, DrizzlePgDatabase, DrizzlePgTransaction, DrizzleTransactionOf } from '../data-layers/drizzle.js';
export { drizzleDataLayer } from '../data-layers/drizzle.js';
