import { pino, type Logger } from 'pino';
import type { EnvConfig } from '../config/env-config.js';
import type { FaultHook } from '../fault-hook.js';
import { instrumentWorker } from '../metrics/worker-metrics.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { openKeyStoreFromEnv, runnerSettingsFromEnv } from '../runtime/key-store-from-env.js';
import { onShutdownSignals } from '../runtime/shutdown-signals.js';
import type { ConsumeMessage } from 'amqplib';
import type { KeyedJobHandler } from '../consumer/database-only-handler.js';
import { createAmqpConsumer, type AmqpConsumer } from './amqp-consumer.js';
import type { AmqpIdentityOptions } from './amqp-identity.js';

/** What {@link startAmqpConsumerProcess} needs besides the environment. */
export interface AmqpConsumerProcessOptions<P, R> {
  /** Postgres, schema, lease and shutdown settings (`QUEUE` and `CONCURRENCY` too, unless given here). */
  readonly config: EnvConfig;
  /** A function, or a database-only handler (`{ transaction }`: fast path and group commit unless `FAST_PATH` / `GROUP_COMMIT` are false). */
  readonly handler: KeyedJobHandler<P, R, ConsumeMessage>;
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
  const store = await openKeyStoreFromEnv(config, { logger, applicationName: `idempotent-jobs:amqp:${queue}`, concurrency });
  const { keys } = store;
  const consumer = createAmqpConsumer<P, R>({
    url: options.url ?? process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672',
    queue,
    keys,
    handler: options.handler,
    concurrency,
    identity: options.identity,
    ...runnerSettingsFromEnv(config),
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
      await store.destroy();
    })());
  if (options.handleSignals ?? true) onShutdownSignals(logger, stop);
  return { consumer, keys, logger, stop };
}
