import {
  ClaimContendedError,
  DataLayerElsewhereError,
  KeyFailedError,
  KeyReusedError,
  LeaseLostError,
  PersistentStoreFaultError,
  StepMismatchError,
  findStoreUnavailable,
} from '../errors.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import type { FailedStep } from '../protocol/validate.js';
import type { Claim, ClaimOutcome, HeldClaim } from '../store/claim-outcome.js';
import { isHeld } from '../store/claim-outcome.js';
import type { Delivery } from './job-context.js';
import { describeFailure, streakId, type DeferralReason, type Run, type RunResult } from './run-outcome.js';
import { ReleaseRetries } from './release-retries.js';
import { defaultErrorDisposition, type ErrorDisposition } from './runner-options.js';
import type { StoreFaultStreaks } from './store-fault-streaks.js';
import type { WorkerEventKind } from './worker-event.js';
import { deferralMs, storeRetryDelayMs, type ResolvedWorkerTiming } from './worker-timing.js';

/** Why a run was cut short at shutdown: its key was given back for another consumer. */
export class WorkerClosingError extends Error {
  constructor() {
    super('The worker is shutting down; the key was released for another worker.');
    this.name = 'WorkerClosingError';
  }
}

/** What {@link RunFailures} needs of its runner. */
export interface RunFailuresOptions<M> {
  readonly keys: IdempotencyKeys;
  readonly timing: ResolvedWorkerTiming;
  /** Bounds the deferrals of store faults that never pass (`storeRetryWindowMs`). */
  readonly storeFaults: StoreFaultStreaks;
  readonly errorDisposition?: (error: unknown, message: M) => ErrorDisposition;
  /** See `KeyedJobRunnerOptions.countAttemptsOnKey`. */
  readonly countAttemptsOnKey: boolean;
  /** Emits an event of the run on its way (a release, a fenced completion); the outcome's own is the runner's report. */
  readonly emit: (kind: WorkerEventKind, delivery: Delivery<M>, claim?: Claim) => void;
}

/**
 * What a run comes to when it does not complete: deferred (another consumer holds the key, or
 * the store failed, not the handler), retried (the key released) or failed for good (the error
 * stored on the key). The policy of deferrals and of store faults that last, in one place; each
 * method returns the run's result for the runner to report.
 */
export class RunFailures<P, M> {
  readonly #options: RunFailuresOptions<M>;
  readonly #releases: ReleaseRetries;

  constructor(options: RunFailuresOptions<M>) {
    this.#options = options;
    this.#releases = new ReleaseRetries({ keys: options.keys, timing: options.timing });
  }

