import type { Logger } from 'pino';
import type { EnvConfig } from '../config/env-config.js';
import { startMetricsServer, type HealthCheck, type MetricsServer } from '../metrics/metrics-server.js';
import type { Maintenance } from '../ops/maintenance.js';
import { createMaintenanceFromConfig } from '../ops/maintenance-process.js';
import { pingDatabase } from '../store/sql/ping.js';
import type { KeyStoreFromEnv } from './key-store-from-env.js';

/** What {@link startConsumerOperations} needs besides the environment and the key store. */
export interface ConsumerOperationsOptions {
  readonly logger: Logger;
  /** The `component` label of `idempotent_jobs_ready`, e.g. `'amqp-consumer'`. */
  readonly component: string;
  /** The broker's checks behind `/healthz`, by name (`broker`, `consumer`); `postgres` is added. */
  readonly checks: Readonly<Record<string, HealthCheck>>;
}

/** A broker consumer process's operations: `/metrics`, `/healthz` and maintenance. */
export interface ConsumerOperations {
  /** `/metrics` and `/healthz`, when `METRICS_PORT` is set. */
  readonly metricsServer: MetricsServer | undefined;
  /** The janitor and the key statistics (one process at a time runs each), unless both are off. */
  readonly maintenance: Maintenance | undefined;
  /** Starts maintenance; call it once the consumer consumes, as the worker process does once it is ready. */
  startMaintenance(): void;
  /** Stops maintenance (a run in progress finishes) and closes the metrics server. */
  stop(): Promise<void>;
}

/**
 * Gives a broker consumer process the BullMQ worker process's tools, with the same environment:
 * `/metrics` and `/healthz` on `METRICS_PORT` (checks `postgres` plus the broker's), and
 * maintenance on the session pool (`JANITOR_*`, `STATS_INTERVAL_MS`, the statistics only where
 * metrics are served). The metrics server starts now, so that `/healthz` answers (503) while
 * the consumer still waits for its broker, and a port in use fails the start before a message
 * is taken. Maintenance is built now (bad options stop the start) and started by
 * {@link ConsumerOperations.startMaintenance}.
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
export async function startConsumerOperations(config: EnvConfig, store: KeyStoreFromEnv, options: ConsumerOperationsOptions): Promise<ConsumerOperations> {
  // Key statistics feed only the gauges, so they are refreshed only where metrics are served.
  const maintenance = createMaintenanceFromConfig(config, store.sessionDb, options.logger, { stats: config.METRICS_PORT !== undefined, sweeper: false });
  let metricsServer: MetricsServer | undefined;
  try {
    metricsServer =
      config.METRICS_PORT === undefined
        ? undefined
        : await startMetricsServer({
            port: config.METRICS_PORT,
            component: options.component,
            checks: { postgres: () => pingDatabase(store.db), ...options.checks },
          });
  } catch (error) {
    await maintenance?.stop();
    throw error;
  }
  return {
    metricsServer,
    maintenance: maintenance?.maintenance,
    startMaintenance: () => maintenance?.maintenance.start(),
    async stop() {
      await maintenance?.stop();
      await metricsServer?.close();
    },
  };
}
