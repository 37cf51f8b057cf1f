import { pino, type Logger } from 'pino';
import type { EnvConfig } from './env-config.js';
import type { FaultHook } from '../fault-hook.js';
import { createIdempotentWorker, type DataLayerJobHandler, type DatabaseOnlyJobHandler, type IdempotentWorker, type JobHandler } from '../bullmq/idempotent-worker.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { KeySettledListener } from '../store/key-settled-listener.js';
import { startMetricsServer, type MetricsServer } from '../metrics/metrics-server.js';
import { instrumentWorker } from '../metrics/worker-metrics.js';
import { pingBullWorker } from '../bullmq/job-lookup.js';
import { queueConnectionFromEnv } from './queue-connection-from-env.js';
import type { Maintenance } from '../ops/maintenance.js';
import { createMaintenanceFromConfig } from './maintenance-process.js';
import { PostgresOperatorStore } from '../store/operator-store.js';
import { CLOSE_AFTER_FAILED_START_MS, closeWithin } from './close-within.js';
import { openKeyStoreFromEnv, runnerSettingsFromEnv } from './key-store-from-env.js';
import { onShutdownSignals } from './shutdown-signals.js';
import { NotReadyYetError, readyWithin, waitForStore } from './wait-for-store.js';
import { StoreWriteHealth } from './store-write-health.js';
import type { WorkerEvent } from '../consumer/worker-event.js';
import { isTransientStoreError } from '../store/pg-errors.js';
import type { DataLayer } from '../store/data-layer.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** What {@link startWorkerProcess} needs besides the environment. */
export interface WorkerProcessOptions<P, R> {
  /** The validated environment ({@link loadEnvConfig}). */
  readonly config: EnvConfig;
  /** A function, or a database-only handler (`{ transaction }`: fast path and group commit unless `FAST_PATH` / `GROUP_COMMIT` are false). */
  readonly handler: JobHandler<P, R> | DatabaseOnlyJobHandler<P, R> | DataLayerJobHandler<P, R>;
  /**
   * The data layers the handler writes in (`ctx.transaction(dataLayer, fn)`), checked at start
   * (see `IdempotentWorkerOptions.dataLayers`): one on another database than the keys stops the
   * start with `DataLayerElsewhereError`. @defaultValue none
   */
  readonly dataLayers?: readonly DataLayer<any>[];
  /** Overrides `FAST_PATH`. @defaultValue `config.FAST_PATH` (unset: by the handler's kind) */
  readonly fastPath?: boolean;
  /** Structured logger. @defaultValue `pino()` at `LOG_LEVEL` */
  readonly logger?: Logger;
  /** Chaos testing only. @defaultValue unset */
  readonly faultHook?: FaultHook;
  /** Install SIGTERM/SIGINT handlers that close gracefully and exit. @defaultValue `true` */
  readonly handleSignals?: boolean;
}

/** A running worker process's parts. */
export interface WorkerProcess<P, R> {
  /** The BullMQ worker, taking jobs. */
  readonly worker: IdempotentWorker<P, R>;
  /** The claim protocol, over the process's Postgres pool. */
  readonly keys: IdempotencyKeys;
  /** The process's logger. */
  readonly logger: Logger;
  /** `/metrics` and `/healthz`, when `METRICS_PORT` is set. */
  readonly metricsServer?: MetricsServer;
  /** Janitor, sweeper and key statistics (one process at a time runs each), unless all turned off. */
  readonly maintenance?: Maintenance;
  /** Graceful stop (force: release unfinished jobs' keys at once), then close every connection. */
  stop(options?: { force?: boolean }): Promise<void>;
}

/**
 * Builds and starts a worker process from validated configuration: the Postgres pool,
 * migrations, the claim protocol, the BullMQ worker, and signal handling (first SIGTERM or
 * SIGINT: graceful shutdown within SHUTDOWN_TIMEOUT_MS; second: force). Postgres or Redis
 * down at start (refused, starting up, …) is waited for, with a warning line per try, for at most
 * STARTUP_WAIT_MS; then it rejects with a `StoreUnreachableAtStartError` having closed what
 * it opened. Other errors (a wrong password, a missing database) reject at once.
 */
