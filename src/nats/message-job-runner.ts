import type { Transaction } from 'kysely';
import type { Logger } from 'pino';
import { deferralMs, storeRetryDelayMs, type ResolvedWorkerTiming } from '../config/worker-timing.js';
import {
  ClaimContendedError,
  IdempotencyError,
  KeyFailedError,
  KeyReusedError,
  LeaseLostError,
  StepMismatchError,
  StepsUnsupportedError,
  ValidationError,
  findStoreUnavailable,
} from '../errors.js';
import type { FaultHook, FaultPoint } from '../fault-hook.js';
import type { JobContext, WorkerEventKind } from '../bullmq/idempotent-worker.js';
import type { JobIdentity } from '../bullmq/job-identity.js';
import { JobLogger } from '../bullmq/job-logger.js';
import type { ClaimOptions, IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { JobSteps, type DatabaseStep, type ExternalStep, type StepReport } from '../protocol/job-steps.js';
import type { FailedStep } from '../protocol/validate.js';
import type { Claim, HeldClaim } from '../store/claim-outcome.js';

/**
 * What a handler receives for one broker message whose key this consumer holds: the BullMQ
 * worker's {@link JobContext} (data, key, scope, fence, attempt, signal, transaction, step)
 * with the broker's message in place of the BullMQ job. A handler typed against
 * `Omit<JobContext, 'job'>` runs unchanged on BullMQ and on the brokers.
 */
export interface MessageContext<P, M> extends Omit<JobContext<P>, 'job'> {
  /** The broker's message, as received. */
  readonly message: M;
}

/** What a thrown error does: `'retry'` releases the key for a redelivery; `'fail'` stores it for good. */
export type MessageErrorDisposition = 'retry' | 'fail';

/**
 * What became of one message, for the broker adapter to say in its own vocabulary:
 * - `completed`, `replayed`: settled (ack);
 * - `deferred` (the key is in progress elsewhere, or this run was fenced out), `retry` (a
 *   retryable handler error; the key was released), `store-unavailable` (Postgres faulted):
 *   deliver again after `delayMs`;
 * - `failed` (stored for good), `replayed-failure`, `key-reused`, `invalid`: never to run;
 *   dead-letter with `reason`;
 * - `abandoned`: the consumer is closing and released the key; deliver again at once.
 */
export type MessageOutcome =
  | { readonly kind: 'completed' | 'replayed' }
  | { readonly kind: 'deferred' | 'retry' | 'store-unavailable'; readonly delayMs: number }
  | { readonly kind: 'failed' | 'replayed-failure' | 'key-reused' | 'invalid'; readonly reason: string }
  | { readonly kind: 'abandoned' };

/** One message as the runner sees it: how to read it and how many times it was delivered. */
export interface RunnableMessage<M> {
  readonly message: M;
  /** A short name for logs and error messages, e.g. `stream ORDERS seq 42`. */
  readonly label: string;
  /** 1 on the first delivery. */
  readonly deliveryCount: number;
  /** Called at every lease heartbeat while the handler runs (JetStream: `working()`). */
  readonly onHeartbeat?: () => void;
}

/** Everything the runner needs, resolved by the consumer that owns it. */
export interface MessageJobRunnerOptions<P, R, M> {
  readonly keys: IdempotencyKeys;
  readonly timing: ResolvedWorkerTiming;
  readonly handler: (ctx: MessageContext<P, M>) => Promise<R>;
  readonly identityOf: (message: M) => JobIdentity<P>;
  /** Claims of the key before its error is stored for good (claims, not deliveries: deferrals use none). */
  readonly maxAttempts: number;
  /** Delay before the redelivery after a retryable error; doubles per claim. */
  readonly retryDelayMs: number;
  readonly retryDelayMaxMs: number;
  readonly errorDisposition?: (error: unknown, message: M) => MessageErrorDisposition;
  readonly storePayload: boolean;
  /** Kept on the key's row for operators (the `queue` column). */
  readonly source: string;
  readonly logger: Logger;
  readonly faultHook?: FaultHook;
  /** Receives every event with the message it concerns. */
  readonly emit: (event: RunnerEvent, message: M) => void;
}

/** One thing that happened to a message; the consumer turns it into its own event. */
export interface RunnerEvent {
  readonly kind: WorkerEventKind;
  readonly label: string;
  readonly scope?: string;
  readonly key?: string;
  readonly fence?: number;
  readonly durationMs?: number;
  readonly step?: string;
  readonly position?: number;
}

/** The consumer is shutting down and released this message's key. */
export class ConsumerClosingError extends Error {
  constructor() {
    super('The consumer is shutting down; the key was released for another consumer.');
    this.name = 'ConsumerClosingError';
  }
}

interface ActiveRun {
  readonly claim: Claim;
  readonly controller: AbortController;
}

/**
 * The claim protocol for one broker message, as the BullMQ worker runs it for a job: claim the
 * key under a lease, run the handler with its context while a heartbeat extends the lease,
 * commit the effect with the completion, and say what the broker should do with the message.
 * Knows nothing of any broker.
 */
export class MessageJobRunner<P, R, M> {
  readonly #o: MessageJobRunnerOptions<P, R, M>;
  readonly #active = new Set<ActiveRun>();

  constructor(options: MessageJobRunnerOptions<P, R, M>) {
    this.#o = Object.freeze({ ...options });
  }

  /** Runs one message to an outcome. Never throws for anything the message or the store did. */
  async run(delivery: RunnableMessage<M>): Promise<MessageOutcome> {
    let identity: JobIdentity<P> | undefined;
    let fingerprint: string;
    try {
      identity = this.#o.identityOf(delivery.message);
      fingerprint = this.#o.keys.fingerprint(identity.fingerprintOf);
    } catch (error) {
      const named = identity ? ` (scope "${identity.scope}", key "${identity.key}")` : '';
      const reason = `${delivery.label}${named} was not run: ${(error as Error).message}`;
      this.#emit('invalid', delivery);
      this.#o.logger.warn({ message: delivery.label, outcome: 'invalid' }, reason);
      return { kind: 'invalid', reason };
    }
    const log = new JobLogger(this.#o.logger, { message: delivery.label, scope: identity.scope, key: identity.key });
    const claimOptions: ClaimOptions = {
      leaseMs: this.#o.timing.leaseMs,
      jobId: delivery.label,
      queue: this.#o.source,
      ...(this.#o.storePayload ? { payload: identity.payload } : {}),
    };
    let outcome;
    try {
      outcome = await this.#o.keys.claim(identity.scope, identity.key, fingerprint, claimOptions);
    } catch (error) {
      if (error instanceof ValidationError) {
        this.#emit('invalid', delivery, identity);
        log.warn({ outcome: 'invalid', err: error }, error.message);
        return { kind: 'invalid', reason: describeFailure(identity, error) };
      }
      if (error instanceof ClaimContendedError) return this.#defer(delivery, identity, this.#o.timing.deferMinMs, log);
      return this.#storeUnavailable(delivery, identity, error, log);
    }
    switch (outcome.kind) {
      case 'completed':
        this.#emit('replayed', delivery, identity);
        log.info({ outcome: 'replayed' }, 'key already completed: acknowledging without running');
        return { kind: 'replayed' };
      case 'failed': {
        this.#emit('replayed-failure', delivery, identity);
        const error = new KeyFailedError(outcome.scope, outcome.key, outcome.error);
        log.info({ outcome: 'replayed-failure' }, error.message);
        return { kind: 'replayed-failure', reason: error.message };
      }
      case 'key-reused': {
        this.#emit('key-reused', delivery, identity);
        const error = new KeyReusedError(outcome.scope, outcome.key);
        log.warn({ outcome: 'key-reused' }, error.message);
        return { kind: 'key-reused', reason: `${delivery.label}: ${error.message}` };
      }
      case 'in-progress':
        return this.#defer(delivery, identity, outcome.retryAfterMs, log);
    }
    this.#emit(outcome.kind, delivery, identity, outcome);
    log.info({ fence: outcome.fence, outcome: outcome.kind }, 'key claimed');
    await this.#fault('after-claim', identity);
    return this.#runLeased(delivery, identity, outcome, log.with({ fence: outcome.fence }));
  }

  /** Messages whose handler is running now. */
  get activeCount(): number {
    return this.#active.size;
  }

  /**
   * Aborts every running handler (their `ctx.signal` fires with a {@link ConsumerClosingError})
   * and releases their keys, so that the redelivered messages are taken over at once.
   */
  async abandonAll(): Promise<void> {
    await Promise.all(
      [...this.#active].map(async (active) => {
        active.controller.abort(new ConsumerClosingError());
        await this.#o.keys.release(active.claim, new ConsumerClosingError()).catch(() => false);
      }),
    );
  }

  async #runLeased(delivery: RunnableMessage<M>, identity: JobIdentity<P>, claim: HeldClaim, log: JobLogger): Promise<MessageOutcome> {
    const controller = new AbortController();
    const active: ActiveRun = { claim, controller };
    this.#active.add(active);
    const stopHeartbeat = this.#startHeartbeat(delivery, identity, claim, controller, log);
    const startedAt = performance.now();
    let committed = false;
    let steps: JobSteps | undefined;
    const commit = async (effect: (tx: Transaction<any>) => Promise<unknown>) => {
      if (controller.signal.aborted) throw controller.signal.reason;
      await steps?.assertComplete();
      const result = await this.#o.keys.commitEffect(claim, effect, () => this.#fault('before-commit', identity));
      committed = true;
      stopHeartbeat();
      return result;
    };
    const ctx: MessageContext<P, M> = {
      data: identity.payload,
      key: identity.key,
      scope: identity.scope,
      fence: claim.fence,
      attempt: claim.attempts,
      message: delivery.message,
      signal: controller.signal,
      transaction: ((fn: (tx: Transaction<any>) => Promise<unknown>) => {
        if (committed) throw new Error('ctx.transaction may be called only once per message.');
        return commit(fn);
      }) as MessageContext<P, M>['transaction'],
      step: ((name: string, body: ExternalStep<unknown> | DatabaseStep<unknown>) => {
        if (committed) throw new Error(`ctx.step("${name}") was called after ctx.transaction: the key is completed; call every step before it.`);
        if (!this.#o.keys.supportsSteps) throw new StepsUnsupportedError(claim.scope, claim.key, 'the key store keeps no step records (KeyStore.steps).');
        steps ??= new JobSteps(this.#o.keys, claim, controller.signal, (report) => this.#emitStep(delivery, claim, report));
        return steps.run(name, body);
      }) as MessageContext<P, M>['step'],
    };
    try {
      const returned = await this.#o.handler(ctx);
      if (!committed) await commit(async () => returned);
      await this.#fault('after-commit', identity);
      const durationMs = performance.now() - startedAt;
      this.#emit('completed', delivery, identity, claim, durationMs);
      log.info({ outcome: 'completed', durationMs: Math.round(durationMs) }, 'effect committed');
      return { kind: 'completed' };
    } catch (error) {
      if (committed) {
        log.warn({ err: error }, 'handler threw after its transaction committed; the message completes with the stored result');
        return { kind: 'completed' };
      }
      stopHeartbeat();
      return await this.#settleHeldFailure(delivery, identity, claim, controller.signal, error, log, steps?.failedStep(error));
    } finally {
      stopHeartbeat();
      this.#active.delete(active);
    }
  }

  async #settleHeldFailure(
    delivery: RunnableMessage<M>,
    identity: JobIdentity<P>,
    claim: Claim,
    signal: AbortSignal,
    error: unknown,
    log: JobLogger,
    step?: FailedStep,
  ): Promise<MessageOutcome> {
    if (error instanceof LeaseLostError || signal.reason instanceof LeaseLostError) {
      this.#emit('fenced', delivery, identity, claim);
      log.warn({ outcome: 'fenced' }, 'completion fenced: the key was taken over; deferring this message to replay');
      return this.#defer(delivery, identity, this.#o.timing.deferMinMs, log);
    }
    if (signal.reason instanceof ConsumerClosingError) {
      this.#emit('released', delivery, identity, claim);
      return { kind: 'abandoned' };
    }
    if (findStoreUnavailable(error)) return this.#storeUnavailable(delivery, identity, error, log, claim);
    if (this.#isFinal(delivery, claim, error)) {
      let stored: boolean;
      try {
        stored = await this.#o.keys.fail(claim, error, step);
      } catch (failError) {
        if (findStoreUnavailable(failError)) return this.#storeUnavailable(delivery, identity, failError, log, claim);
        stored = false;
      }
      if (stored) this.#emit('failed', delivery, identity, claim);
      log.warn({ outcome: 'failed', err: error, step: step?.name }, 'message failed permanently; error stored for replay');
      return { kind: 'failed', reason: describeFailure(identity, error, step) };
    }
    const released = await this.#o.keys.release(claim, error, step).catch(() => false);
    if (released) this.#emit('released', delivery, identity, claim);
    const delayMs = Math.min(this.#o.retryDelayMaxMs, this.#o.retryDelayMs * 2 ** Math.min(30, claim.attempts - 1));
    log.info({ outcome: 'released', err: error, step: step?.name, delayMs }, 'retryable error: key released for a redelivery');
    return { kind: 'retry', delayMs };
  }

  /** Final when stored by disposition, a step mismatch, or the key's last claim. */
  #isFinal(delivery: RunnableMessage<M>, claim: Claim, error: unknown): boolean {
    if (error instanceof StepMismatchError) return true;
    const disposition = (this.#o.errorDisposition ?? defaultErrorDisposition)(error, delivery.message);
    return disposition === 'fail' || claim.attempts >= this.#o.maxAttempts;
  }

  #defer(delivery: RunnableMessage<M>, identity: JobIdentity<P>, retryAfterMs: number, log: JobLogger): MessageOutcome {
    const delayMs = deferralMs(this.#o.timing, retryAfterMs);
    this.#emit('deferred', delivery, identity);
    log.info({ outcome: 'deferred', delayMs }, 'key in progress elsewhere: redelivering the message later');
    return { kind: 'deferred', delayMs };
  }

  /**
   * Postgres faulted: gives the key back when this run holds it (best effort: the lease expires
   * anyway) and asks for a redelivery that backs off with the message's deliveries.
   */
  async #storeUnavailable(delivery: RunnableMessage<M>, identity: JobIdentity<P>, error: unknown, log: JobLogger, held?: Claim): Promise<MessageOutcome> {
    const fault = findStoreUnavailable(error);
    if (!fault) throw error;
    if (held) {
      const released = await this.#o.keys.release(held, fault).catch(() => false);
      if (released) this.#emit('released', delivery, identity, held);
    }
    const delayMs = storeRetryDelayMs(this.#o.timing, delivery.deliveryCount - 1);
    this.#emit('store-unavailable', delivery, identity, held);
    log.warn({ outcome: 'store-unavailable', delayMs, err: fault }, 'Postgres unavailable: redelivering the message later');
    return { kind: 'store-unavailable', delayMs };
  }

  /**
   * Extends the lease every `heartbeatMs` and tells the broker the message is being worked on;
   * on a lost lease, aborts the handler's signal. One extension at a time; a failed extension
   * is retried at the next beat (completion is fenced anyway).
   */
  #startHeartbeat(delivery: RunnableMessage<M>, identity: JobIdentity<P>, claim: Claim, controller: AbortController, log: JobLogger): () => void {
    let stopped = false;
    let inFlight = false;
    const stop = () => {
      stopped = true;
      clearInterval(timer);
    };
    const timer = setInterval(async () => {
      if (stopped) return;
      // The broker's redelivery timer is reset while the lease is held, whether or not Postgres
      // answers this beat: a lost lease stops the beats.
      delivery.onHeartbeat?.();
      if (inFlight) return;
      inFlight = true;
      try {
        const extension = await this.#o.keys.extend(claim, this.#o.timing.leaseMs);
        if (stopped) return;
        if (extension === 'completed') {
          stop();
        } else if (extension === null) {
          stop();
          this.#emit('lease-lost', delivery, identity, claim);
          log.warn({ outcome: 'lease-lost' }, 'lease lost: another consumer took the key over');
          controller.abort(new LeaseLostError(claim.scope, claim.key, claim.fence));
        } else {
          this.#emit('lease-extended', delivery, identity, claim);
        }
      } catch (error) {
        if (!stopped) log.warn({ err: error }, 'lease heartbeat failed; trying again at the next beat');
      } finally {
        inFlight = false;
      }
    }, this.#o.timing.heartbeatMs);
    timer.unref();
    return stop;
  }

  async #fault(point: FaultPoint, identity: JobIdentity<P>): Promise<void> {
    if (this.#o.faultHook) await this.#o.faultHook(point, { scope: identity.scope, key: identity.key });
  }

  #emit(kind: WorkerEventKind, delivery: RunnableMessage<M>, identity?: JobIdentity<P>, claim?: Claim, durationMs?: number): void {
    this.#o.emit({ kind, label: delivery.label, scope: identity?.scope, key: identity?.key, fence: claim?.fence, durationMs }, delivery.message);
  }

  #emitStep(delivery: RunnableMessage<M>, claim: Claim, report: StepReport): void {
    this.#o.emit({
      kind: `step-${report.outcome}`,
      label: delivery.label,
      scope: claim.scope,
      key: claim.key,
      fence: claim.fence,
      step: report.name,
      position: report.position,
    }, delivery.message);
  }
}

/** `'fail'` for validation errors, unstorable results and step errors; `'retry'` for the rest. */
export function defaultErrorDisposition(error: unknown): MessageErrorDisposition {
  if (error instanceof IdempotencyError && (error.code === 'RESULT_NOT_STORABLE' || error instanceof ValidationError)) return 'fail';
  if (error instanceof StepsUnsupportedError || error instanceof StepMismatchError) return 'fail';
  return 'retry';
}

function describeFailure(identity: JobIdentity, error: unknown, step?: FailedStep): string {
  const message = error instanceof Error ? error.message : String(error);
  const where = step ? ` at step "${step.name}" (position ${step.position})` : '';
  return `Message for key "${identity.key}" in scope "${identity.scope}" failed${where}: ${message}`;
}
