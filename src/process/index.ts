/**
 * `idempotent-jobs/process`: what a runnable process is built from. The environment read and
 * validated (`loadEnvConfig`), the worker, HTTP server, maintenance and outbox relay processes
 * started from it, maintenance to embed (janitor, sweeper), `/metrics` and `/healthz`, signal
 * handling and start-up failures that exit with a message. The main entry point is the library; this one is for processes of your own
 * that run as `npx idempotent-jobs` does. Loads with none of the optional peer dependencies.
 *
 * @packageDocumentation
 * @module idempotent-jobs/process
 */
export { runMain, startupFailureExitCode } from '../runtime/run-main.js';
export type { EnvConfig } from '../runtime/env-config.js';
export { directDatabaseUrl, groupCommitFromEnv, loadEnvConfig, redisSettingsFromEnv } from '../runtime/env-config.js';
export type { HttpEnvConfig } from '../runtime/http-env-config.js';
export { loadHttpEnvConfig, parseAdminTokens, parseTokens } from '../runtime/http-env-config.js';
export { loadHandlerModule } from '../runtime/handler-module.js';
export { onShutdownSignals } from '../runtime/shutdown-signals.js';
export { servicesAnswer, unansweredServices, type ServicesAnswer } from '../runtime/services-answer.js';
export { queueConnectionFromEnv, type QueueConnectionFromEnv } from '../runtime/queue-connection-from-env.js';
export type { WorkerProcess, WorkerProcessOptions } from '../runtime/worker-process.js';
export { startWorkerProcess } from '../runtime/worker-process.js';
export type { HttpServerProcess, HttpServerProcessOptions } from '../runtime/http-server-process.js';
export { startHttpServerProcess } from '../runtime/http-server-process.js';
export type { ConfiguredMaintenance, ConfiguredScheduler, MaintenanceProcess, MaintenanceProcessOptions } from '../runtime/maintenance-process.js';
export { createMaintenanceFromConfig, createSchedulerFromConfig, retryPolicyFromConfig, startMaintenanceProcess, sweeperQueuesFromConfig } from '../runtime/maintenance-process.js';
export type {
  JanitorOptions,
  MaintenanceIntervals,
  ResolvedJanitorOptions,
  ResolvedSweeperOptions,
  RetryPolicy,
  SweeperAction,
  SweeperOptions,
} from '../ops/maintenance-options.js';
export { parseQueueActions } from '../ops/maintenance-options.js';
export type { JanitorReport, RetentionWarning } from '../ops/janitor.js';
export { Janitor } from '../ops/janitor.js';
export type { SweepRecovery, SweepReport } from '../ops/sweeper.js';
export { Sweeper } from '../ops/sweeper.js';
export type { MaintenanceEvents, MaintenanceOptions } from '../ops/maintenance.js';
export { Maintenance } from '../ops/maintenance.js';
export type { ScheduledTick, ScheduleRoundReport, SchedulerEvents, SchedulerOptions, SchedulerReport, TickEnqueuer } from '../ops/scheduler.js';
export { Scheduler } from '../ops/scheduler.js';
export type { BullmqTickEnqueuerOptions, TickJob } from '../bullmq/tick-enqueuer.js';
export { BullmqTickEnqueuer } from '../bullmq/tick-enqueuer.js';
export type { LockedRun, MaintenanceTask } from '../store/maintenance-lock.js';
export type { KeyStats } from '../store/records.js';
export type { JobLookup, JobPresence } from '../ops/job-lookup.js';
export type { BullmqJobLookupOptions, ReenqueueRequest } from '../bullmq/job-lookup.js';
export { BullmqJobLookup } from '../bullmq/job-lookup.js';
export type { ReconcileReport, VanishedKey, VanishedKeyReconcilerOptions } from '../bullmq/vanished-key-reconciler.js';
export { VanishedKeyReconciler } from '../bullmq/vanished-key-reconciler.js';
export type { OutboxRelayProcess, OutboxRelayProcessOptions } from '../runtime/relay-process.js';
export { startOutboxRelayProcess } from '../runtime/relay-process.js';
export type { RedisConnection, RedisConnectionSettings } from '../bullmq/redis-connection.js';
export { openRedisConnection } from '../bullmq/redis-connection.js';
export type { ClusterNode } from '../bullmq/redis-cluster.js';
export { assertClusterHashTag, hashTagOf, parseClusterNodes } from '../bullmq/redis-cluster.js';
export type { HealthCheck, HealthReport, MetricsServer, MetricsServerOptions } from '../metrics/metrics-server.js';
export { runHealthChecks, startMetricsServer } from '../metrics/metrics-server.js';
export { instrumentWorker } from '../metrics/worker-metrics.js';
export { instrumentMaintenance, type InstrumentMaintenanceOptions } from '../metrics/maintenance-metrics.js';
export { instrumentScheduler, MAX_SCHEDULE_LABELS, OTHER_SCHEDULE } from '../metrics/scheduler-metrics.js';
export { METRIC_PREFIX } from '../metric-registry.js';
export type { FaultHook, FaultPoint } from '../fault-hook.js';
