import type { DynamicModule, InjectionToken, OptionalFactoryDependency } from '@nestjs/common';
import type { Kysely } from 'kysely';
import type { Logger } from 'pino';
import type { IdempotentProducerOptions } from '../bullmq/idempotent-producer.js';
import type { IdempotentWorkerOptions } from '../bullmq/idempotent-worker.js';
import type { OutboxRelayOptions } from '../bullmq/outbox-relay.js';
import type { QueueConnectionOptions } from '../bullmq/queue-connection.js';
import { ValidationError } from '../errors.js';
import type { IdempotencyOptions } from '../protocol/idempotency-options.js';
import type { PostgresDbOptions } from '../store/create-postgres-db.js';
import type { DataLayer } from '../store/data-layer.js';
import { refuseUnknownOptions } from '../config/unknown-options.js';

/**
 * What a processor may set on its worker (`@IdempotentProcessor('payments', { concurrency: 8 })`)
 * and what `forRoot({ worker })` sets for all of them: the worker's own options, less those the
 * module supplies (the queue, its connection, the keys, the handler, the listener, the logger).
 */
export type IdempotentProcessorWorkerOptions = Omit<
  IdempotentWorkerOptions,
  'queue' | 'keys' | 'handler' | 'connection' | 'backend' | 'prefix' | 'listener' | 'logger' | 'faultHook'
>;

/**
 * Every option name of `T`, each `true`: written out so that the compiler fails when the type
 * gains or loses an option the run-time check below does not know of.
 */
type EveryName<T> = { readonly [K in keyof T]-?: true };

const PROCESSOR_WORKER_OPTIONS: EveryName<IdempotentProcessorWorkerOptions> = {
  concurrency: true,
  fastPath: true,
  keyOf: true,
  errorDisposition: true,
  finishJobInEffect: true,
  dataLayers: true,
  storePayload: true,
  workerOptions: true,
  leaseMs: true,
  heartbeatMs: true,
  lockDurationMs: true,
  stalledIntervalMs: true,
  maxStalledCount: true,
  deferMaxMs: true,
  deferMinMs: true,
  deferJitterRatio: true,
  waitMs: true,
  startupWaitMs: true,
  shutdownTimeoutMs: true,
  storeRetryMinMs: true,
  storeRetryMaxMs: true,
  storeRetryWindowMs: true,
  concurrencyStarvationMs: true,
  concurrencySlotReuseMs: true,
};

/** Options of `IdempotentJobsModule.forRoot`, or what `forRootAsync`'s factory returns. */
export interface IdempotentJobsModuleOptions extends QueueConnectionOptions {
  /**
   * The keys' database, which the module opens a pool on at start and closes at shutdown: a
   * connection string, or {@link PostgresDbOptions}. Give this or `db`.
   */
  readonly database?: string | PostgresDbOptions;
  /** A Kysely instance of your own for the keys (the module does not close it). Give this or `database`. @defaultValue unset */
  readonly db?: Kysely<any>;
  /** The claim protocol's options (schema, lease, retention, …). @defaultValue the protocol's defaults */
  readonly keys?: Omit<IdempotencyOptions, 'db'>;
  /**
   * Your ORM as a data layer (`typeormDataLayer(dataSource)`, `prismaDataLayer(prisma)`, …):
   * injected with `@InjectDataLayer()`, the transaction a `DatabaseOnlyWorkerHost` runs in, and
   * checked at start to be in the keys' database (every worker's `dataLayers`).
   * @defaultValue unset (database-only processors run in the keys' own Kysely transaction)
   */
  readonly dataLayer?: DataLayer<any>;
  /** Run the library's migrations at start (they hold an advisory lock: many instances may start at once). @defaultValue `true` */
  readonly migrate?: boolean;
  /**
   * A connection to Postgres itself (not a transaction-mode pooler) for the listener that wakes a
   * duplicate waiting on its key (a processor's `waitMs`). @defaultValue unset (no listener: a duplicate defers at once)
   */
  readonly listenerConnectionString?: string;
  /**
   * The outbox relay, which moves the jobs enqueued in your transactions (`{ tx }`, on Redis) to
   * their queues: `false` never starts it; options tune it. It runs only while a registered queue
   * enqueues through the outbox. @defaultValue `true`
   */
  readonly relay?: boolean | Pick<OutboxRelayOptions, 'batchSize' | 'pollIntervalMs' | 'heldRowRetryMs'>;
  /** Defaults for every processor's worker; a processor's own options override them. @defaultValue none */
  readonly worker?: IdempotentProcessorWorkerOptions;
  /**
   * How long the start waits for each worker to be ready (its queue connected, its data layers
   * checked) before the application's bootstrap fails with the reason. @defaultValue `60_000`
   */
  readonly startupTimeoutMs?: number;
  /** Structured logger for the workers, producers and relay. @defaultValue pino at `LOG_LEVEL`, else `warn` */
  readonly logger?: Logger;
}

/** Options of `IdempotentJobsModule.forRootAsync`: the options built by a factory with injected dependencies, as `@nestjs/typeorm`'s. */
export interface IdempotentJobsModuleAsyncOptions {
  /** Modules whose providers the factory injects (a `ConfigModule`, `TypeOrmModule`). @defaultValue none */
  readonly imports?: DynamicModule['imports'];
  /** The factory's dependencies, in its parameters' order (a `ConfigService`, TypeORM's `DataSource`). @defaultValue none */
  readonly inject?: Array<InjectionToken | OptionalFactoryDependency>;
  /** Builds the options. */
  readonly useFactory: (...args: any[]) => IdempotentJobsModuleOptions | Promise<IdempotentJobsModuleOptions>;
}

