/**
 * `idempotent-jobs/pg`: the guarantee in your own node-postgres code. `pgDataLayer(pool)` is a
 * data layer whose transaction is a `PoolClient` of your pool; the key's fenced completion
 * commits in it with your effect.
 *
 * @packageDocumentation
 * @module idempotent-jobs/pg
 */
export type { PgDataLayerOptions } from '../data-layers/node-postgres.js';
export { pgDataLayer } from '../data-layers/node-postgres.js';