  /** Deferral without using an attempt, to replay once the owner finishes (or, `concurrencyKey` given, once that key has a free slot). */
  defer(retryAfterMs: number, reason: Exclude<DeferralReason, 'data-layer-elsewhere'>, concurrencyKey?: string): RunResult {
    return { outcome: { kind: 'deferred', retryAfterMs: deferralMs(this.#options.timing, retryAfterMs), reason, ...(concurrencyKey !== undefined && { concurrencyKey }) } };
  }

  /** A claim that this consumer does not hold: replay, refuse, or defer. */
  notHeld(outcome: Exclude<ClaimOutcome, HeldClaim>): RunResult {
    switch (outcome.kind) {
      case 'completed':
        return { outcome: { kind: 'replayed', result: outcome.result, resultExpired: outcome.resultExpired } };
      case 'failed':
        return { outcome: { kind: 'replayed-failure', error: new KeyFailedError(outcome.scope, outcome.key, outcome.error), resultExpired: outcome.resultExpired } };
      case 'key-reused':
        return { outcome: { kind: 'key-reused', error: new KeyReusedError(outcome.scope, outcome.key) } };
      case 'in-progress':
        return this.defer(outcome.retryAfterMs, 'in-progress');
    }
  }

  /**
   * The handler's data layer is on another database than the keys ({@link DataLayerElsewhereError},
   * met at its first transaction when the worker was not given it to check at start): a fault of
   * the deployment, not of the job, which no attempt can mend and which must not be stored on
   * the key. The key is given back (nothing of the run committed) and the job deferred without
   * using an attempt, backing off as a store fault does, so that every job waits for the fix
   * (the data layer's connection pointed at the keys' database) instead of failing.
   */
  async dataLayerElsewhere(run: Run<P, M>, error: DataLayerElsewhereError, held?: Claim): Promise<RunResult> {
    if (held) await this.#giveBack(run, held, error);
    const retryAfterMs = storeRetryDelayMs(this.#options.timing, run.delivery.deferrals);
    return { outcome: { kind: 'deferred', retryAfterMs, reason: 'data-layer-elsewhere', error }, claim: held };
  }

  /**
   * The claim kept racing other writers of the key (see `ClaimContendedError`): the key is as
   * good as in progress elsewhere, so the delivery is deferred like an in-progress duplicate.
   */
  contended(): RunResult {
    return this.defer(this.#options.timing.deferMinMs, 'contended');
  }

  /**
   * A transient store fault met by the claim, the handler's statements or the commit: deferred
   * without using an attempt ({@link RunFailures.deferStoreFault}), until the key's faults in a
   * row have lasted `storeRetryWindowMs`. From then on each one is an attempt, as a retryable
   * error of the handler would be: the key released (or, not held, the attempt recorded where the
   * broker does not count it) for a retry, or on the last attempt stored as the key's failure.
   * Storing it needs Postgres: when that fails too, the job is deferred again, so a real outage
   * never fails a job, whatever its length. Rethrows an error that is no store fault.
   */
  async storeFault(run: Run<P, M>, error: unknown, held?: Claim): Promise<RunResult> {
    const fault = findStoreUnavailable(error);
    if (!fault) throw error;
    const { timing, storeFaults } = this.#options;
    if (!storeFaults.outlasted(streakId(run.identity))) return this.deferStoreFault(run, fault, held);
    const persistent = new PersistentStoreFaultError(fault, timing.storeRetryWindowMs);
    run.log.warn({ err: fault }, 'store faults of this key have lasted longer than storeRetryWindowMs: counting this one as an attempt');
    // Only the broker's count decides: errorDisposition is about the handler's own errors.
    const final = run.delivery.lastAttempt;
    return held ? this.heldError(run, held, persistent, final) : this.unheldError(run, persistent, final);
  }

  /**
   * A transient store fault (Postgres restarting, a dropped connection, a full disk…): gives the
   * key back when this delivery holds it (tried again in the background while the store refuses,
   * see {@link ReleaseRetries}), and defers without using an attempt. The delay backs off
   * exponentially with the delivery's `deferrals`. Rethrows any other error.
   */
  async deferStoreFault(run: Run<P, M>, error: unknown, held?: Claim): Promise<RunResult> {
    const fault = findStoreUnavailable(error);
    if (!fault) throw error;
    if (held) await this.#giveBack(run, held, fault);
    const retryAfterMs = storeRetryDelayMs(this.#options.timing, run.delivery.deferrals);
    return { outcome: { kind: 'store-unavailable', retryAfterMs, error: fault }, claim: held };
  }

  /** The handler of a held claim threw (or its commit failed). */
  async heldFailure(run: Run<P, M>, claim: Claim, signal: AbortSignal, error: unknown, step?: FailedStep): Promise<RunResult> {
    const { delivery, log } = run;
    if (error instanceof LeaseLostError || signal.reason instanceof LeaseLostError) {
      log.warn({ outcome: 'fenced' }, 'completion fenced: the key was taken over; deferring this job to replay');
      return this.#fenced(run, claim);
    }
    if (signal.reason instanceof WorkerClosingError) return { outcome: { kind: 'abandoned', error } }; // key already released by abandonActive()
    const elsewhere = findDataLayerElsewhere(error);
    if (elsewhere) return this.dataLayerElsewhere(run, elsewhere, claim);
    // Postgres, not the handler, failed (an ambiguous COMMIT was already resolved, as failed).
    if (findStoreUnavailable(error)) return this.storeFault(run, error, claim);
    return this.heldError(run, claim, error, this.#isFinal(delivery, error), step);
  }

  /** A held claim's run failed: the key failed for good when `final`, else released for a retry. */
  async heldError(run: Run<P, M>, claim: Claim, error: unknown, final: boolean, step?: FailedStep): Promise<RunResult> {
    const { keys } = this.#options;
    if (final) {
      const failed = { kind: 'failed-permanently', error, description: describeFailure(run.identity, error, step) } as const;
      let stored: boolean;
      try {
        stored = await keys.fail(claim, error, step);
      } catch (failError) {
        // The failure could not be recorded for now: run the job again later rather than lose it.
        if (findStoreUnavailable(failError)) return this.deferStoreFault(run, failError, claim);
        // Refused for good: the job fails, and its key is given back rather than left processing
        // under a lease nobody will end (a later add of the key runs it again).
        run.log.error({ err: failError }, 'the failure could not be stored on the key: the key is released');
        await this.#giveBack(run, claim, error, step);
        return { outcome: failed, claim, step, confirmed: false };
      }
      if (!stored) {
        // Taken over while this run failed: the new owner decides the key's outcome, which this
        // job then replays. Failing the job here would end it apart from its key.
        run.log.warn({ outcome: 'fenced' }, 'failure fenced: the key was taken over; deferring this job to replay');
        return this.#fenced(run, claim);
      }
      return { outcome: failed, claim, step, confirmed: true };
    }
    const released = await this.#giveBack(run, claim, error, step, { emitNow: false });
    return { outcome: { kind: 'retry', error }, claim, step, confirmed: released };
  }

  /**
   * Gives `claim`'s key back for the next claim, with `error` kept on it; true when it was
   * released now. A release the store refused is tried again in the background, and its
   * `released` event comes when it goes through; one released now is emitted here unless the
   * caller's outcome reports it (`emitNow` false).
   */
  async #giveBack(run: Run<P, M>, claim: Claim, error: unknown, step?: FailedStep, { emitNow = true } = {}): Promise<boolean> {
    const emit = () => this.#options.emit('released', run.delivery, claim);
    const answer = await this.#releases.release(claim, { error, step, onReleasedLater: emit });
    if (answer === 'released' && emitNow) emit();
    return answer === 'released';
  }

  /** This run's claim was taken over: another consumer owns the key now and will finish it; this delivery becomes a duplicate. */
  #fenced(run: Run<P, M>, claim: Claim): RunResult {
    this.#options.emit('fenced', run.delivery, claim);
    return this.defer(this.#options.timing.deferMinMs, 'fenced');
  }

  /**
   * A fast-path run failed: its transaction rolled back (an ambiguous COMMIT was resolved by
   * `executeOnce`), so the key is as it was before, nothing to release. A store fault is
   * deferred, not stored (within the window).
   */
  async fastPathFailure(run: Run<P, M>, error: unknown): Promise<RunResult> {
    if (findStoreUnavailable(error)) return this.storeFault(run, error);
    if (error instanceof ClaimContendedError) return this.contended();
    const elsewhere = findDataLayerElsewhere(error);
    if (elsewhere) return this.dataLayerElsewhere(run, elsewhere);
    return this.unheldError(run, error, this.#isFinal(run.delivery, error));
  }

  /**
   * A run that holds no claim failed (a fast-path run, whose claim rolled back; a claim that met
   * a store fault): the failure recorded on the key when `final`, else a retry.
   */
  async unheldError(run: Run<P, M>, error: unknown, final: boolean): Promise<RunResult> {
    const { identity, fingerprint, claimOptions } = run;
    if (!final) {
      await this.#recordAttempt(run, error);
      return { outcome: { kind: 'retry', error } };
    }
    const failed = { kind: 'failed-permanently', error, description: describeFailure(identity, error) } as const;
    let recorded: ClaimOutcome;
    try {
      recorded = await this.#options.keys.recordFailure(identity.scope, identity.key, fingerprint, error, { ...claimOptions, leaseMs: this.#options.timing.leaseMs });
    } catch (recordError) {
      // Not recorded (recordFailure gave the key back if it could): run the job again later.
      if (findStoreUnavailable(recordError)) return this.deferStoreFault(run, recordError);
      // Refused for good: the job fails; its key was given back (see heldError).
      run.log.error({ err: recordError }, 'the failure could not be stored on the key: the key is released');
      return { outcome: failed, confirmed: false };
    }
    // Held or settled by another run meanwhile (a delivery of the key still running): nothing
    // was recorded; this job replays what that run decides, as any duplicate would.
    if (!isHeld(recorded)) return this.notHeld(recorded);
    return { outcome: failed, claim: recorded, confirmed: true };
  }

  /**
   * With `countAttemptsOnKey`, a failed run that holds no claim (its fast-path claim rolled
   * back) is recorded as an attempt: the key claimed and released at once, with the error, so
   * the next run's claim counts one more. A key held or settled by someone else meanwhile gets
   * nothing (that run counts itself). Best effort: a store fault leaves the attempt uncounted.
   */
  async #recordAttempt(run: Run<P, M>, error: unknown): Promise<void> {
    if (!this.#options.countAttemptsOnKey) return;
    const { identity, fingerprint, claimOptions, log } = run;
    const { keys } = this.#options;
    try {
      const outcome = await keys.claim(identity.scope, identity.key, fingerprint, claimOptions);
      if (isHeld(outcome)) await keys.release(outcome, error);
    } catch (recordError) {
      log.warn({ err: recordError }, 'could not record the failed attempt on the key; it goes uncounted');
    }
  }

  /**
   * True when the error should be stored: permanent by disposition, or the delivery's last
   * attempt. A step mismatch always is: another attempt would run the same handler against the
   * same steps.
   */
  #isFinal(delivery: Delivery<M>, error: unknown): boolean {
    if (error instanceof StepMismatchError) return true;
    const disposition = (this.#options.errorDisposition ?? defaultErrorDisposition)(error, delivery.message);
    return disposition === 'fail' || delivery.lastAttempt;
  }
}

/** The {@link DataLayerElsewhereError} in `error` or its causes (a handler may wrap what `ctx.transaction` threw). */
function findDataLayerElsewhere(error: unknown): DataLayerElsewhereError | undefined {
  for (let seen = error, depth = 0; seen !== undefined && seen !== null && depth < 10; seen = (seen as { cause?: unknown }).cause, depth++) {
    if (seen instanceof DataLayerElsewhereError) return seen;
  }
  return undefined;
}
