/**
 * `idempotent-jobs/typeorm`: the guarantee in your own TypeORM code (an optional peer,
 * `typeorm`). `typeormDataLayer(dataSource)` is a data layer whose transaction is
 * `dataSource.transaction`'s `EntityManager`.
 *
 * @packageDocumentation
 * @module idempotent-jobs/typeorm
 */
export type { TypeormDataLayerOptions } from '../data-layers/typeorm.js';
export { typeormDataLayer } from '../data-layers/typeorm.js';
