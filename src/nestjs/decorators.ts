import { Inject, SetMetadata } from '@nestjs/common';
import { ValidationError } from '../errors.js';
import { checkProcessorOptions, type IdempotentProcessorWorkerOptions } from './module-options.js';
import { IDEMPOTENT_JOBS_DATA_LAYER, IDEMPOTENT_PROCESSOR_METADATA, getIdempotentProducerToken } from './tokens.js';

/** What `@IdempotentProcessor` records on its class. */
export interface IdempotentProcessorMetadata {
  /** The BullMQ queue the processor's worker takes jobs from. */
  readonly queue: string;
  /** The processor's own worker options. */
  readonly worker: IdempotentProcessorWorkerOptions;
}

/**
 * Marks a provider class as the processor of queue `queue`: once the application has
 * bootstrapped, the module starts an idempotent worker for it whose handler is the class's
 * `process(ctx)` (an {@link IdempotentWorkerHost}) or `transaction(tx, ctx)` (a
 * {@link DatabaseOnlyWorkerHost}). `worker` sets the worker's options (concurrency, lease,
 * fast path, …) over `forRoot({ worker })`; an unknown name is refused here.
 *
 * The library's own decorator, not `@nestjs/bullmq`'s `@Processor`: that one would start a
 * plain BullMQ worker on the same queue.
 *
 * @example
 * ```ts
 * import type { JobContext } from 'idempotent-jobs';
 * import { IdempotentProcessor, IdempotentWorkerHost } from 'idempotent-jobs/nestjs';
 *
 * @IdempotentProcessor('payments', { concurrency: 8 })
 * export class PaymentsProcessor extends IdempotentWorkerHost<{ cents: number }, { charged: number }> {
 *   async process(ctx: JobContext<{ cents: number }>) {
 *     return ctx.transaction(async (tx) => {
 *       await tx.insertInto('ledger').values({ key: ctx.key, cents: ctx.data.cents }).execute();
 *       return { charged: ctx.data.cents };
 *     });
 *   }
 * }
 * ```
 */
export function IdempotentProcessor(queue: string, worker: IdempotentProcessorWorkerOptions = {}): ClassDecorator {
  if (typeof queue !== 'string' || queue === '') {
    throw new ValidationError('INVALID_OPTIONS', 'queue', '@IdempotentProcessor needs the queue name, e.g. @IdempotentProcessor(\'payments\').');
  }
  const metadata: IdempotentProcessorMetadata = { queue, worker: checkProcessorOptions(queue, worker) };
  return SetMetadata(IDEMPOTENT_PROCESSOR_METADATA, metadata) as ClassDecorator;
}

/**
 * Injects queue `queue`'s `IdempotentProducer` (registered with
 * `IdempotentJobsModule.registerQueue({ name: queue })`): `enqueue` adds a job under its
 * idempotency key; given `{ tx }`, within your own transaction.
 *
 * @example
 * ```ts
 * import { Injectable } from '@nestjs/common';
 * import type { IdempotentProducer } from 'idempotent-jobs';
 * import { InjectIdempotentProducer } from 'idempotent-jobs/nestjs';
 *
 * @Injectable()
 * export class CheckoutService {
 *   constructor(@InjectIdempotentProducer('payments') private readonly payments: IdempotentProducer) {}
 *
 *   charge(orderId: string, cents: number) {
 *     return this.payments.enqueue({ name: 'charge', key: `order-${orderId}`, data: { cents } });
 *   }
 * }
 * ```
 */
export function InjectIdempotentProducer(queue: string): PropertyDecorator & ParameterDecorator {
  return Inject(getIdempotentProducerToken(queue));
}

/**
 * Injects the data layer given to `forRoot({ dataLayer })`: for `ctx.transaction(dataLayer, fn)`
 * in a processor, and for `kyselyIn(dataLayer, tx)`, which lets a producer's `enqueue` write in a
 * transaction your service opened with its ORM.
 */
export function InjectDataLayer(): PropertyDecorator & ParameterDecorator {
  return Inject(IDEMPOTENT_JOBS_DATA_LAYER);
}
