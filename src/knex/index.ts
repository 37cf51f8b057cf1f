/**
 * `idempotent-jobs/knex`: the guarantee in your own Knex code (an optional peer, `knex`, client
 * `pg`). `knexDataLayer(db)` is a data layer whose transaction is a Knex transaction.
 *
 * @packageDocumentation
 * @module idempotent-jobs/knex
 */
export type { KnexDataLayerOptions, KnexQueryContext } from '../data-layers/knex.js';
export { KNEX_QUERY_CONTEXT, knexDataLayer } from '../data-layers/knex.js';
