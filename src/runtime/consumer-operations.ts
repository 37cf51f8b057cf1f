import type { EventEmitter } from 'node:events';
import type { Logger } from 'pino';
import type { EnvConfig } from './env-config.js';
import { startMetricsServer, type MetricsServer } from '../metrics/metrics-server.js';
import { instrumentWorker } from '../metrics/worker-metrics.js';
import type { WorkerEvent } from '../consumer/worker-event.js';
import type { Maintenance } from '../ops/maintenance.js';
import { createMaintenanceFromConfig } from './maintenance-process.js';
import { PostgresOperatorStore } from '../store/operator-store.js';
import { CLOSE_AFTER_FAILED_START_MS, closeWithin } from './close-within.js';
import type { KeyStoreFromEnv } from './key-store-from-env.js';

/** What {@link operateConsumer} needs of a broker consumer. */
export interface OperatedConsumer extends Pick<EventEmitter<{ event: [WorkerEvent] }>, 'on' | 'off'> {
  /** Connected to its broker and taking messages: the `broker` check of `/healthz`. */
  readonly isConsuming: boolean;
  /** Started and not closing: the `consumer` check of `/healthz`. */
  readonly isRunning: boolean;
  /** Closes the consumer: gracefully, or at once with `force` (after a failed start). */
  close(options?: { force?: boolean }): Promise<void>;
}

/** How {@link operateConsumer} runs one broker's consumer. */
export interface ConsumerOperationsOptions<C extends OperatedConsumer> {
  readonly logger: Logger;
  /** The `component` label of `idempotent_jobs_ready`, e.g. `'amqp-consumer'`. */
  readonly component: string;
  /** The `queue` label of its job metrics: the AMQP queue, `<stream>/<consumer>` on JetStream. */
  readonly queueLabel: string;
  /** Why the `broker` check fails while the consumer is not consuming, in the broker's words. */
  readonly notConsuming: string;
  /** Starts the consumer; resolves once it consumes. */
  readonly start: (consumer: C) => Promise<void>;
}

/** A started broker consumer with its operations. */
export interface OperatedConsumerProcess<C extends OperatedConsumer> {
  /** The consumer, consuming. */
  readonly consumer: C;
  /** `/metrics` and `/healthz`, when `METRICS_PORT` is set. */
  readonly metricsServer: MetricsServer | undefined;
  /** The janitor and the key statistics (one process at a time runs each), unless both are off. */
  readonly maintenance: Maintenance | undefined;
  /** Closes the consumer gracefully, then stops maintenance, the metrics server and the pools. */
  stop(): Promise<void>;
}

/**
 * Starts a broker consumer with the BullMQ worker process's tools, from the same environment:
 * its events counted in the worker metrics, `/metrics` and `/healthz` on `METRICS_PORT` (checks
 * `postgres`, `broker`, `consumer`), and maintenance on the session pool (`JANITOR_*`,
 * `STATS_INTERVAL_MS`, the statistics only where metrics are served). The metrics server starts
 * before the consumer, so that `/healthz` answers (503) while the consumer still waits for its
 * broker, and a port in use fails the start before a message is taken; maintenance starts once
 * the consumer consumes, as the worker process starts it once it is ready. `create` builds the
 * consumer (and whatever the broker needs first); a failed start, there or later, closes
 * everything opened, the key store's pools included, and rethrows.
 *
 * The sweeper never runs here, whatever `SWEEPER_ENABLED` says. It looks a lost key's job up in
 * BullMQ (Redis) and re-enqueues or abandons it; a broker consumer's keys have no BullMQ job,
 * so every one would look lost, and a re-enqueue would put the message into a BullMQ queue of
 * the same name. Nor is there anything for it to do: the broker itself redelivers a message
 * whose consumer died (RabbitMQ when the channel closes, JetStream after `AckWait`), and the
 * redelivered copy takes the key over once its lease has ended. A key left `processing` with
 * no message to come back for it (a queue purged by hand) shows in the key statistics
 * (`idempotent_jobs_keys_past_sweep_horizon`); `idempotent-jobs keys release` frees it.
 */
export async function operateConsumer<C extends OperatedConsumer>(
  config: EnvConfig,
  store: KeyStoreFromEnv,
  create: () => Promise<C>,
  options: ConsumerOperationsOptions<C>,
): Promise<OperatedConsumerProcess<C>> {
  let consumer: C;
  try {
    consumer = await create();
  } catch (error) {
    await closeWithin(CLOSE_AFTER_FAILED_START_MS, store.destroy());
    throw error;
  }
  const uninstrument = instrumentWorker(consumer, options.queueLabel);
  let maintenance: ReturnType<typeof createMaintenanceFromConfig> | undefined;
  let metricsServer: MetricsServer | undefined;
  try {
    // Key statistics feed only the gauges, so they are refreshed only where metrics are served.
    maintenance = createMaintenanceFromConfig(config, store.sessionDb, options.logger, { stats: config.METRICS_PORT !== undefined, sweeper: false });
    metricsServer =
      config.METRICS_PORT === undefined
        ? undefined
        : await startMetricsServer({
            port: config.METRICS_PORT,
            component: options.component,
            checks: {
              postgres: () => new PostgresOperatorStore(store.db, config.SCHEMA).ping(),
              broker: () => {
                if (!consumer.isConsuming) throw new Error(options.notConsuming);
              },
              consumer: () => {
                if (!consumer.isRunning) throw new Error('the consumer is not running (closing or closed)');
              },
            },
          });
    await options.start(consumer);
    maintenance?.maintenance.start();
  } catch (error) {
    uninstrument();
    await closeWithin(CLOSE_AFTER_FAILED_START_MS, consumer.close({ force: true }), maintenance?.stop(), metricsServer?.close(), store.destroy());
    throw error;
  }
  let stopped: Promise<void> | undefined;
  return {
    consumer,
    metricsServer,
    maintenance: maintenance?.maintenance,
    stop: () =>
      (stopped ??= (async () => {
        await consumer.close();
        await maintenance?.stop();
        await metricsServer?.close();
        uninstrument();
        await store.destroy();
      })()),
  };
}
