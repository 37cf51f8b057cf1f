import type { Kysely } from 'kysely';
import { pino, type Logger } from 'pino';
import { BullmqJobLookup } from '../bullmq/job-lookup.js';
import { queueConnectionFromEnv } from './queue-connection-from-env.js';
import { directDatabaseUrl, type EnvConfig } from './env-config.js';
import { parseQueueActions, parseQueueRetryPolicies, type RetryPolicy } from '../ops/maintenance-options.js';
import { instrumentMaintenance } from '../metrics/maintenance-metrics.js';
import { startMetricsServer, type HealthCheck, type MetricsServer } from '../metrics/metrics-server.js';
import { onShutdownSignals } from './shutdown-signals.js';
import { createPostgresDb } from '../store/create-postgres-db.js';
import { migrateSchema } from '../store/migrate.js';
import { waitForWritableStore } from './writable-store.js';
import { PostgresOperatorStore } from '../store/operator-store.js';
import { Janitor } from '../ops/janitor.js';
import { Maintenance } from '../ops/maintenance.js';
import { Sweeper } from '../ops/sweeper.js';
import { Scheduler, type TickEnqueuer } from '../ops/scheduler.js';
import { instrumentScheduler } from '../metrics/scheduler-metrics.js';
import { BullmqTickEnqueuer, type BullmqTickEnqueuerOptions } from '../bullmq/tick-enqueuer.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** Maintenance built from the environment, with what it opened. */
export interface ConfiguredMaintenance {
  /** The tasks, built and instrumented; not started. */
  readonly maintenance: Maintenance;
  /** Stops the tasks, then closes the sweeper's BullMQ connections. Does not close `db`. */
  stop(): Promise<void>;
}

/**
 * The retry policies of the queues' jobs, by queue: `QUEUE`'s from `JOB_ATTEMPTS`,
 * `JOB_BACKOFF_MS`, `JOB_BACKOFF_TYPE`, the other queues' from `JOB_RETRY_POLICIES`. Producers
 * set attempts and backoff per job, so the worker cannot read them from BullMQ; the environment
 * states them once for the janitor's retention check, re-enqueued jobs and schedules' ticks.
 */
export function retryPolicyFromConfig(config: EnvConfig): Record<string, RetryPolicy> {
  return {
    ...parseQueueRetryPolicies(config.JOB_RETRY_POLICIES),
    [config.QUEUE]: {
      attempts: config.JOB_ATTEMPTS,
      ...(config.JOB_BACKOFF_MS > 0 ? { backoff: { type: config.JOB_BACKOFF_TYPE, delayMs: config.JOB_BACKOFF_MS } } : {}),
    },
  };
}

/**
 * The queues the sweeper covers: `SWEEPER_QUEUES` (names, or `*` for all), else `QUEUE` —
 * the one queue this process knows lives under `REDIS_URL` and `REDIS_PREFIX`.
 */
export function sweeperQueuesFromConfig(config: EnvConfig): readonly string[] | '*' {
  const text = config.SWEEPER_QUEUES?.trim();
  if (!text) return [config.QUEUE];
  if (text === '*') return '*';
  return text.split(',').map((q) => q.trim()).filter(Boolean);
}

/**
 * Builds the janitor, the sweeper and the statistics refresh as the environment says
 * (`JANITOR_*`, `SWEEPER_*`, `SWEEP_AFTER_MS`, `STATS_INTERVAL_MS`, `RETENTION_MS`, `JOB_*`),
 * instrumented for metrics. `stats: false` or `sweeper: false` turns that task off whatever the
 * environment says. Returns undefined when everything is turned off. Not started.
 */
