/**
 * idempotent-jobs: exactly-once effects for BullMQ jobs. Keys are claimed in Postgres under a
 * fenced lease; the effect and the key's completion commit in one transaction.
 *
 * The library: the claim protocol (`IdempotencyKeys`), the BullMQ worker, producer and outbox
 * relay, the runner for other brokers and the HTTP API. Processes (the environment, the process
 * starters, maintenance, metrics) are built from `idempotent-jobs/process`; the store's seams,
 * RabbitMQ, NATS and tracing have entry points of their own.
 *
 * @packageDocumentation
 * @module idempotent-jobs
 */
export * from './errors.js';
export { ServiceUnreachableError, type Service } from './service-unreachable.js';
// The claim protocol.
export type {
  ClaimOptions,
  CommitEffectOptions,
  Effect,
  EffectFailureAction,
  EffectOptions,
  ExecuteOnceOptions,
  ExecuteOnceOutcome,
  RunEffectOptions,
} from './protocol/effect-options.js';
export { IdempotencyKeys, type ConcurrencySlot, type ConcurrencySlotRefused } from './protocol/idempotency-keys.js';
export type { GroupedEffects, IdempotencyGroupCommitOptions, IdempotencyOptions, ResolvedIdempotencyOptions } from './protocol/idempotency-options.js';
export type { GroupCommitOptions } from './protocol/group-commit.js';
export type { GroupRefusal, GroupRefusalReason } from './protocol/group-refusals.js';
export type { Claim, ClaimOutcome, ExpiredResult, HeldClaim } from './store/claim-outcome.js';
export { isHeld } from './store/claim-outcome.js';
export type { CoalesceAnswer, CoalesceArrival, CoalesceSuccessor, ConcurrencyRecord, KeyRecord, KeyRetention, KeyStatus } from './store/records.js';
export type { Fingerprinter } from './fingerprint.js';
export type { PostgresDbOptions } from './store/create-postgres-db.js';
export { createPostgresDb } from './store/create-postgres-db.js';
export type { MigrateOptions } from './store/migrate.js';
export { migrate } from './store/migrate.js';
export { KeySettledListener, type FreedSlot } from './store/key-settled-listener.js';
// Steps (`ctx.step`).
export type { DataLayerStep, DatabaseStep, ExternalStep, ExternalStepContext, JobStepsOptions, StepContext, StepBody, StepReport } from './protocol/job-steps.js';
export type { FailedStep, StoredError } from './protocol/validate.js';
export { JobSteps, stepKeyFor } from './protocol/job-steps.js';
// The BullMQ worker, producer and outbox relay.
export type { DataLayerJobHandler, DatabaseOnlyJobContext, DatabaseOnlyJobHandler, IdempotentWorkerOptions, JobContext, JobHandler } from './bullmq/idempotent-worker.js';
export { IdempotentWorker, createIdempotentWorker } from './bullmq/idempotent-worker.js';
export type { DatabaseOnlyContext, DatabaseOnlyHandler, DataLayerHandler } from './consumer/database-only-handler.js';
// Your data layer (Prisma, Drizzle, TypeORM, node-postgres, postgres.js): the seam its adapter fills.
export type { DataLayer, RawRows, RunStatement } from './store/data-layer.js';
export { kyselyIn } from './data-layers/kysely-in.js';
export { databaseOnly } from './consumer/database-only-handler.js';
export type { StepEventKind, WorkerEvent, WorkerEventKind } from './consumer/worker-event.js';
export type { ResolvedWorkerTiming, WorkerTimingOptions } from './consumer/worker-timing.js';
export { resolveWorkerTiming } from './consumer/worker-timing.js';
export type { EnqueueRequest, EnqueueResult, IdempotentProducerOptions } from './bullmq/idempotent-producer.js';
export { IdempotentProducer } from './bullmq/idempotent-producer.js';
export type { OutboxRelayOptions } from './bullmq/outbox-relay.js';
export { OutboxRelay } from './bullmq/outbox-relay.js';
export type { AnyQueue, AnyWorker, PostgresQueueConnection, QueueBackendKind, QueueConnectionOptions } from './bullmq/queue-connection.js';
export { DEFAULT_POSTGRES_QUEUE_SCHEMA } from './bullmq/queue-connection.js';
// Any broker: the runner and the wire contract.
export type { Delivery, KeyedJobContext, TransactionOptions } from './consumer/job-context.js';
export type { DeferralReason, RunOutcome } from './consumer/run-outcome.js';
export type { ErrorDisposition, KeyedJobRunnerOptions } from './consumer/runner-options.js';
export { KeyedJobRunner } from './consumer/keyed-job-runner.js';
export type { KeyedJobHandler } from './consumer/database-only-handler.js';
export type { ConcurrencyLimit, JobIdentity, JobLike, WireJobData, WireJobExtras } from './consumer/wire-contract.js';
export { identityFromWireContract, jobIdFor, toWireJobData } from './consumer/wire-contract.js';
// The HTTP API.
export type { HttpApiOptions } from './http/http-options.js';
export { HttpApi, createHttpApi } from './http/http-api.js';
export type { ScheduleOptions } from './ops/schedule-spec.js';
export type { ScheduleInfo, SchedulesOptions } from './ops/schedules.js';
export { Schedules, scheduleScope, tickKey } from './ops/schedules.js';
export type { MissedTicksPolicy, ScheduleKind } from './store/records.js';
