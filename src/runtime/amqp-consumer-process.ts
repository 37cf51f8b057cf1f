import { pino, type Logger } from 'pino';
import type { EnvConfig } from './env-config.js';
import type { FaultHook } from '../fault-hook.js';
import type { MetricsServer } from '../metrics/metrics-server.js';
import type { Maintenance } from '../ops/maintenance.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { operateConsumer } from './consumer-operations.js';
import { openKeyStoreFromEnv, runnerSettingsFromEnv } from './key-store-from-env.js';
import { onShutdownSignals } from './shutdown-signals.js';
import { createAmqpConsumer, type AmqpConsumer, type AmqpConsumerOptions } from '../amqp/amqp-consumer.js';
import type { AmqpIdentityOptions } from '../amqp/amqp-identity.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** What {@link startAmqpConsumerProcess} needs besides the environment. */
export interface AmqpConsumerProcessOptions<P, R> {
  /** Postgres, schema, lease and shutdown settings (`QUEUE` and `CONCURRENCY` too, unless given here). */
  readonly config: EnvConfig;
  /** A function, or a database-only handler (`{ transaction }`: fast path and group commit unless `FAST_PATH` / `GROUP_COMMIT` are false). */
  readonly handler: AmqpConsumerOptions<P, R>['handler'];
  /** RabbitMQ's URL. @defaultValue `$AMQP_URL` or `'amqp://guest:guest@127.0.0.1:5672'` */
  readonly url?: string;
  /** The queue to consume. @defaultValue `config.QUEUE` */
  readonly queue?: string;
  /** Messages run at once (the channel's prefetch). @defaultValue `config.CONCURRENCY` */
  readonly concurrency?: number;
  /** Where the key comes from: the body (wire contract), a header or the message id. @defaultValue `{ source: 'body' }` */
  readonly identity?: AmqpIdentityOptions;
  /** Structured logger. @defaultValue `pino()` at `LOG_LEVEL` */
  readonly logger?: Logger;
  /** Chaos testing only. @defaultValue unset */
  readonly faultHook?: FaultHook;
  /** Install SIGTERM/SIGINT handlers that close gracefully and exit. @defaultValue `true` */
  readonly handleSignals?: boolean;
}

/** A running consumer process's parts. */
export interface AmqpConsumerProcess<P, R> {
  /** The consumer, consuming. */
  readonly consumer: AmqpConsumer<P, R>;
  /** The claim protocol, over the process's Postgres pool. */
  readonly keys: IdempotencyKeys;
  /** The process's logger. */
  readonly logger: Logger;
  /** `/metrics` and `/healthz` (checks `postgres`, `broker`, `consumer`), when `METRICS_PORT` is set. */
  readonly metricsServer?: MetricsServer;
  /** The janitor and the key statistics (one process at a time runs each), unless turned off; never the sweeper. */
  readonly maintenance?: Maintenance;
  /** Graceful close, then maintenance, the metrics server and the pools. */
  stop(): Promise<void>;
}

/**
 * Builds and starts a RabbitMQ consumer process: the Postgres pools (waited for up to
 * STARTUP_WAIT_MS, migrated when MIGRATE), the claim protocol, the consumer, metrics events,
 * `/metrics` and `/healthz` on METRICS_PORT, maintenance as the worker process runs it (without
 * the sweeper: see `operateConsumer`), and signal handling (SIGTERM/SIGINT: graceful
 * close within SHUTDOWN_TIMEOUT_MS).
 */
export async function startAmqpConsumerProcess<P, R>(options: AmqpConsumerProcessOptions<P, R>): Promise<AmqpConsumerProcess<P, R>> {
  refuseUnknownOptions(options, optionNames<AmqpConsumerProcessOptions<unknown, unknown>>()(['config', 'handler', 'url', 'queue', 'concurrency', 'identity', 'logger', 'faultHook', 'handleSignals']), 'startAmqpConsumerProcess(options)');
  const { config } = options;
  const logger = options.logger ?? pino({ level: config.LOG_LEVEL });
  const queue = options.queue ?? config.QUEUE;
  const concurrency = options.concurrency ?? config.CONCURRENCY;
  const store = await openKeyStoreFromEnv(config, { logger, applicationName: `idempotent-jobs:amqp:${queue}`, concurrency });
  const { keys } = store;
  const { consumer, metricsServer, maintenance, stop } = await operateConsumer(
    config,
    store,
    async () =>
      createAmqpConsumer<P, R>({
        url: options.url ?? process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672',
        queue,
        keys,
        handler: options.handler,
        concurrency,
        identity: options.identity,
        ...runnerSettingsFromEnv(config),
        logger,
        faultHook: options.faultHook,
      }),
    {
      logger,
      component: 'amqp-consumer',
      queueLabel: queue,
      notConsuming: 'no open RabbitMQ channel (connecting or reconnecting)',
      start: (started) => started.start(),
    },
  );
  logger.info({ queue, concurrency, leaseMs: config.LEASE_MS, metricsPort: metricsServer?.port }, 'amqp consumer ready');
  if (options.handleSignals ?? true) onShutdownSignals(logger, stop);
  return { consumer, keys, logger, stop, metricsServer, maintenance };
}