export function createMaintenanceFromConfig(
  config: EnvConfig,
  db: Kysely<any>,
  logger: Logger,
  options: { readonly stats?: boolean; readonly sweeper?: boolean } = {},
): ConfiguredMaintenance | undefined {
  const statsIntervalMs = options.stats === false ? 0 : config.STATS_INTERVAL_MS;
  const sweeperEnabled = options.sweeper !== false && config.SWEEPER_ENABLED;
  if (!config.JANITOR_ENABLED && !sweeperEnabled && statsIntervalMs === 0) return undefined;
  const retryPolicies = retryPolicyFromConfig(config);
  const janitor = config.JANITOR_ENABLED
    ? new Janitor({ db, schema: config.SCHEMA, batchSize: config.JANITOR_BATCH_SIZE, retentionMs: config.RETENTION_MS, tombstoneMs: config.TOMBSTONE_MS, retryPolicies, logger })
    : undefined;
  const queues = sweeperEnabled ? queueConnectionFromEnv(config) : undefined;
  const jobs = queues ? new BullmqJobLookup(queues) : undefined;
  const sweeper = jobs
    ? new Sweeper({
        db,
        schema: config.SCHEMA,
        jobs,
        sweepAfterMs: config.SWEEP_AFTER_MS,
        action: config.SWEEPER_ACTION,
        queueActions: parseQueueActions(config.SWEEPER_QUEUE_ACTIONS),
        queues: sweeperQueuesFromConfig(config),
        retentionMs: config.RETENTION_MS,
        retryPolicies,
        logger,
      })
    : undefined;
  const maintenance = new Maintenance({
    db,
    schema: config.SCHEMA,
    janitor,
    sweeper,
    janitorIntervalMs: config.JANITOR_INTERVAL_MS,
    sweeperIntervalMs: config.SWEEPER_INTERVAL_MS,
    statsIntervalMs,
    sweepAfterMs: config.SWEEP_AFTER_MS,
    logger,
  });
  const sweeperQueues = sweeperQueuesFromConfig(config);
  const uninstrument = instrumentMaintenance(maintenance, config.SCHEMA, {
    sweeperQueues: sweeper && sweeperQueues !== '*' ? sweeperQueues : [],
  });
  return {
    maintenance,
    async stop() {
      await maintenance.stop();
      uninstrument();
      await jobs?.close();
      await queues?.close();
    },
  };
}

/** The scheduler built from the environment, with what it opened. */
export interface ConfiguredScheduler {
  /** The scheduler; not started. */
  readonly scheduler: Scheduler;
  /** Stops the scheduler, then closes its queue connections. Does not close `db`. */
  stop(): Promise<void>;
}

/**
 * Builds the scheduler as the environment says (`SCHEDULER_ENABLED`, `SCHEDULER_INTERVAL_MS`),
 * adding tick jobs to the queue backend of `REDIS_URL`/`REDIS_PREFIX` (or `QUEUE_BACKEND=postgres`),
 * each schedule's ticks with its queue's retry policy ({@link retryPolicyFromConfig}); a queue
 * without one gets BullMQ's defaults, with a warning at its first tick. Undefined when turned
 * off. Not started.
 */
export function createSchedulerFromConfig(config: EnvConfig, db: Kysely<any>, logger: Logger): ConfiguredScheduler | undefined {
  if (!config.SCHEDULER_ENABLED) return undefined;
  const policies = retryPolicyFromConfig(config);
  const queues = queueConnectionFromEnv(config);
  const enqueuer = new BullmqTickEnqueuer({
    backend: queues.backend,
    connection: queues.connection,
    prefix: queues.prefix,
    queueJobOptions: Object.fromEntries(Object.entries(policies).map(([queue, policy]) => [queue, jobOptionsOf(policy)])),
  });
  const scheduler = new Scheduler({
    db,
    schema: config.SCHEMA,
    enqueuer: warningOfQueuesWithoutPolicy(enqueuer, policies, logger),
    intervalMs: config.SCHEDULER_INTERVAL_MS,
    logger,
  });
  const uninstrument = instrumentScheduler(scheduler, config.SCHEMA);
  return {
    scheduler,
    async stop() {
      uninstrument();
      await scheduler.stop();
      await enqueuer.close();
      await queues.close();
    },
  };
}

/** BullMQ's `attempts` and `backoff` of a retry policy. */
function jobOptionsOf(policy: RetryPolicy): NonNullable<BullmqTickEnqueuerOptions['defaultJobOptions']> {
  return {
    attempts: policy.attempts ?? 1,
    ...(policy.backoff ? { backoff: { type: policy.backoff.type, delay: policy.backoff.delayMs } } : {}),
  };
}

/** The enqueuer, saying once per queue that its ticks get BullMQ's defaults because no retry policy names it. */
function warningOfQueuesWithoutPolicy(enqueuer: TickEnqueuer, policies: Readonly<Record<string, RetryPolicy>>, logger: Logger): TickEnqueuer {
  const warned = new Set<string>();
  return {
    enqueue(tick) {
      if (!Object.hasOwn(policies, tick.queue) && !warned.has(tick.queue)) {
        warned.add(tick.queue);
        logger.warn(
          { queue: tick.queue, schedule: tick.schedule },
          'no retry policy is configured for this queue (QUEUE with JOB_ATTEMPTS and JOB_BACKOFF_*, or JOB_RETRY_POLICIES): its schedules\' ticks get BullMQ\'s defaults, one attempt',
        );
      }
      return enqueuer.enqueue(tick);
    },
  };
}

