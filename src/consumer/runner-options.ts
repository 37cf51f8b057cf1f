import type { Logger } from 'pino';
import { IdempotencyError, StepMismatchError, StepsUnsupportedError, TransactionControlError, ValidationError } from '../errors.js';
import type { FaultHook } from '../fault-hook.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import type { StepReport } from '../protocol/job-steps.js';
import type { Claim } from '../store/claim-outcome.js';
import type { KeySettledListener } from '../store/key-settled-listener.js';
import type { KeyedJobHandler } from './database-only-handler.js';
import type { JobIdentity } from './wire-contract.js';
import type { WorkerEvent, WorkerEventKind } from './worker-event.js';
import type { ResolvedWorkerTiming } from './worker-timing.js';

/** What a thrown error does: `'retry'` releases the key for the broker's redelivery; `'fail'` stores it for good. */
export type ErrorDisposition = 'retry' | 'fail';

/** Options of {@link KeyedJobRunner}; each adapter builds them from its own options. */
export interface KeyedJobRunnerOptions<P, R, M> {
  /** The claim protocol (its Kysely instance is where transactional effects run). */
  readonly keys: IdempotencyKeys;
  /** Lease, heartbeat and deferral timings, resolved ({@link resolveWorkerTiming}). */
  readonly timing: ResolvedWorkerTiming;
  /** A function, or a database-only handler (`{ transaction }`, see {@link DatabaseOnlyHandler}). */
  readonly handler: KeyedJobHandler<P, R, M>;
  /** Reads key, scope and payload from a message; throws for a message that cannot be read. */
  readonly identityOf: (message: M) => JobIdentity<P>;
  /** Which handler errors are stored for good. @defaultValue validation errors, unstorable results, step errors and an effect that tried to end its own transaction are stored for good; everything else is retried */
  readonly errorDisposition?: (error: unknown, message: M) => ErrorDisposition;
  /**
   * See `IdempotentWorkerOptions.fastPath`.
   * @defaultValue `true` for a database-only handler, `false` for a function
   */
  readonly fastPath?: boolean;
  /** Needed for `timing.waitMs > 0`: wakes a waiting duplicate when the owner finishes. @defaultValue unset (no waiting) */
  readonly listener?: KeySettledListener;
  /**
   * The adapter wakes a job deferred by a concurrency limit when a slot frees (BullMQ's worker
   * promotes the delayed job the freeing run's notification names): the job's waiter row keeps
   * its delivery's id and queue for that notification. @defaultValue `false` (waiters ask again when their deferral ends)
   */
  readonly wakesConcurrencyWaiters?: boolean;
  /** Keep each payload on its key. @defaultValue `false` */
  readonly storePayload?: boolean;
  /**
   * The broker keeps no count of failed deliveries that the adapter could use (JetStream's
   * delivery count counts deferrals too), so attempts are the key's claims: a fast-path run
   * that fails with a retryable error rolled its claim back, so the runner claims and releases
   * the key at once (two statements, on failures only, the error kept on the key) for the next
   * run's claim to count it. When Postgres cannot take that, the attempt goes uncounted: the
   * message is retried, never failed early.
   * @defaultValue `false` (the broker counts attempts: BullMQ's `attemptsMade`, a RabbitMQ header)
   */
  readonly countAttemptsOnKey?: boolean;
  /** Where the runner logs each outcome (the adapter's logger, with its queue bound). */
  readonly logger: Logger;
  /** Chaos testing only: called at named protocol points. @defaultValue unset */
  readonly faultHook?: FaultHook;
  /** Receives every {@link WorkerEvent}; `wanted()` false skips building them. @defaultValue unset (no events) */
  readonly events?: {
    /** Whether anyone listens now; false skips building the events. */
    wanted(): boolean;
    /** Receives one event. */
    emit(event: WorkerEvent): void;
  };
  /** Told every event with the message it concerns, so the adapter's span for that message can record it. @defaultValue unset (no tracing) */
  readonly tracing?: {
    /** Records one event on the span of `message`. */
    record(kind: WorkerEventKind, message: object, claim?: Claim, step?: StepReport): void;
  };
}

/**
 * The default {@link ErrorDisposition}: validation errors, unstorable results, step errors and an
 * effect that tried to end its own transaction are stored for good (no retry can mend them);
 * everything else is retried.
 */
export function defaultErrorDisposition(error: unknown): ErrorDisposition {
  if (error instanceof IdempotencyError && (error.code === 'RESULT_NOT_STORABLE' || error instanceof ValidationError)) return 'fail';
  if (error instanceof StepsUnsupportedError || error instanceof StepMismatchError || error instanceof TransactionControlError) return 'fail';
  return 'retry';
}
