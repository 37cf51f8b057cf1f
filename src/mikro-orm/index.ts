/**
 * `idempotent-jobs/mikro-orm`: the guarantee in your own MikroORM code (optional peers,
 * `@mikro-orm/core` and `@mikro-orm/postgresql`, 6.x). `mikroOrmDataLayer(orm.em)` is a data
 * layer whose transaction is `em.transactional`'s fork of the entity manager.
 *
 * @packageDocumentation
 * @module idempotent-jobs/mikro-orm
 */
export type { MikroOrmDataLayerOptions } from '../data-layers/mikro-orm.js';
export { mikroOrmDataLayer } from '../data-layers/mikro-orm.js';