/** What {@link startMaintenanceProcess} needs. */
export interface MaintenanceProcessOptions {
  /** The validated environment ({@link loadEnvConfig}). */
  readonly config: EnvConfig;
  /** Structured logger. @defaultValue `pino()` at `LOG_LEVEL` */
  readonly logger?: Logger;
  /** Install SIGTERM/SIGINT handlers that stop and exit. @defaultValue `true` */
  readonly handleSignals?: boolean;
}

/** A running standalone maintenance process. */
export interface MaintenanceProcess {
  /** The running tasks; undefined when the environment turned every one off. */
  readonly maintenance: Maintenance | undefined;
  /** The running scheduler; undefined with `SCHEDULER_ENABLED=false`. */
  readonly scheduler: Scheduler | undefined;
  /** `/metrics` and `/healthz`; undefined without `METRICS_PORT`. */
  readonly metricsServer: MetricsServer | undefined;
  /** The process's logger. */
  readonly logger: Logger;
  /** Stops the tasks (waiting for runs in progress), the metrics server and the pool. */
  stop(): Promise<void>;
}

/**
 * The standalone janitor + sweeper + scheduler process (`workers/janitor.ts`): for deployments that turn
 * maintenance off in workers (`JANITOR_ENABLED=false SWEEPER_ENABLED=false`) or want it on a
 * direct Postgres connection. Uses the same advisory locks as workers, so running both is safe.
 * Its one pool connects to `DATABASE_DIRECT_URL` when set (the locks need a session), else
 * `DATABASE_URL`; a standby or a read-only database there is refused (`ReadOnlyStoreError`).
 * Serves `/metrics` and `/healthz` on `METRICS_PORT` when set.
 */
export async function startMaintenanceProcess(options: MaintenanceProcessOptions): Promise<MaintenanceProcess> {
  refuseUnknownOptions(options, optionNames<MaintenanceProcessOptions>()(['config', 'logger', 'handleSignals']), 'startMaintenanceProcess(options)');
  const { config } = options;
  const logger = options.logger ?? pino({ level: config.LOG_LEVEL });
  const db = createPostgresDb(
    { connectionString: directDatabaseUrl(config), maxConnections: config.PG_POOL_SIZE ?? 4, applicationName: 'idempotent-jobs:maintenance' },
    (error) => logger.warn({ err: error }, 'idle Postgres connection failed; the pool replaces it'),
  );
  try {
    // The janitor deletes and the sweeper releases: on a standby neither could do anything.
    const variable = directDatabaseUrl(config) === config.DATABASE_URL ? 'DATABASE_URL' : 'DATABASE_DIRECT_URL';
    await waitForWritableStore(db, { variable, url: directDatabaseUrl(config) }, logger, Date.now() + config.STARTUP_WAIT_MS);
    if (config.MIGRATE) await migrateSchema(db, { schema: config.SCHEMA, keysPartitions: config.KEYS_PARTITIONS });
  } catch (error) {
    await db.destroy();
    throw error;
  }
  const configured = createMaintenanceFromConfig(config, db, logger, { stats: config.METRICS_PORT !== undefined });
  configured?.maintenance.start();
  const scheduling = createSchedulerFromConfig(config, db, logger);
  scheduling?.scheduler.start();
  // Maintenance's timers are unref'd (a library must not keep its host alive), and between runs
  // this process may hold no other handle: the pool closes idle connections, a Postgres outage
  // closes them all, and Node would then exit with status 0. This process exists to run
  // maintenance, so it stays up until it is stopped.
  const keepAlive = setInterval(() => {}, 2 ** 31 - 1);
  const checks: Record<string, HealthCheck> = { postgres: () => new PostgresOperatorStore(db, config.SCHEMA).ping() };
  const metricsServer = config.METRICS_PORT !== undefined ? await startMetricsServer({ port: config.METRICS_PORT, component: 'maintenance', checks }) : undefined;
  logger.info(
    { janitor: config.JANITOR_ENABLED, sweeper: config.SWEEPER_ENABLED, scheduler: config.SCHEDULER_ENABLED, metricsPort: metricsServer?.port },
    'maintenance ready',
  );
  let stopped: Promise<void> | undefined;
  const stop = () =>
    (stopped ??= (async () => {
      clearInterval(keepAlive);
      await scheduling?.stop();
      await configured?.stop();
      await metricsServer?.close();
      await db.destroy();
    })());
  if (options.handleSignals ?? true) onShutdownSignals(logger, stop);
  return { maintenance: configured?.maintenance, scheduler: scheduling?.scheduler, metricsServer, logger, stop };
}
