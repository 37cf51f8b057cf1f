import { Module, type DynamicModule, type Provider } from '@nestjs/common';
import { DiscoveryModule, DiscoveryService, Reflector } from '@nestjs/core';
import { getQueueToken } from '@nestjs/bullmq';
import { IdempotentProducer } from '../bullmq/idempotent-producer.js';
import { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { IdempotentJobsHealthIndicator } from './health-indicator.js';
import { IdempotentJobsRuntime } from './idempotent-jobs-runtime.js';
import {
  checkAsyncOptions,
  checkModuleOptions,
  checkQueueOptions,
  type IdempotentJobsModuleAsyncOptions,
  type IdempotentJobsModuleOptions,
  type RegisterQueueOptions,
} from './module-options.js';
import { IDEMPOTENT_JOBS_DATA_LAYER, IDEMPOTENT_JOBS_OPTIONS, getIdempotentProducerToken } from './tokens.js';

/**
 * The NestJS module, shaped as `@nestjs/bullmq`'s `BullModule`: `forRoot` (or `forRootAsync`)
 * once, in the root module, with the keys' database, the claim protocol's options, your ORM's
 * data layer and the queues' connection; `registerQueue` in each feature module that enqueues.
 * The root module is global: it provides {@link IdempotencyKeys}, the data layer
 * (`@InjectDataLayer()`) and {@link IdempotentJobsHealthIndicator} everywhere. Each
 * `@IdempotentProcessor` provider gets a worker once the application has bootstrapped.
 *
 * `registerQueue({ name })` provides the queue's {@link IdempotentProducer}
 * (`@InjectIdempotentProducer(name)`) and its BullMQ `Queue` under `@nestjs/bullmq`'s token
 * (`@InjectQueue(name)`, and Bull Board's `BullBoardModule.forFeature({ name, adapter })`):
 * register a queue here or with `BullModule.registerQueue`, not both.
 *
 * @example
 * ```ts
 * import { Module } from '@nestjs/common';
 * import { TypeOrmModule } from '@nestjs/typeorm';
 * import { DataSource } from 'typeorm';
 * import { IdempotentJobsModule } from 'idempotent-jobs/nestjs';
 * import { typeormDataLayer } from 'idempotent-jobs/typeorm';
 *
 * @Module({
 *   imports: [
 *     TypeOrmModule.forRoot({ type: 'postgres', url: process.env.DATABASE_URL, autoLoadEntities: true }),
 *     IdempotentJobsModule.forRootAsync({
 *       inject: [DataSource],
 *       useFactory: (dataSource: DataSource) => ({
 *         database: process.env.DATABASE_URL!,
 *         dataLayer: typeormDataLayer(dataSource),
 *         connection: { host: '127.0.0.1', port: 6379 },
 *         keys: { leaseMs: 30_000 },
 *       }),
 *     }),
 *     IdempotentJobsModule.registerQueue({ name: 'payments' }),
 *   ],
 * })
 * export class AppModule {}
 * ```
 */
export class IdempotentJobsModule {
  /** The module with its options given here. Throws a `ValidationError` for options it does not know or that contradict each other. */
  static forRoot(options: IdempotentJobsModuleOptions): DynamicModule {
    checkModuleOptions(options);
    return rootModule([{ provide: IDEMPOTENT_JOBS_OPTIONS, useValue: options }], []);
  }

  /**
   * The module with its options built by `useFactory`, whose dependencies (`inject`) come from
   * `imports`: a `ConfigService`, your ORM's `DataSource` or client.
   */
  static forRootAsync(options: IdempotentJobsModuleAsyncOptions): DynamicModule {
    checkAsyncOptions(options);
    const provider: Provider = {
      provide: IDEMPOTENT_JOBS_OPTIONS,
      useFactory: async (...args: unknown[]) => checkModuleOptions(await options.useFactory(...args)),
      inject: options.inject ?? [],
    };
    return rootModule([provider], options.imports ?? []);
  }

  /** The producers (and BullMQ queues) of `queues`, for the module that imports it. */
  static registerQueue(...queues: RegisterQueueOptions[]): DynamicModule {
    const providers = queues.map(checkQueueOptions).flatMap((queue): Provider[] => [
      {
        provide: getIdempotentProducerToken(queue.name),
        useFactory: (runtime: IdempotentJobsRuntime) => runtime.openProducer(queue),
        inject: [IdempotentJobsRuntime],
      },
      {
        provide: getQueueToken(queue.name),
        useFactory: (producer: IdempotentProducer) => producer.queue,
        inject: [getIdempotentProducerToken(queue.name)],
      },
    ]);
    return { module: IdempotentJobsModule, providers, exports: providers };
  }
}
Module({})(IdempotentJobsModule);

function rootModule(optionProviders: Provider[], imports: NonNullable<DynamicModule['imports']>): DynamicModule {
  const providers: Provider[] = [
    ...optionProviders,
    {
      provide: IdempotentJobsRuntime,
      useFactory: (options: IdempotentJobsModuleOptions, discovery: DiscoveryService, reflector: Reflector) => IdempotentJobsRuntime.open(options, discovery, reflector),
      inject: [IDEMPOTENT_JOBS_OPTIONS, DiscoveryService, Reflector],
    },
    { provide: IdempotencyKeys, useFactory: (runtime: IdempotentJobsRuntime) => runtime.keys, inject: [IdempotentJobsRuntime] },
    // No data layer given: null, so that a processor using it fails on its first job, saying so.
    { provide: IDEMPOTENT_JOBS_DATA_LAYER, useFactory: (options: IdempotentJobsModuleOptions) => options.dataLayer ?? null, inject: [IDEMPOTENT_JOBS_OPTIONS] },
    { provide: IdempotentJobsHealthIndicator, useFactory: (runtime: IdempotentJobsRuntime) => new IdempotentJobsHealthIndicator(runtime), inject: [IdempotentJobsRuntime] },
  ];
  return {
    module: IdempotentJobsModule,
    global: true,
    imports: [DiscoveryModule, ...imports],
    providers,
    exports: [IdempotentJobsRuntime, IdempotencyKeys, IDEMPOTENT_JOBS_DATA_LAYER, IdempotentJobsHealthIndicator],
  };
}
