import {
  Queue,
  RedisQueueBackend,
  Worker,
  createPostgresBackend,
  type BackendFactory,
  type ConnectionOptions,
  type IQueueBackend,
  type JobProgress,
  type PostgresPoolConfig,
  type Processor,
  type QueueOptions,
  type WorkerOptions,
} from 'bullmq';
import { optionNames, refuseUnknownValue } from '../config/unknown-options.js';

/**
 * Where BullMQ keeps a queue: `redis` (BullMQ's default backend) or `postgres` (BullMQ 6's
 * PostgreSQL backend, the jobs in a schema of their own in a Postgres database).
 */
export type QueueBackendKind = 'redis' | 'postgres';

/**
 * A Postgres queue's connection: a connection string, or a node-postgres pool configuration
 * (BullMQ builds and closes the pool). BullMQ keeps a second, long-lived connection for
 * LISTEN, so this must reach Postgres itself, not a transaction-mode pooler.
 */
export type PostgresQueueConnection = string | PostgresPoolConfig;

/** The schema a Postgres queue lives in when no `prefix` names one: BullMQ's own default. */
export const DEFAULT_POSTGRES_QUEUE_SCHEMA = 'bullmq';

/**
 * Where a queue is: what the worker, producer, relay and sweeper options share. On Redis,
 * `connection` is BullMQ's Redis connection and `prefix` its key prefix; on Postgres,
 * `connection` is a {@link PostgresQueueConnection} and `prefix` the schema BullMQ keeps the
 * jobs in.
 */
export interface QueueConnectionOptions {
  /** Which backend BullMQ keeps the queue in. @defaultValue `'redis'` */
  readonly backend?: QueueBackendKind;
  /** Redis: ioredis options or instance; Postgres: a connection string or pool configuration. */
  readonly connection: ConnectionOptions | PostgresQueueConnection;
  /** Redis: the key prefix (`'bull'` by default); Postgres: the schema (`'bullmq'` by default). @defaultValue per backend */
  readonly prefix?: string;
}

/** Every option name of {@link QueueConnectionOptions}, for the interfaces that extend it. */
export const QUEUE_CONNECTION_OPTION_NAMES = optionNames<QueueConnectionOptions>()(['backend', 'connection', 'prefix']);

/** The backends {@link QueueConnectionOptions.backend} may name. */
const QUEUE_BACKENDS: readonly QueueBackendKind[] = ['redis', 'postgres'];

/**
 * Refuses a `backend` that names neither backend (`'postgress'`): unchecked, it would open a
 * Redis queue with a Postgres connection's settings.
 */
export function assertQueueBackend(options: QueueConnectionOptions, where: string): void {
  refuseUnknownValue(options.backend, QUEUE_BACKENDS, 'backend', where);
}

/** A BullMQ queue on either backend. */
export type AnyQueue = Queue<any, any, string, any, any, string, IQueueBackend, any>;
/** A BullMQ worker on either backend. */
export type AnyWorker = Worker<any, any, string, IQueueBackend, JobProgress, any>;

/**
 * The BullMQ connection options for `options`: Redis as given; Postgres as a pool configuration
 * naming the schema, with BullMQ's migrations run on connect (`migrate: true`: they hold an
 * advisory lock, so many processes may start at once).
 */
function bullmqConnection(options: QueueConnectionOptions): { connection: unknown; prefix?: string } {
  assertQueueBackend(options, 'the queue connection');
  if ((options.backend ?? 'redis') === 'redis') return { connection: options.connection, prefix: options.prefix };
  const given = options.connection as PostgresQueueConnection;
  const config: PostgresPoolConfig = typeof given === 'string' ? { connectionString: given } : given;
  return { connection: { migrate: true, ...config, schema: postgresQueueSchema(options) } };
}

/** The schema a Postgres queue of `options` lives in. */
export function postgresQueueSchema(options: QueueConnectionOptions): string {
  const given = options.connection as PostgresQueueConnection;
  return options.prefix ?? (typeof given === 'object' ? given.schema : undefined) ?? DEFAULT_POSTGRES_QUEUE_SCHEMA;
}

function factoryOf(options: QueueConnectionOptions): BackendFactory<any, any> | undefined {
  return options.backend === 'postgres' ? (createPostgresBackend as BackendFactory<any, any>) : undefined;
}

/**
 * Opens a BullMQ `Queue` on the backend `options` name (on Postgres, over a pool of its own,
 * running BullMQ's migrations on its first query).
 */
export function openQueue(name: string, options: QueueConnectionOptions, queueOptions: Omit<QueueOptions, 'connection' | 'prefix'> = {}): AnyQueue {
  const factory = factoryOf(options);
  const opts = { ...queueOptions, ...bullmqConnection(options) } as QueueOptions<any>;
  return factory ? new Queue(name, opts, factory) : (new Queue(name, opts as QueueOptions) as unknown as AnyQueue);
}

/** Opens a BullMQ `Worker` on the backend `options` name; it starts taking jobs unless `autorun` is false. */
export function openWorker(
  name: string,
  processor: Processor,
  options: QueueConnectionOptions,
  workerOptions: Omit<WorkerOptions, 'connection' | 'prefix'> = {},
): AnyWorker {
  const factory = factoryOf(options);
  const opts = { ...workerOptions, ...bullmqConnection(options) } as WorkerOptions<any>;
  return factory ? new Worker(name, processor, opts, factory) : (new Worker(name, processor, opts as WorkerOptions) as unknown as AnyWorker);
}

/** The queue's Redis backend, or undefined when the queue is kept elsewhere (Postgres). */
export function redisBackendOf(queue: { getBackend(): IQueueBackend }): RedisQueueBackend | undefined {
  const backend = queue.getBackend();
  return backend instanceof RedisQueueBackend ? backend : undefined;
}