export async function startWorkerProcess<P, R>(options: WorkerProcessOptions<P, R>): Promise<WorkerProcess<P, R>> {
  refuseUnknownOptions(options, optionNames<WorkerProcessOptions<unknown, unknown>>()(['config', 'handler', 'dataLayers', 'fastPath', 'logger', 'faultHook', 'handleSignals']), 'startWorkerProcess(options)');
  const { config } = options;
  const logger = options.logger ?? pino({ level: config.LOG_LEVEL });
  const startupDeadline = Date.now() + config.STARTUP_WAIT_MS;
  const store = await openKeyStoreFromEnv(config, {
    logger,
    applicationName: `idempotent-jobs:worker:${config.QUEUE}`,
    concurrency: config.CONCURRENCY,
    startupDeadline,
  });
  const { keys, db, sessionDb } = store;
  // Wakes duplicates waiting for their key (WAIT_MS) and jobs waiting for a concurrency slot. It
  // connects at its first use: a worker whose jobs neither wait nor meet a limit opens nothing.
  const listener = new KeySettledListener({ connectionString: store.directUrl, schema: config.SCHEMA, onError: (e) => logger.warn({ err: e }, 'listener error') });
  // Janitor, sweeper, statistics; built before the worker so bad options stop the start early.
  // Key statistics feed only the gauges, so they are refreshed only where metrics are served.
  const maintenance = createMaintenanceFromConfig(config, sessionDb, logger, { stats: config.METRICS_PORT !== undefined });
  const queues = queueConnectionFromEnv(config);
  const worker = createIdempotentWorker<P, R>({
    queue: config.QUEUE,
    backend: queues.backend,
    connection: queues.connection,
    prefix: queues.prefix,
    keys,
    handler: options.handler,
    ...(options.dataLayers ? { dataLayers: options.dataLayers } : {}),
    concurrency: config.CONCURRENCY,
    ...runnerSettingsFromEnv(config, { fastPath: options.fastPath }),
    lockDurationMs: config.LOCK_DURATION_MS,
    stalledIntervalMs: config.STALLED_INTERVAL_MS,
    waitMs: config.WAIT_MS,
    listener,
    logger,
    faultHook: options.faultHook,
    // The process waits for its queue itself (waitForQueue, below), against the start's one deadline.
    startupWaitMs: Infinity,
  });
  const uninstrument = instrumentWorker(worker, config.QUEUE);
  try {
    await waitForQueue(worker, queues.label, startupDeadline, logger);
  } catch (error) {
    uninstrument();
    await closeWithin(CLOSE_AFTER_FAILED_START_MS, worker.close({ force: true }).then(() => queues.close()), listener.close(), maintenance?.stop(), store.destroy());
    throw error;
  }
  maintenance?.maintenance.start();
  const writeHealth = new StoreWriteHealth();
  if (config.METRICS_PORT !== undefined) worker.on('event', (event: WorkerEvent) => writeHealth.observe(event));
  const metricsServer =
    config.METRICS_PORT === undefined
      ? undefined
      : await startMetricsServer({
          port: config.METRICS_PORT,
          component: 'worker',
          checks: {
            postgres: () => new PostgresOperatorStore(db, config.SCHEMA).ping(),
            // Reads can work while writes fail (a full disk, a demoted primary): say so.
            'postgres-writes': () => writeHealth.check(),
            [queues.backend === 'postgres' ? 'queue' : 'redis']: () => pingBullWorker(worker.bullWorker),
            worker: () => {
              if (!worker.bullWorker.isRunning()) throw new Error('the worker is not running (closing or closed)');
            },
          },
        });
  // pino's own fields carry the pid; the metrics port is the one bound (METRICS_PORT=0 picks a free one).
  logger.info({ queue: config.QUEUE, queueBackend: queues.backend, concurrency: config.CONCURRENCY, leaseMs: config.LEASE_MS, metricsPort: metricsServer?.port }, 'worker ready');

  let stopped: Promise<void> | undefined;
  const stop = (stopOptions: { force?: boolean } = {}) => {
    if (stopOptions.force) return worker.close({ force: true });
    stopped ??= (async () => {
      await worker.close();
      await queues.close();
      await listener.close();
      await maintenance?.stop();
      await metricsServer?.close();
      uninstrument();
      await store.destroy();
    })();
    return stopped;
  };
  if (options.handleSignals ?? true) onShutdownSignals(logger, stop);
  return { worker, keys, logger, stop, metricsServer, maintenance: maintenance?.maintenance };
}

/**
 * Waits for the BullMQ worker's queue connection. On Redis, ioredis keeps retrying by itself (its
 * readiness never fails, it just does not come); on Postgres, BullMQ's readiness (connection and
 * migrations) is retried the same way: each try waits a second on it. The worker
 * itself logs a warning line per failed reconnect (WorkerErrorLog), so the wait logs none of
 * its own: one line per try, not two; its last error ends the start if Redis never answers.
 */
async function waitForQueue(worker: IdempotentWorker<any, any>, what: string, deadline: number, logger: Logger): Promise<void> {
  let lastError: unknown;
  const remember = (error: Error) => (lastError = error);
  worker.bullWorker.on('error', remember);
  const ready = worker.waitUntilReady();
  try {
    // Each wait ends just before the deadline, so that the last try reports Redis's own error.
    const tryMs = () => Math.max(0, Math.min(1_000, deadline - Date.now() - 50));
    await waitForStore(() => readyWithin(ready, tryMs(), () => lastError), {
      what,
      deadline,
      logger: logger.child({}, { level: 'silent' }),
      retryable: (error) => error instanceof NotReadyYetError || isTransientStoreError(error),
    });
  } finally {
    worker.bullWorker.off('error', remember);
  }
}
