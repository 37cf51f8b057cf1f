/**
 * `idempotent-jobs/nestjs`: the guarantee in a NestJS application (optional peers
 * `@nestjs/common`, `@nestjs/core`, `@nestjs/bullmq`). `IdempotentJobsModule.forRoot` /
 * `forRootAsync` and `registerQueue`, as `BullModule` has; processors written the Nest way
 * (`@IdempotentProcessor('payments')` on a class extending `IdempotentWorkerHost`, whose
 * `process(ctx)` gets the library's context, or `DatabaseOnlyWorkerHost`); the effect in the
 * ORM the application already injects (`forRoot({ dataLayer })`); an injected producer per
 * queue (`@InjectIdempotentProducer('payments')`); workers that start once the application has
 * bootstrapped and drain, releasing held keys, on shutdown; a `@nestjs/terminus` health
 * indicator. The library's side is written without decorator syntax, so it needs no compiler
 * setting of yours beyond Nest's own (`experimentalDecorators`, `emitDecoratorMetadata`).
 *
 * @packageDocumentation
 * @module idempotent-jobs/nestjs
 */
export { IdempotentJobsModule } from './idempotent-jobs-module.js';
export type {
  IdempotentJobsModuleAsyncOptions,
  IdempotentJobsModuleOptions,
  IdempotentProcessorWorkerOptions,
  RegisterQueueOptions,
} from './module-options.js';
export { IdempotentProcessor, InjectDataLayer, InjectIdempotentProducer, type IdempotentProcessorMetadata } from './decorators.js';
export { DatabaseOnlyWorkerHost, IdempotentWorkerHost } from './worker-hosts.js';
export { IdempotentJobsHealthIndicator, type IdempotentJobsHealth } from './health-indicator.js';
export { IdempotentJobsRuntime, type RunningProcessor } from './idempotent-jobs-runtime.js';
export { IDEMPOTENT_JOBS_DATA_LAYER, IDEMPOTENT_JOBS_OPTIONS, getIdempotentProducerToken } from './tokens.js';