/** One queue of `IdempotentJobsModule.registerQueue`: its producer, and where its processor's worker connects. */
export interface RegisterQueueOptions extends Partial<QueueConnectionOptions> {
  /** The BullMQ queue name. */
  readonly name: string;
  /** Scope for enqueues that name none. @defaultValue `'default'` */
  readonly defaultScope?: string;
  /** Options for every job of this queue (attempts, backoff, removeOnComplete, …). @defaultValue none */
  readonly defaultJobOptions?: IdempotentProducerOptions['defaultJobOptions'];
  /** Where an enqueue in your transaction writes (see `IdempotentProducerOptions.enqueueInTransaction`). @defaultValue `'queue'` on the Postgres backend, `'outbox'` on Redis */
  readonly enqueueInTransaction?: IdempotentProducerOptions['enqueueInTransaction'];
}

const MODULE_OPTIONS: EveryName<IdempotentJobsModuleOptions> = {
  database: true,
  db: true,
  keys: true,
  dataLayer: true,
  migrate: true,
  listenerConnectionString: true,
  relay: true,
  worker: true,
  startupTimeoutMs: true,
  logger: true,
  backend: true,
  connection: true,
  prefix: true,
};
const QUEUE_OPTIONS: EveryName<RegisterQueueOptions> = {
  name: true,
  backend: true,
  connection: true,
  prefix: true,
  defaultScope: true,
  defaultJobOptions: true,
  enqueueInTransaction: true,
};
const ASYNC_OPTIONS: EveryName<IdempotentJobsModuleAsyncOptions> = { imports: true, inject: true, useFactory: true };
const RELAY_OPTIONS: EveryName<Exclude<IdempotentJobsModuleOptions['relay'], boolean | undefined>> = { batchSize: true, pollIntervalMs: true, heldRowRetryMs: true };
const names = (every: object) => Object.keys(every);

/**
 * Refuses an options object that is not a plain object, or that has a name `allowed` does not
 * list (a misspelt `concurency` would otherwise be ignored in silence).
 */
export function assertKnownOptions(what: string, field: string, value: unknown, allowed: readonly string[]): void {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new ValidationError('INVALID_OPTIONS', field, `${what} takes an options object, got ${value === null ? 'null' : Array.isArray(value) ? 'an array' : typeof value}.`);
  }
  refuseUnknownOptions(value, allowed, what);
}

/** Checks `forRoot`'s options (or what `forRootAsync`'s factory returned); returns them. */
export function checkModuleOptions(options: IdempotentJobsModuleOptions): IdempotentJobsModuleOptions {
  const what = 'IdempotentJobsModule.forRoot';
  assertKnownOptions(what, 'options', options, names(MODULE_OPTIONS));
  if ((options.database === undefined) === (options.db === undefined)) {
    throw new ValidationError(
      'INVALID_OPTIONS',
      'options.database',
      `${what} needs the keys' database: give \`database\` (a connection string; the module opens and closes the pool) or \`db\` (a Kysely instance of your own), not ${options.db ? 'both' : 'neither'}.`,
    );
  }
  if (options.connection === undefined) {
    throw new ValidationError('INVALID_OPTIONS', 'options.connection', `${what} needs the queues' \`connection\` (Redis options, or a Postgres connection string with backend: 'postgres').`);
  }
  if (options.worker !== undefined) assertKnownOptions(`${what}'s worker`, 'options.worker', options.worker, names(PROCESSOR_WORKER_OPTIONS));
  if (typeof options.relay === 'object') assertKnownOptions(`${what}'s relay`, 'options.relay', options.relay, names(RELAY_OPTIONS));
  if (options.startupTimeoutMs !== undefined && !(Number.isInteger(options.startupTimeoutMs) && options.startupTimeoutMs > 0)) {
    throw new ValidationError('INVALID_OPTIONS', 'options.startupTimeoutMs', `${what}: startupTimeoutMs must be a whole number of milliseconds above 0, got ${String(options.startupTimeoutMs)}.`);
  }
  return options;
}

/** Checks `forRootAsync`'s options. */
export function checkAsyncOptions(options: IdempotentJobsModuleAsyncOptions): void {
  assertKnownOptions('IdempotentJobsModule.forRootAsync', 'options', options, names(ASYNC_OPTIONS));
  if (typeof options.useFactory !== 'function') {
    throw new ValidationError('INVALID_OPTIONS', 'options.useFactory', 'IdempotentJobsModule.forRootAsync needs `useFactory`, a function returning the module options.');
  }
}

/** Checks one queue of `registerQueue`. */
export function checkQueueOptions(options: RegisterQueueOptions): RegisterQueueOptions {
  assertKnownOptions('IdempotentJobsModule.registerQueue', 'queue', options, names(QUEUE_OPTIONS));
  if (typeof options.name !== 'string' || options.name === '') {
    throw new ValidationError('INVALID_OPTIONS', 'queue.name', 'IdempotentJobsModule.registerQueue needs each queue\'s `name` (the BullMQ queue name).');
  }
  return options;
}

/** Checks a processor's worker options. */
export function checkProcessorOptions(queue: string, options: IdempotentProcessorWorkerOptions): IdempotentProcessorWorkerOptions {
  assertKnownOptions(`@IdempotentProcessor('${queue}')`, 'worker', options, names(PROCESSOR_WORKER_OPTIONS));
  return options;
}
