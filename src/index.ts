/**
 * idempotent-jobs: exactly-once effects for BullMQ jobs. Keys are claimed in Postgres under a
 * fenced lease; the effect and the key's completion commit in one transaction.
 *
 * @packageDocumentation
 * @module idempotent-jobs
 */
export * from './errors.js';
export type { Fingerprinter } from './fingerprint.js';
export { sha256Fingerprint } from './fingerprint.js';
export type { GroupedEffects, IdempotencyGroupCommitOptions, IdempotencyOptions, ResolvedIdempotencyOptions } from './config/idempotency-options.js';
export { resolveIdempotencyOptions } from './config/idempotency-options.js';
export type { Claim, ClaimOutcome, HeldClaim } from './store/claim-outcome.js';
export { isHeld } from './store/claim-outcome.js';
export type { KeyRecord, KeyStatus } from './store/key-record.js';
export type { KeyStore, ClaimInput, GroupStatements, NewKeyClaims, StepStore } from './store/key-store.js';
export type { CompletedKeyRow } from './store/sql/insert-completed-keys.js';
export type { LeaseExtension } from './store/sql/extend.js';
export type { GroupCommitOptions } from './protocol/group-commit.js';
export type { PostgresKeyStoreOptions } from './store/postgres-key-store.js';
export { PostgresKeyStore } from './store/postgres-key-store.js';
export type { MigrateOptions } from './store/migrate.js';
export { migrate } from './store/migrate.js';
export type {
  ClaimOptions,
  Effect,
  EffectFailureAction,
  EffectOptions,
  ExecuteOnceOptions,
  ExecuteOnceOutcome,
  RunEffectOptions,
} from './protocol/idempotency-keys.js';
export { IdempotencyKeys } from './protocol/idempotency-keys.js';
export type { DatabaseStep, ExternalStep, ExternalStepContext, JobStepsOptions, StepContext, StepOutcome, StepReport } from './protocol/job-steps.js';
export type { LeadingStatements, LeadState } from './store/one-trip-commit.js';
export { JobSteps, stepKeyFor, stepResultBytes } from './protocol/job-steps.js';
export type { StepRecord } from './store/sql/load-steps.js';
export type { StepPlace } from './store/sql/start-step.js';
export type { FailedStep, StoredError } from './protocol/validate.js';
export { DEFAULT_SCOPE, MAX_KEY_LENGTH, toStoredError } from './protocol/validate.js';
export type { PostgresDbOptions } from './store/create-postgres-db.js';
export { createPostgresDb } from './store/create-postgres-db.js';
export type { FaultHook, FaultPoint } from './fault-hook.js';
export type { WorkerTimingOptions, ResolvedWorkerTiming } from './config/worker-timing.js';
export { resolveWorkerTiming } from './config/worker-timing.js';
export { KeySettledListener } from './store/key-settled-listener.js';
export type { JobIdentity, JobLike, WireJobData } from './bullmq/job-identity.js';
export { identityFromWireContract, jobIdFor, toWireJobData } from './bullmq/job-identity.js';
export type { StepEventKind, WorkerEvent, WorkerEventKind } from './consumer/worker-event.js';
export type { Delivery, ErrorDisposition, KeyedJobContext, KeyedJobRunnerOptions, RunOutcome } from './consumer/keyed-job-runner.js';
export { KeyedJobRunner, defaultErrorDisposition } from './consumer/keyed-job-runner.js';
export type { DatabaseOnlyContext, DatabaseOnlyHandler, KeyedJobHandler } from './consumer/database-only-handler.js';
export { databaseOnly, isDatabaseOnlyHandler } from './consumer/database-only-handler.js';
export type { DatabaseOnlyJobContext, DatabaseOnlyJobHandler, IdempotentWorkerOptions, JobContext, JobHandler } from './bullmq/idempotent-worker.js';
export { IdempotentWorker, createIdempotentWorker } from './bullmq/idempotent-worker.js';
export type { EnqueueRequest, EnqueueResult, IdempotentProducerOptions } from './bullmq/idempotent-producer.js';
export { IdempotentProducer } from './bullmq/idempotent-producer.js';
export type { OutboxRelayOptions } from './bullmq/outbox-relay.js';
export { OutboxRelay } from './bullmq/outbox-relay.js';
export type { EnvConfig } from './config/env-config.js';
export { directDatabaseUrl, groupCommitFromEnv, loadEnvConfig } from './config/env-config.js';
export type { ClusterNode } from './config/redis-cluster.js';
export { assertClusterHashTag, hashTagOf, parseClusterNodes } from './config/redis-cluster.js';
export type { RedisConnection, RedisConnectionSettings } from './bullmq/redis-connection.js';
export { openRedisConnection } from './bullmq/redis-connection.js';
export type { WorkerProcess, WorkerProcessOptions } from './runtime/worker-process.js';
export { startWorkerProcess } from './runtime/worker-process.js';
export { onShutdownSignals } from './runtime/shutdown-signals.js';
export { runMain, startupFailureExitCode } from './runtime/run-main.js';
export { loadHandlerModule } from './runtime/handler-module.js';
export type { HttpApiOptions, ResolvedHttpApiOptions, HttpEnvConfig } from './config/http-options.js';
export { ANONYMOUS_TENANT, assertBindAllowed, isLoopbackHost, loadHttpEnvConfig, parseAdminTokens, parseTokens, resolveHttpApiOptions } from './config/http-options.js';
export { HttpApi, createHttpApi } from './http/http-api.js';
export type { JobState, JobView, StepView, SubmitOutcome, SubmitRequest, JobIngestionOptions } from './http/job-ingestion.js';
export { JobIngestion, requestScopeFor } from './http/job-ingestion.js';
export type { ProblemDetails, ProblemKind } from './http/problems.js';
export { HttpProblem, PROBLEMS, PROBLEM_TYPE_PREFIX, problemType } from './http/problems.js';
export type { HttpServerProcess, HttpServerProcessOptions } from './http/http-server-process.js';
export { startHttpServerProcess } from './http/http-server-process.js';
// Operations (issue 7): retention, the sweeper, metrics and health.
export type {
  JanitorOptions,
  MaintenanceIntervals,
  ResolvedJanitorOptions,
  ResolvedSweeperOptions,
  RetryPolicy,
  SweeperAction,
  SweeperJobQueues,
  SweeperOptions,
} from './config/maintenance-options.js';
export { parseQueueActions, resolveJanitorOptions, resolveSweeperOptions, retryHorizonMs } from './config/maintenance-options.js';
export type { JanitorReport, RetentionWarning } from './ops/janitor.js';
export { Janitor } from './ops/janitor.js';
export type { SweepRecovery, SweepReport } from './ops/sweeper.js';
export { Sweeper } from './ops/sweeper.js';
export type { MaintenanceEvents, MaintenanceOptions } from './ops/maintenance.js';
export { Maintenance } from './ops/maintenance.js';
export type { ConfiguredMaintenance, MaintenanceProcess, MaintenanceProcessOptions } from './ops/maintenance-process.js';
export { createMaintenanceFromConfig, retryPolicyFromConfig, startMaintenanceProcess, sweeperQueuesFromConfig } from './ops/maintenance-process.js';
export type { LockedRun, MaintenanceTask } from './store/maintenance-lock.js';
export { withMaintenanceLock } from './store/maintenance-lock.js';
export type { KeyStats } from './store/sql/key-stats.js';
export type { BullmqJobLookupOptions, JobPresence, ReenqueueRequest } from './bullmq/job-lookup.js';
export { BullmqJobLookup } from './bullmq/job-lookup.js';
export type { HealthCheck, HealthReport, MetricsServer, MetricsServerOptions } from './metrics/metrics-server.js';
export { runHealthChecks, startMetricsServer } from './metrics/metrics-server.js';
export { instrumentWorker } from './metrics/worker-metrics.js';
export { instrumentMaintenance, type InstrumentMaintenanceOptions } from './metrics/maintenance-metrics.js';
export { METRIC_PREFIX } from './metrics/metric-registry.js';
export type { TracingOptions } from './telemetry/trace-attributes.js';
export { configureTracing, traceKeyHash } from './telemetry/trace-attributes.js';
export type { TraceCarrier } from './telemetry/trace-carrier.js';
