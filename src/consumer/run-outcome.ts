import type { ExpiredResult } from '../store/claim-outcome.js';
import { PersistentStoreFaultError, type DataLayerElsewhereError, type KeyFailedError, type KeyReusedError, type StoreUnavailableError } from '../errors.js';
import type { FailedStep } from '../protocol/validate.js';
import type { Claim } from '../store/claim-outcome.js';
import type { ClaimOptions } from '../protocol/effect-options.js';
import type { Delivery } from './job-context.js';
import type { JobLogger } from './job-logger.js';
import type { JobIdentity } from './wire-contract.js';

/** Why a run was deferred: see the `deferred` {@link RunOutcome}. */
export type DeferralReason = 'in-progress' | 'contended' | 'fenced' | 'concurrency-limit' | 'data-layer-elsewhere';

/**
 * What became of one delivery, for the adapter to say in its broker's vocabulary. Every kind
 * has been logged and emitted as a `WorkerEvent` already, once, when the run ended.
 *
 * - `completed`: the effect committed under this claim; acknowledge.
 * - `replayed`: the key was completed before; nothing ran; acknowledge (`result` is the stored one).
 * - `replayed-failure`: the key failed permanently before; nothing ran.
 * - `key-reused`: the key was used with another payload; never run.
 * - `invalid-message`: the message cannot be read (no key, bad JSON…); no delivery can do better.
 * - `deferred`: another consumer holds the key (or this one was fenced out, or the claim kept
 *   racing, or the handler's data layer is on another database than the keys); deliver again
 *   after `retryAfterMs`, without counting a failed delivery.
 * - `store-unavailable`: Postgres failed, not the handler; deliver again after `retryAfterMs`,
 *   without counting a failed delivery. Never a failure. Once a key's faults in a row have
 *   lasted `storeRetryWindowMs`, each one is `retry` (or, on the last attempt,
 *   `failed-permanently`) with a `PersistentStoreFaultError` instead.
 * - `failed-permanently`: the handler's error is stored under the key; `description` says so.
 * - `retry`: the handler threw a retryable error; the key is released for a redelivery.
 * - `abandoned`: the consumer is closing past its deadline; the key was released; give the
 *   message back to the broker at once.
 */
export type RunOutcome =
  | {
      /** The effect committed under this claim; acknowledge. */
      readonly kind: 'completed';
      /** What `ctx.transaction`'s function returned (or the handler, when it never called it): the key's stored result. */
      readonly result: unknown;
    }
  | {
      /** The key was completed before; nothing ran; acknowledge. */
      readonly kind: 'replayed';
      /** The stored result of the run that completed the key (`null` once it expired). */
      readonly result: unknown;
      /** Set when only the key's tombstone is left: it completed before, its result has expired. */
      readonly resultExpired?: ExpiredResult;
      /** Set for a coalescing job folded into the run in flight: its payload is the pending successor's. */
      readonly coalesced?: true;
    }
  | {
      /** The key failed permanently before; nothing ran. */
      readonly kind: 'replayed-failure';
      /** Carries the stored error. */
      readonly error: KeyFailedError;
      /** Set when only the key's tombstone is left: it failed before, its stored error has expired. */
      readonly resultExpired?: ExpiredResult;
    }
  | {
      /** The key was used with another payload; never run. */
      readonly kind: 'key-reused';
      /** Names the key and scope. */
      readonly error: KeyReusedError;
    }
  | {
      /** The message cannot be read (no key, bad JSON…); no delivery can do better. */
      readonly kind: 'invalid-message';
      /** What is wrong with the message, for logs and dead-letter headers. */
      readonly reason: string;
      /** The error that reading it threw. */
      readonly error: unknown;
    }
  | {
      /** Another consumer holds the key (or this one was fenced out, or the claim kept racing): deliver again later, without counting a failed delivery. */
      readonly kind: 'deferred';
      /** When to deliver the message again. */
      readonly retryAfterMs: number;
      /**
       * Why: another owner's live lease, a contended claim, this run's claim fenced out, its
       * concurrency key at its limit, or a data layer on another database than the keys (a
       * configuration fault: the job waits, no attempt used, until the data layer is fixed).
       */
      readonly reason: DeferralReason;
      /** With `'data-layer-elsewhere'`: the refusal, which names the fix. */
      readonly error?: DataLayerElsewhereError;
      /** With `'concurrency-limit'`: the concurrency key that was at its limit. */
      readonly concurrencyKey?: string;
    }
  | {
      /** Postgres failed, not the handler: deliver again later, without counting a failed delivery. */
      readonly kind: 'store-unavailable';
      /** When to deliver the message again (the store-fault backoff). */
      readonly retryAfterMs: number;
      /** The store's fault. */
      readonly error: StoreUnavailableError;
    }
  | {
      /** The handler's error is stored under the key for good. */
      readonly kind: 'failed-permanently';
      /** The handler's error. */
      readonly error: unknown;
      /** Says what was stored and why, for logs. */
      readonly description: string;
    }
  | {
      /** The handler threw a retryable error; the key is released for a redelivery. */
      readonly kind: 'retry';
      /** The handler's error. */
      readonly error: unknown;
    }
  | {
      /** The consumer is closing past its deadline; the key was released; give the message back to the broker at once. */
      readonly kind: 'abandoned';
      /** Why the run was cut short. */
      readonly error: unknown;
    };

