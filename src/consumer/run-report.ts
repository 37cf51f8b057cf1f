import type { Logger } from 'pino';
import { describeError } from '../describe-error.js';
import type { StepReport } from '../protocol/job-steps.js';
import type { Claim } from '../store/claim-outcome.js';
import type { KeyRetention } from '../store/records.js';
import { sqlStateOf } from '../store/pg-errors.js';
import type { Delivery } from './job-context.js';
import type { JobLogger } from './job-logger.js';
import type { RunOutcome, RunResult } from './run-outcome.js';
import type { KeyedJobRunnerOptions } from './runner-options.js';
import { concurrencyLimitsOf, type JobIdentity } from './wire-contract.js';
import type { WorkerEventKind } from './worker-event.js';

/** What an event concerns: the claim, or else the identity read from the message; a duration, a step. */
export interface EventAbout<P> {
  readonly claim?: Claim;
  readonly identity?: JobIdentity<P>;
  readonly durationMs?: number;
  readonly step?: StepReport;
  readonly cause?: string;
  readonly retentionPart?: keyof KeyRetention;
  /** On `concurrency-limited`: the concurrency key that was at its limit. */
  readonly concurrencyKey?: string;
}

/**
 * Says what became of a run: the worker event (and its trace), the log line. A run's outcome is
 * reported once, by {@link RunReporter.report}; the events a run emits on its way (claimed, a
 * step, a heartbeat) go through {@link RunReporter.emit}.
 */
export class RunReporter<P, M> {
  readonly #options: Pick<KeyedJobRunnerOptions<P, unknown, M>, 'identityOf' | 'events' | 'tracing'>;
  readonly #log: Logger;

  constructor(options: Pick<KeyedJobRunnerOptions<P, unknown, M>, 'identityOf' | 'events' | 'tracing' | 'logger'>) {
    this.#options = { identityOf: options.identityOf, events: options.events, tracing: options.tracing };
    this.#log = options.logger;
  }

