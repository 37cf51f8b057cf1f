import { pino, type Logger } from 'pino';
import { directDatabaseUrl, type EnvConfig } from '../config/env-config.js';
import type { FaultHook } from '../fault-hook.js';
import { createIdempotentWorker, type IdempotentWorker, type JobHandler } from '../bullmq/idempotent-worker.js';
import { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { createPostgresDb } from '../store/create-postgres-db.js';
import { KeySettledListener } from '../store/key-settled-listener.js';
import { migrate } from '../store/migrate.js';
import { startMetricsServer, type MetricsServer } from '../metrics/metrics-server.js';
import { instrumentWorker } from '../metrics/worker-metrics.js';
import { pingBullWorker } from '../bullmq/job-lookup.js';
import { openRedisConnection } from '../bullmq/redis-connection.js';
import type { Maintenance } from '../ops/maintenance.js';
import { createMaintenanceFromConfig } from '../ops/maintenance-process.js';
import { pingDatabase } from '../store/sql/ping.js';
import { onShutdownSignals } from './shutdown-signals.js';
import { NotReadyYetError, readyWithin, waitForStore } from './wait-for-store.js';
import { isTransientStoreError } from '../store/pg-errors.js';

/** What {@link startWorkerProcess} needs besides the environment. */
export interface WorkerProcessOptions<P, R> {
  /** The validated environment ({@link loadEnvConfig}). */
  readonly config: EnvConfig;
  /** The job handler (see {@link IdempotentWorkerOptions.handler}). */
  readonly handler: JobHandler<P, R>;
  /** Overrides `FAST_PATH`. @defaultValue `config.FAST_PATH` */
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
 * down at start (refused, starting up, …) is waited for, with a warning per try, for at most
 * STARTUP_WAIT_MS; then it rejects with a `StoreUnreachableAtStartError` having closed what
 * it opened. Other errors (a wrong password, a missing database) reject at once.
 */
export async function startWorkerProcess<P, R>(options: WorkerProcessOptions<P, R>): Promise<WorkerProcess<P, R>> {
  const { config } = options;
  const logger = options.logger ?? pino({ level: config.LOG_LEVEL });
  const applicationName = `idempotent-jobs:worker:${config.QUEUE}`;
  const onPoolError = (error: Error) => logger.warn({ err: error }, 'idle Postgres connection failed; the pool replaces it');
  const db = createPostgresDb({ connectionString: config.DATABASE_URL, maxConnections: config.PG_POOL_SIZE ?? config.CONCURRENCY + 2, applicationName }, onPoolError);
  // Migrations and maintenance hold session advisory locks: behind a transaction-mode pooler
  // they need Postgres itself (DATABASE_DIRECT_URL). A small pool whose idle connections close
  // after node-postgres's 10 s: between maintenance runs it holds none.
  const directUrl = directDatabaseUrl(config);
  const sessionDb =
    directUrl === config.DATABASE_URL ? db : createPostgresDb({ connectionString: directUrl, maxConnections: SESSION_POOL_SIZE, applicationName }, onPoolError);
  const destroyPools = () => Promise.all([db.destroy(), sessionDb === db ? undefined : sessionDb.destroy()]);
  const startupDeadline = Date.now() + config.STARTUP_WAIT_MS;
  try {
    // Without migrations a ping stands in for them: the worker is not "ready" before Postgres is.
    await waitForStore<unknown>(
      () => (config.MIGRATE ? migrate(sessionDb, { schema: config.SCHEMA, keysPartitions: config.KEYS_PARTITIONS }) : Promise.all([pingDatabase(db), sessionDb === db ? undefined : pingDatabase(sessionDb)])),
      { what: `Postgres (${config.MIGRATE ? 'migrations' : 'first connection'})`, deadline: startupDeadline, logger },
    );
  } catch (error) {
    await closeWithin(CLOSE_AFTER_FAILED_START_MS, destroyPools());
    throw error;
  }
  const keys = new IdempotencyKeys({
    db,
    schema: config.SCHEMA,
    leaseMs: config.LEASE_MS,
    retentionMs: config.RETENTION_MS,
    groupCommit: config.GROUP_COMMIT && {
      maxJobs: config.GROUP_COMMIT_MAX_JOBS,
      maxGroups: config.GROUP_COMMIT_GROUPS,
      optimistic: config.GROUP_COMMIT_OPTIMISTIC,
    },
  });
  const listener =
    config.WAIT_MS > 0
      ? new KeySettledListener({ connectionString: directUrl, schema: config.SCHEMA, onError: (e) => logger.warn({ err: e }, 'listener error') })
      : undefined;
  // Janitor, sweeper, statistics; built before the worker so bad options stop the start early.
  // Key statistics feed only the gauges, so they are refreshed only where metrics are served.
  const maintenance = createMaintenanceFromConfig(config, sessionDb, logger, { stats: config.METRICS_PORT !== undefined });
  const redis = openRedisConnection({ url: config.REDIS_URL, clusterNodes: config.REDIS_CLUSTER_NODES });
  const worker = createIdempotentWorker<P, R>({
    queue: config.QUEUE,
    connection: redis.connection,
    prefix: config.REDIS_PREFIX,
    keys,
    handler: options.handler,
    concurrency: config.CONCURRENCY,
    leaseMs: config.LEASE_MS,
    heartbeatMs: config.HEARTBEAT_MS,
    lockDurationMs: config.LOCK_DURATION_MS,
    stalledIntervalMs: config.STALLED_INTERVAL_MS,
    deferMaxMs: config.DEFER_MAX_MS,
    waitMs: config.WAIT_MS,
    shutdownTimeoutMs: config.SHUTDOWN_TIMEOUT_MS,
    storeRetryMinMs: config.STORE_RETRY_MIN_MS,
    storeRetryMaxMs: config.STORE_RETRY_MAX_MS,
    fastPath: options.fastPath ?? config.FAST_PATH,
    storePayload: config.STORE_PAYLOAD,
    listener,
    logger,
    faultHook: options.faultHook,
  });
  const uninstrument = instrumentWorker(worker, config.QUEUE);
  try {
    await waitForRedis(worker, startupDeadline, logger);
  } catch (error) {
    uninstrument();
    await closeWithin(CLOSE_AFTER_FAILED_START_MS, worker.close({ force: true }).then(() => redis.close()), listener?.close(), maintenance?.stop(), destroyPools());
    throw error;
  }
  maintenance?.maintenance.start();
  const metricsServer =
    config.METRICS_PORT === undefined
      ? undefined
      : await startMetricsServer({
          port: config.METRICS_PORT,
          component: 'worker',
          checks: {
            postgres: () => pingDatabase(db),
            redis: () => pingBullWorker(worker.bullWorker),
            worker: () => {
              if (!worker.bullWorker.isRunning()) throw new Error('the worker is not running (closing or closed)');
            },
          },
        });
  logger.info({ pid: process.pid, queue: config.QUEUE, concurrency: config.CONCURRENCY, leaseMs: config.LEASE_MS }, 'worker ready');

  let stopped: Promise<void> | undefined;
  const stop = (stopOptions: { force?: boolean } = {}) => {
    if (stopOptions.force) return worker.close({ force: true });
    stopped ??= (async () => {
      await worker.close();
      await redis.close();
      await listener?.close();
      await maintenance?.stop();
      await metricsServer?.close();
      uninstrument();
      await destroyPools();
    })();
    return stopped;
  };
  if (options.handleSignals ?? true) onShutdownSignals(logger, stop);
  return { worker, keys, logger, stop, metricsServer, maintenance: maintenance?.maintenance };
}

/**
 * Waits for the BullMQ worker's Redis connection, which ioredis keeps retrying by itself (its
 * readiness never fails, it just does not come): each try waits a second on it and logs the
 * last connection error.
 */
async function waitForRedis(worker: IdempotentWorker<any, any>, deadline: number, logger: Logger): Promise<void> {
  let lastError: unknown;
  const remember = (error: Error) => (lastError = error);
  worker.bullWorker.on('error', remember);
  const ready = worker.waitUntilReady();
  try {
    // Each wait ends just before the deadline, so that the last try reports Redis's own error.
    const tryMs = () => Math.max(0, Math.min(1_000, deadline - Date.now() - 50));
    await waitForStore(() => readyWithin(ready, tryMs(), () => lastError), {
      what: 'Redis',
      deadline,
      logger,
      retryable: (error) => error instanceof NotReadyYetError || isTransientStoreError(error),
    });
  } finally {
    worker.bullWorker.off('error', remember);
  }
}

/**
 * Connections to Postgres itself when `DATABASE_DIRECT_URL` is set: one per maintenance task
 * (janitor, sweeper, statistics), each held for one run.
 */
const SESSION_POOL_SIZE = 3;

/** How long a start that failed waits for its connections to close before it reports the failure anyway. */
const CLOSE_AFTER_FAILED_START_MS = 2_000;

/**
 * Waits for `closings` (their errors ignored) for at most `ms`: after a failed start a
 * connection may still hang on a server that never answers, and the caller must learn why the
 * start failed rather than wait on it.
 */
async function closeWithin(ms: number, ...closings: Array<Promise<unknown> | undefined>): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    Promise.allSettled(closings),
    new Promise((resolve) => {
      timer = setTimeout(resolve, ms);
      timer.unref();
    }),
  ]);
  clearTimeout(timer);
}
