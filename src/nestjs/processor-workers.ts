import type { DiscoveryService, Reflector } from '@nestjs/core';
import type { Logger } from 'pino';
import { createIdempotentWorker, type IdempotentWorker, type IdempotentWorkerOptions } from '../bullmq/idempotent-worker.js';
import type { KeySettledListener } from '../store/key-settled-listener.js';
import type { QueueConnectionOptions } from '../bullmq/queue-connection.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { databaseOnly } from '../consumer/database-only-handler.js';
import type { DataLayer } from '../store/data-layer.js';
import { ValidationError } from '../errors.js';
import type { IdempotentProcessorMetadata } from './decorators.js';
import type { IdempotentProcessorWorkerOptions } from './module-options.js';
import { IDEMPOTENT_PROCESSOR_METADATA, NESTJS_BULLMQ_PROCESSOR_METADATA } from './tokens.js';
import { DatabaseOnlyWorkerHost, IdempotentWorkerHost, attachWorker } from './worker-hosts.js';

/** A provider as Nest's discovery lists it. */
type InstanceWrapper = ReturnType<DiscoveryService['getProviders']>[number];

/** One processor found among the application's providers. */
export interface FoundProcessor {
  /** The provider's class name, for messages. */
  readonly name: string;
  /** The provider's instance. */
  readonly host: IdempotentWorkerHost | DatabaseOnlyWorkerHost;
  /** What its decorator recorded. */
  readonly metadata: IdempotentProcessorMetadata;
}

/**
 * The application's processors: every provider whose class carries `@IdempotentProcessor`.
 * Refuses (with what to change) a processor that extends neither host class, one that is not a
 * singleton, two processors of one queue, and a host class decorated with `@nestjs/bullmq`'s
 * `@Processor` instead of ours (that one would start a plain BullMQ worker on the queue).
 */
export function findProcessors(discovery: DiscoveryService, reflector: Reflector): FoundProcessor[] {
  const found: FoundProcessor[] = [];
  const byQueue = new Map<string, string>();
  for (const wrapper of discovery.getProviders()) {
    const type = classOf(wrapper);
    if (!type) continue;
    const metadata = reflector.get<IdempotentProcessorMetadata | undefined>(IDEMPOTENT_PROCESSOR_METADATA, type);
    const name = type.name;
    if (!metadata) {
      if (isHostClass(type) && reflector.get(NESTJS_BULLMQ_PROCESSOR_METADATA, type)) {
        throw new ValidationError(
          'INVALID_OPTIONS',
          'processor',
          `${name} extends ${Object.getPrototypeOf(type).name ?? 'a worker host'} but is decorated with @nestjs/bullmq's @Processor, which would start a plain BullMQ worker: decorate it with @IdempotentProcessor from 'idempotent-jobs/nestjs' instead.`,
        );
      }
      continue;
    }
    if (!wrapper.isDependencyTreeStatic()) {
      throw new ValidationError('INVALID_OPTIONS', 'processor', `${name} (@IdempotentProcessor('${metadata.queue}')) is request-scoped or depends on a request-scoped provider; a processor's worker runs for the application's life: make it a singleton.`);
    }
    const host = wrapper.instance as unknown;
    if (!(host instanceof IdempotentWorkerHost) && !(host instanceof DatabaseOnlyWorkerHost)) {
      throw new ValidationError(
        'INVALID_OPTIONS',
        'processor',
        `${name} is decorated with @IdempotentProcessor('${metadata.queue}') but extends neither IdempotentWorkerHost (a process(ctx) method) nor DatabaseOnlyWorkerHost (a transaction(tx, ctx) method).`,
      );
    }
    const other = byQueue.get(metadata.queue);
    if (other) {
      throw new ValidationError('INVALID_OPTIONS', 'processor', `${other} and ${name} are both processors of queue "${metadata.queue}"; a queue has one processor (raise its concurrency instead).`);
    }
    byQueue.set(metadata.queue, name);
    found.push({ name, host, metadata });
  }
  return found;
}

/** The class of a provider (`useValue` and `useFactory` providers: their instance's), as `@nestjs/bullmq`'s explorer finds it. */
function classOf(wrapper: InstanceWrapper): (abstract new (...args: never[]) => unknown) | undefined {
  const type = !wrapper.metatype || wrapper.inject ? (wrapper.instance as { constructor?: unknown } | undefined)?.constructor : wrapper.metatype;
  return typeof type === 'function' ? (type as abstract new (...args: never[]) => unknown) : undefined;
}

function isHostClass(type: abstract new (...args: never[]) => unknown): boolean {
  return type.prototype instanceof IdempotentWorkerHost || type.prototype instanceof DatabaseOnlyWorkerHost;
}

/** What every processor's worker shares: the keys, the data layer, the defaults. */
export interface ProcessorWorkerSettings {
  readonly keys: IdempotencyKeys;
  readonly dataLayer: DataLayer<any> | undefined;
  readonly listener: KeySettledListener | undefined;
  readonly defaults: IdempotentProcessorWorkerOptions;
  readonly logger: Logger;
}

/**
 * Starts the worker of one processor on `connection`: `process(ctx)` as a function handler, or
 * `transaction(tx, ctx)` as a database-only one (in the module's data layer when it has one).
 * The module's data layer is checked at start with the processor's own `dataLayers`.
 */
export function startProcessorWorker(processor: FoundProcessor, connection: QueueConnectionOptions, settings: ProcessorWorkerSettings): IdempotentWorker<any, any> {
  const { host, metadata } = processor;
  const own = { ...settings.defaults, ...metadata.worker };
  const dataLayers = [...(settings.dataLayer ? [settings.dataLayer] : []), ...(own.dataLayers ?? [])];
  const handler: IdempotentWorkerOptions<any, any>['handler'] =
    host instanceof IdempotentWorkerHost
      ? (ctx) => host.process(ctx)
      : settings.dataLayer
        ? databaseOnly(settings.dataLayer, (tx: unknown, ctx) => (host as DatabaseOnlyWorkerHost<unknown, unknown, unknown>).transaction(tx, ctx as never))
        : databaseOnly((tx, ctx) => (host as DatabaseOnlyWorkerHost).transaction(tx, ctx as never));
  const worker = createIdempotentWorker<any, any>({
    ...own,
    queue: metadata.queue,
    backend: connection.backend,
    connection: connection.connection,
    prefix: connection.prefix,
    keys: settings.keys,
    handler,
    ...(dataLayers.length > 0 ? { dataLayers } : {}),
    ...(settings.listener ? { listener: settings.listener } : {}),
    logger: settings.logger.child({ processor: processor.name }),
  });
  attachWorker(host, worker);
  return worker;
}