  /**
   * The one report of a run: the event (and its trace), the log line, the outcome returned. Every
   * outcome is said here, and only here.
   */
  report(delivery: Delivery<M>, identity: JobIdentity<P> | undefined, log: JobLogger | undefined, result: RunResult): RunOutcome {
    const { outcome, claim, step } = result;
    const confirmed = result.confirmed ?? true;
    switch (outcome.kind) {
      case 'completed':
        if (result.thrownAfterCommit) {
          log?.warn({ err: result.thrownAfterCommit.error }, 'handler threw after its transaction committed; the job completes with the stored result');
        } else {
          this.emit('completed', delivery, { claim, durationMs: result.durationMs });
          log?.info({ outcome: 'completed', durationMs: Math.round(result.durationMs ?? 0) }, 'effect committed');
        }
        break;
      case 'replayed':
      case 'replayed-failure':
        if (outcome.kind === 'replayed' && outcome.coalesced) {
          this.emit('coalesced', delivery, { identity });
          log?.info({ outcome: 'coalesced' }, 'a run of this key is in flight: its pending successor now carries this payload');
        } else if (outcome.resultExpired) {
          // Only the key's tombstone is left: the duplicate is acknowledged (or refused) as it was, never run.
          this.emit('result-expired', delivery, { identity });
          log?.info(
            { outcome: 'result-expired', finishedAt: outcome.resultExpired.finishedAt, tombstoneExpiresAt: outcome.resultExpired.tombstoneExpiresAt },
            `key already ${outcome.kind === 'replayed' ? 'completed' : 'failed'}; its result has expired (tombstone): not running it again`,
          );
        } else if (outcome.kind === 'replayed') {
          this.emit('replayed', delivery, { identity });
          log?.info({ outcome: 'replayed' }, 'key already completed: replaying its result');
        } else {
          this.emit('replayed-failure', delivery, { identity });
          log?.info({ outcome: 'replayed-failure' }, outcome.error.message);
        }
        break;
      case 'key-reused':
        this.emit('key-reused', delivery, { identity });
        log?.warn({ outcome: 'key-reused' }, outcome.error.message);
        break;
      case 'invalid-message':
        this.emit('invalid', delivery, { identity });
        // A message whose key could be read logs on the job's logger, with the refusal.
        if (log) log.warn({ outcome: 'invalid', err: outcome.error }, (outcome.error as Error).message);
        else this.#log.warn({ jobId: delivery.id, outcome: 'invalid' }, outcome.reason);
        break;
      case 'deferred':
        if (outcome.reason === 'concurrency-limit') {
          const concurrencyKey = outcome.concurrencyKey ?? concurrencyLimitsOf(identity?.concurrency)[0]?.key;
          this.emit('concurrency-limited', delivery, { identity, ...(concurrencyKey !== undefined && { concurrencyKey }) });
          log?.info(
            { outcome: 'concurrency-limited', delayMs: outcome.retryAfterMs, concurrencyKey },
            'concurrency key at its limit: deferring the job without using an attempt',
          );
          break;
        }
        this.emit('deferred', delivery, { identity });
        if (outcome.reason === 'data-layer-elsewhere') {
          // A deployment's fault, which every job meets until it is fixed: loud, and never an attempt.
          log?.error(
            { outcome: 'deferred', reason: outcome.reason, delayMs: outcome.retryAfterMs, err: outcome.error },
            `${outcome.error?.message ?? 'the data layer is on another database than the keys'} Deferring the job without using an attempt until then.`,
          );
          break;
        }
        log?.info({ outcome: 'deferred', delayMs: outcome.retryAfterMs }, 'key in progress elsewhere: deferring the job');
        break;
      case 'store-unavailable':
        this.emit('store-unavailable', delivery, { claim, identity, cause: storeFaultOf(outcome.error) });
        log?.warn({ outcome: 'store-unavailable', delayMs: outcome.retryAfterMs, err: outcome.error }, 'Postgres unavailable: deferring the job without using an attempt');
        break;
      case 'failed-permanently':
        if (confirmed) this.emit('failed', delivery, { claim });
        log?.warn({ outcome: 'failed', err: outcome.error, step: step?.name }, 'job failed permanently; error stored for replay');
        break;
      case 'retry':
        if (confirmed) this.emit('released', delivery, { claim, identity });
        log?.info(
          { outcome: 'released', err: outcome.error, step: step?.name },
          claim ? 'retryable error: key released for the next attempt' : 'retryable error: transaction rolled back',
        );
        break;
      case 'abandoned':
        // Given back at the shutdown deadline: abandonActive() released the key and said so.
        break;
      default: {
        const unreported: never = outcome;
        return unreported;
      }
    }
    return outcome;
  }

  /** Emits one event (and records it on the message's span): `about` names the claim, or else the identity, it concerns. */
  emit(kind: WorkerEventKind, delivery: Delivery<M>, about: EventAbout<P> = {}): void {
    const { claim, identity, durationMs, step, cause, retentionPart, concurrencyKey } = about;
    this.#options.tracing?.record(kind, delivery.message as object, claim, step);
    const events = this.#options.events;
    if (!events?.wanted()) return;
    // A claim names its key; events without one name the identity read from the message, if any.
    const named = claim ?? identity ?? this.#safeIdentity(delivery.message);
    events.emit({
      kind,
      jobId: delivery.id,
      scope: named?.scope,
      key: named?.key,
      fence: claim?.fence,
      durationMs,
      ...(step && { step: step.name, position: step.position }),
      ...(cause !== undefined && { cause }),
      ...(kind === 'concurrency-limited' && concurrencyKey !== undefined && { concurrencyKey }),
      ...(retentionPart !== undefined && { retentionPart }),
    });
  }

  #safeIdentity(message: M): JobIdentity<P> | undefined {
    try {
      return this.#options.identityOf(message);
    } catch {
      return undefined;
    }
  }
}

/** The driver's error under a store fault, SQLSTATE first when it has one. */
function storeFaultOf(error: unknown): string {
  const driverError = error instanceof Error && error.cause !== undefined ? error.cause : error;
  const state = sqlStateOf(driverError);
  return `${state !== undefined ? `${state} ` : ''}${describeError(driverError)}`;
}