/**
 * What a run came to, for the runner to report once (the event, the log line, the trace): the
 * outcome the adapter gets, and what the report says besides it.
 */
export interface RunResult {
  readonly outcome: RunOutcome;
  /** The claim the run held (or, for a failure stored by a claim of its own, that claim): the event names it. */
  readonly claim?: Claim;
  /** `completed`: how long the run took to its commit. */
  readonly durationMs?: number;
  /** `failed-permanently`, `retry`: the step the handler failed in. */
  readonly step?: FailedStep;
  /**
   * `failed-permanently`, `retry`: the store confirmed the key failed, or released; the event is
   * emitted only then. @defaultValue `true`
   */
  readonly confirmed?: boolean;
  /** `completed`: the handler threw after its transaction committed (logged; no event: the commit's own). */
  readonly thrownAfterCommit?: { readonly error: unknown };
  /** The job's logger with what the run bound to it (the fence of its claim); the run's own otherwise. */
  readonly log?: JobLogger;
}

/**
 * True when the run got past the store, which ends its key's streak of store faults: every
 * outcome but a deferral, one more store fault (one deferred, or one counted as an attempt and
 * retried), or an abandoned run.
 */
export function passedTheStore(outcome: RunOutcome): boolean {
  if (outcome.kind === 'store-unavailable' || outcome.kind === 'deferred' || outcome.kind === 'abandoned') return false;
  return !(outcome.kind === 'retry' && outcome.error instanceof PersistentStoreFaultError);
}

/** A failure as the adapter says it: the key, the scope, the step if any, and the error's message. */
export function describeFailure(identity: JobIdentity, error: unknown, step?: FailedStep): string {
  const message = error instanceof Error ? error.message : String(error);
  const where = step ? ` at step "${step.name}" (position ${step.position})` : '';
  return `Job for key "${identity.key}" in scope "${identity.scope}" failed${where}: ${message}`;
}

/** One delivery being run: the message, its identity, the job's logger, and how its key is claimed. */
export interface Run<P, M> {
  readonly delivery: Delivery<M>;
  readonly identity: JobIdentity<P>;
  readonly log: JobLogger;
  readonly fingerprint: string;
  readonly claimOptions: ClaimOptions;
  /**
   * Aborted, with a `ConcurrencySlotLostError`, when the run can no longer show it holds its
   * concurrency slots (`concurrency-slot-heartbeat.ts`): a fast-path run then rolls back
   * instead of committing outside its limit. Unset: the job names no concurrency key.
   */
  readonly slotsLost?: AbortSignal;
  /**
   * Run on the leased path even where the worker runs the fast path: a coalescing generation,
   * whose run others must see in flight (its key committed as `processing`, its lease renewed),
   * which a fast-path key, an insert not committed until the run ends, does not show.
   * @defaultValue unset (the worker's path)
   */
  readonly leased?: boolean;
}

/** A key's scope and key as one string, naming its store-fault streak (neither can contain NUL). */
export function streakId(identity: JobIdentity): string {
  return `${identity.scope}\u0000${identity.key}`;
}
