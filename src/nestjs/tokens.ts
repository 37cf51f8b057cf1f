/** The injection tokens of the NestJS module, and the metadata key its processor decorator sets. */

/** The module's resolved options (what `forRoot` was given, or `forRootAsync`'s factory returned). */
export const IDEMPOTENT_JOBS_OPTIONS = 'idempotent-jobs:module-options';

/** The data layer of `forRoot({ dataLayer })`, injected with `@InjectDataLayer()`. */
export const IDEMPOTENT_JOBS_DATA_LAYER = 'idempotent-jobs:data-layer';

/** The metadata `@IdempotentProcessor` puts on a class: its queue and worker options. */
export const IDEMPOTENT_PROCESSOR_METADATA = 'idempotent-jobs:processor';

/** `@nestjs/bullmq`'s own processor metadata key, to tell its `@Processor` apart from ours on a host class. */
export const NESTJS_BULLMQ_PROCESSOR_METADATA = 'bullmq:processor_metadata';

/**
 * The injection token of queue `name`'s `IdempotentProducer` (what
 * `@InjectIdempotentProducer(name)` injects), for `moduleRef.get` and test overrides.
 */
export function getIdempotentProducerToken(name: string): string {
  return `IdempotentProducer_${name}`;
}
