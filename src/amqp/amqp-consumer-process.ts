import { pino, type Logger } from 'pino';
import type { EnvConfig } from '../config/env-config.js';
import type { FaultHook } from '../fault-hook.js';
import { instrumentWorker } from '../metrics/worker-metrics.js';
import { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { onShutdownSignals } from '../runtime/shutdown-signals.js';
import { waitForStore } from '../runtime/wait-for-store.js';
import { createPostgresDb } from '../store/create-postgres-db.js';
import { migrate } from '../store/migrate.js';
import { pingDatabase } from '../store/sql/ping.js';
import { createAmqpConsumer, type AmqpConsumer, type AmqpJobHandler } from './amqp-consumer.js';
import type { AmqpIdentityOptions } from './amqp-identity.js';

/** What {@link startAmqpConsumerProcess} needs besides the environment. */
export interface AmqpConsumerProcessOptions<P, R> {
  /** Postgres, schema, lease and shutdown settings (`QUEUE` and `CONCURRENCY` too, unless given here). */
  readonly config: EnvConfig;
  readonly handler: AmqpJobHandler<P, R>;
  /** @defaultValue `$AMQP_URL` or `'amqp://guest:guest@127.0.0.1:5672'` */
  readonly url?: string;
  readonly queue?: string;
  readonly concurrency?: number;
  readonly identity?: AmqpIdentityOptions;
  readonly logger?: Logger;
  readonly faultHook?: FaultHook;
  /** Install SIGTERM/SIGINT handlers that close gracefully and exit. @defaultValue `true` */
  readonly handleSignals?: boolean;
}

/** A running consumer process's parts. */
export interface AmqpConsumerProcess<P, R> {
  readonly consumer: AmqpConsumer<P, R>;
  readonly keys: IdempotencyKeys;
  readonly logger: Logger;
  stop(): Promise<void>;
}

/**
 * Builds and starts a RabbitMQ consumer process: the Postgres pool (waited for up to
 * STARTUP_WAIT_MS, migrated when MIGRATE), the claim protocol, the consumer, metrics events and
 * signal handling (SIGTERM/SIGINT: graceful close within SHUTDOWN_TIMEOUT_MS).
 */
export async function startAmqpConsumerProcess<P, R>(options: AmqpConsumerProcessOptions<P, R>): Promise<AmqpConsumerProcess<P, R>> {
  const { config } = options;
  const logger = options.logger ?? pino({ level: config.LOG_LEVEL });
  const queue = options.queue ?? config.QUEUE;
  const concurrency = options.concurrency ?? config.CONCURRENCY;
  const db = createPostgresDb(
    { connectionString: config.DATABASE_URL, maxConnections: config.PG_POOL_SIZE ?? concurrency + 2, applicationName: `idempotent-jobs:amqp:${queue}` },
    (error) => logger.warn({ err: error }, 'idle Postgres connection failed; the pool replaces it'),
  );
  try {
    await waitForStore<unknown>(() => (config.MIGRATE ? migrate(db, { schema: config.SCHEMA }) : pingDatabase(db)), {
      what: 'Postgres',
      deadline: Date.now() + config.STARTUP_WAIT_MS,
      logger,
    });
  } catch (error) {
    await db.destroy();
    throw error;
  }
  const keys = new IdempotencyKeys({ db, schema: config.SCHEMA, leaseMs: config.LEASE_MS, retentionMs: config.RETENTION_MS });
  const consumer = createAmqpConsumer<P, R>({
    url: options.url ?? process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672',
    queue,
    keys,
    handler: options.handler,
    concurrency,
    identity: options.identity,
    leaseMs: config.LEASE_MS,
    heartbeatMs: config.HEARTBEAT_MS,
    deferMaxMs: config.DEFER_MAX_MS,
    shutdownTimeoutMs: config.SHUTDOWN_TIMEOUT_MS,
    storeRetryMinMs: config.STORE_RETRY_MIN_MS,
    storeRetryMaxMs: config.STORE_RETRY_MAX_MS,
    fastPath: config.FAST_PATH,
    storePayload: config.STORE_PAYLOAD,
    logger,
    faultHook: options.faultHook,
  });
  const uninstrument = instrumentWorker(consumer, queue);
  await consumer.start();
  logger.info({ pid: process.pid, queue, concurrency, leaseMs: config.LEASE_MS }, 'amqp consumer ready');
  let stopped: Promise<void> | undefined;
  const stop = () =>
    (stopped ??= (async () => {
      await consumer.close();
      uninstrument();
      await db.destroy();
    })());
  if (options.handleSignals ?? true) onShutdownSignals(logger, stop);
  return { consumer, keys, logger, stop };
}
