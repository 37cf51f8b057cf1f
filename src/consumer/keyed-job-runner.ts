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
  StoreUnavailableError,
  ValidationError,
  findStoreUnavailable,
} from '../errors.js';
import type { FaultHook, FaultPoint } from '../fault-hook.js';
import type { ClaimOptions, IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { JobSteps, type DatabaseStep, type ExternalStep, type StepReport } from '../protocol/job-steps.js';
import type { FailedStep } from '../protocol/validate.js';
import type { Claim, ClaimOutcome, HeldClaim } from '../store/claim-outcome.js';
import type { LeadingStatements } from '../store/one-trip-commit.js';
import type { KeySettledListener } from '../store/key-settled-listener.js';
import type { JobIdentity } from '../bullmq/job-identity.js';
import { JobLogger } from '../bullmq/job-logger.js';
import type { WorkerEvent, WorkerEventKind } from './worker-event.js';
import { handlerForm, type DatabaseOnlyContext, type DatabaseOnlyHandler, type KeyedJobHandler } from './database-only-handler.js';

/**
 * What a handler receives for one message whose key this consumer holds, on any broker. The
 * BullMQ worker's `JobContext` adds `job`; broker consumers name their message in `message`.
 */
export interface KeyedJobContext<P = unknown, M = unknown> {
  /** The payload (`payload` under the wire contract). */
  readonly data: P;
  /** The message's idempotency key, which this consumer holds under a lease (or, on the fast path, inside the open transaction). */
  readonly key: string;
  /** The key's scope. */
  readonly scope: string;
  /** The claim's fence; pass it downstream if the downstream can fence too. */
  readonly fence: number;
  /** How many times the key has been claimed: 1 first, more after takeovers and retries. */
  readonly attempt: number;
  /** The broker's message (a BullMQ `Job`, an AMQP `ConsumeMessage`, a JetStream `JsMsg`). */
  readonly message: M;
  /** Fires when the lease is lost (reason: `LeaseLostError`) or the consumer is shutting down. */
  readonly signal: AbortSignal;
  /**
   * Runs `fn(tx)` in a transaction that also completes the key, storing `fn`'s return value:
   * the effect and the completion commit together or not at all. Call it at most once.
   */
  transaction<T>(fn: (tx: Transaction<any>) => Promise<T>): Promise<T>;
  /**
   * An external step of a multi-step job (a call to another system), `ctx.step(name, async
   * (step) => …)`: recorded under the key and `name` when it succeeds, so that a later run of
   * the key (a retry, a takeover) returns the recorded result without running it and goes on
   * at the first step not recorded. At most once per lease: it runs again only under a new
   * claim, when the last one died before recording it. Pass `step.stepKey` downstream;
   * `step.starts` counts its starts. Its record rides with the run's next round trip (the next
   * step, or the completion), which makes it durable before anything after it runs.
   *
   * Call steps before `ctx.transaction` (which stays the completion), in the same order with
   * the same names on every run; names are unique within a run (else `StepMismatchError`).
   * Resolves to the result as stored (its JSON form), on the first run as on replays. Not
   * available on the fast path (throws `StepsUnsupportedError`).
   */
  step<T>(name: string, run: ExternalStep<T>): Promise<T>;
  /**
   * A database step of a multi-step job, `ctx.step(name, { transaction: async (tx, step) =>
   * … })`: exactly once, since its writes and its record commit together in one transaction. A
   * later run of the key returns the recorded result without running it. The same rules as an
   * external step: before `ctx.transaction`, the same order and names on every run, not on the
   * fast path.
   */
  step<T>(name: string, database: DatabaseStep<T>): Promise<T>;
}

/** What a thrown error does: `'retry'` releases the key for the broker's redelivery; `'fail'` stores it for good. */
export type ErrorDisposition = 'retry' | 'fail';

/** One delivery of a message, as its adapter describes it to the runner. */
export interface Delivery<M> {
  /** What the handler sees as `ctx.message`. */
  readonly message: M;
  /** The broker's id of the message (a job id, an AMQP message id), for logs, events and the key's row. */
  readonly id: string | undefined;
  /** How logs and errors name the delivery, e.g. `Job 7 on queue "payments"`. */
  readonly label: string;
  /** The queue (or stream, subject) and the message's name, kept on the key's row for operators. */
  readonly queue: string;
  /** The message's name (a BullMQ job name; broker consumers use the queue's or subject's name). */
  readonly name: string;
  /** True when a retryable error must be stored anyway: the broker will not deliver it again. */
  readonly lastAttempt: boolean;
  /** How often this message was deferred (or redelivered) without using an attempt; backs off store faults. */
  readonly deferrals: number;
  /** The broker's own cancellation of this delivery, if it has one. */
  readonly signal?: AbortSignal;
}

/**
 * What became of one delivery, for the adapter to say in its broker's vocabulary. Every kind
 * has been logged and emitted as a {@link WorkerEvent} already.
 *
 * - `completed`: the effect committed under this claim; acknowledge.
 * - `replayed`: the key was completed before; nothing ran; acknowledge (`result` is the stored one).
 * - `replayed-failure`: the key failed permanently before; nothing ran.
 * - `key-reused`: the key was used with another payload; never run.
 * - `invalid-message`: the message cannot be read (no key, bad JSON…); no delivery can do better.
 * - `deferred`: another consumer holds the key (or this one was fenced out, or the claim kept
 *   racing); deliver again after `retryAfterMs`, without counting a failed delivery.
 * - `store-unavailable`: Postgres failed, not the handler; deliver again after `retryAfterMs`,
 *   without counting a failed delivery. Never a failure.
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
      /** The stored result of the run that completed the key. */
      readonly result: unknown;
    }
  | {
      /** The key failed permanently before; nothing ran. */
      readonly kind: 'replayed-failure';
      /** Carries the stored error. */
      readonly error: KeyFailedError;
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
      /** Why: another owner's live lease, a contended claim, or this run's claim fenced out. */
      readonly reason: 'in-progress' | 'contended' | 'fenced';
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
  /** Which handler errors are stored for good. @defaultValue {@link defaultErrorDisposition} */
  readonly errorDisposition?: (error: unknown, message: M) => ErrorDisposition;
  /**
   * See `IdempotentWorkerOptions.fastPath`.
   * @defaultValue `true` for a database-only handler, `false` for a function
   */
  readonly fastPath?: boolean;
  /** Needed for `timing.waitMs > 0`: wakes a waiting duplicate when the owner finishes. @defaultValue unset (no waiting) */
  readonly listener?: KeySettledListener;
  /** Keep each payload on its key. @defaultValue `false` */
  readonly storePayload?: boolean;
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

interface ActiveRun<M> {
  readonly delivery: Delivery<M>;
  readonly claim: Claim | undefined;
  readonly controller: AbortController;
}

class WorkerClosingError extends Error {
  constructor() {
    super('The worker is shutting down; the key was released for another worker.');
    this.name = 'WorkerClosingError';
  }
}

/**
 * The claim protocol around one handler, for any broker: claim the message's key, replay or
 * refuse or defer when it is not this consumer's to run, else run the handler under a fenced
 * lease (heartbeat, steps, `ctx.transaction`) and complete, release or fail the key. Returns a
 * {@link RunOutcome}; the adapter acknowledges, delays or dead-letters the message accordingly.
 *
 * @example
 * ```ts
 * import { KeyedJobRunner, identityFromWireContract, resolveWorkerTiming, type JobIdentity } from 'idempotent-jobs';
 * import { pino } from 'pino';
 *
 * // An adapter for another broker, whose messages carry the wire contract as their body.
 * interface BrokerMessage {
 *   readonly id: string;
 *   readonly body: unknown;
 * }
 * const runner = new KeyedJobRunner<{ cents: number }, void, BrokerMessage>({
 *   keys,
 *   timing: resolveWorkerTiming({}, keys.options.leaseMs),
 *   identityOf: (message) => identityFromWireContract({ id: message.id, name: 'orders', data: message.body }) as JobIdentity<{ cents: number }>,
 *   handler: async (ctx) => {
 *     await ctx.transaction((tx) => tx.insertInto('ledger').values({ order_id: ctx.key, cents: ctx.data.cents }).execute());
 *   },
 *   logger: pino(),
 * });
 *
 * const message: BrokerMessage = { id: '7', body: { idempotencyKey: 'order-42', payload: { cents: 1999 } } };
 * const outcome = await runner.run({ message, id: message.id, label: 'Message 7', queue: 'orders', name: 'orders', lastAttempt: false, deferrals: 0 });
 * if (outcome.kind === 'deferred' || outcome.kind === 'store-unavailable') {
 *   // deliver it again after outcome.retryAfterMs, without counting a failed delivery
 * }
 * ```
 */
export class KeyedJobRunner<P = unknown, R = unknown, M = unknown> {
  readonly #options: KeyedJobRunnerOptions<P, R, M>;
  readonly #keys: IdempotencyKeys;
  readonly #timing: ResolvedWorkerTiming;
  readonly #log: Logger;
  readonly #active = new Set<ActiveRun<M>>();
  /** The handler as a function of the full context (a database-only one wrapped in `ctx.transaction`). */
  readonly #handler: (ctx: KeyedJobContext<P, M>) => Promise<unknown>;
  /** A database-only handler: its transaction may share a group's (see `EffectOptions.databaseOnly`). */
  readonly #databaseOnly: boolean;
  readonly #fastPath: boolean;

  constructor(options: KeyedJobRunnerOptions<P, R, M>) {
    this.#options = Object.freeze({ ...options });
    this.#keys = options.keys;
    this.#timing = options.timing;
    this.#log = options.logger;
    if (this.#timing.waitMs > 0 && !options.listener) {
      throw new ValidationError('INVALID_OPTIONS', 'listener', 'waitMs > 0 needs a KeySettledListener (option listener).');
    }
    const handler = options.handler;
    this.#databaseOnly = handlerForm(handler) === 'database-only';
    this.#handler = this.#databaseOnly
      ? runsInOneTransaction(handler as DatabaseOnlyHandler<P, R, DatabaseOnlyContext<P, M>>)
      : (handler as (ctx: KeyedJobContext<P, M>) => Promise<R>);
    // A database-only handler is one transaction: nothing of a run that rolled back is seen
    // outside it, so the single-transaction path is safe for it by construction.
    this.#fastPath = options.fastPath ?? this.#databaseOnly;
  }

  /** Deliveries being run now. */
  get activeCount(): number {
    return this.#active.size;
  }

  /**
   * The shutdown deadline passed: aborts every active handler (its `ctx.signal` fires), releases
   * the keys they hold so another consumer takes them over at once, and returns their
   * deliveries, whose runs end as `abandoned`, for the adapter to give back to the broker.
   */
  async abandonActive(): Promise<Delivery<M>[]> {
    const abandoned = [...this.#active];
    if (abandoned.length > 0) this.#log.warn({ active: abandoned.length }, 'shutdown deadline passed: releasing keys of unfinished jobs');
    await Promise.all(
      abandoned.map(async (active) => {
        active.controller.abort(new WorkerClosingError());
        if (active.claim) {
          const released = await this.#keys.release(active.claim, new WorkerClosingError()).catch(() => false);
          if (released) this.#emit('released', active.delivery, active.claim);
        }
      }),
    );
    return abandoned.map((active) => active.delivery);
  }

  /**
   * Runs one delivery. Rejects only with an error that is neither the handler's nor a store
   * fault (a bug); the adapter should treat that like `retry`.
   */
  async run(delivery: Delivery<M>): Promise<RunOutcome> {
    let identity: JobIdentity<P> | undefined;
    let fingerprint: string;
    try {
      identity = this.#options.identityOf(delivery.message);
      // Inside the try: a custom identityOf may return what cannot be fingerprinted (too deep,
      // say), which no retry can mend.
      fingerprint = this.#keys.fingerprint(identity.fingerprintOf);
    } catch (error) {
      this.#emit('invalid', delivery, undefined, identity);
      const named = identity ? ` (scope "${identity.scope}", key "${identity.key}")` : '';
      const reason = `${delivery.label}${named} was not run: ${(error as Error).message}`;
      this.#log.warn({ jobId: delivery.id, outcome: 'invalid' }, reason);
      return { kind: 'invalid-message', reason, error };
    }
    const { scope, key } = identity;
    const log = new JobLogger(this.#log, { jobId: delivery.id, scope, key });
    const claimOptions: ClaimOptions = {
      leaseMs: this.#timing.leaseMs,
      jobId: delivery.id,
      queue: delivery.queue,
      jobName: delivery.name,
      ...(this.#options.storePayload ? { payload: identity.payload } : {}),
    };
    const run = { delivery, identity, log };

    if (this.#fastPath) return this.#runFastPath(run, fingerprint, claimOptions);

    let outcome: ClaimOutcome;
    try {
      outcome = await this.#keys.claim(scope, key, fingerprint, claimOptions);
      if (outcome.kind === 'in-progress' && this.#timing.waitMs > 0) {
        outcome = await this.#waitForOwner(outcome, fingerprint, claimOptions);
      }
    } catch (error) {
      // Refused before anything was claimed (a payload storePayload cannot keep): no attempt can do better.
      if (error instanceof ValidationError) {
        this.#emit('invalid', delivery, undefined, identity);
        log.warn({ outcome: 'invalid', err: error }, error.message);
        return { kind: 'invalid-message', reason: describeFailure(identity, error), error };
      }
      if (error instanceof ClaimContendedError) return this.#deferContended(run);
      return this.#deferAfterStoreFault(run, error);
    }
    if (outcome.kind !== 'claimed' && outcome.kind !== 'taken-over') return this.#settleUnheld(run, outcome);
    this.#emit(outcome.kind, delivery, outcome);
    log.info({ fence: outcome.fence, outcome: outcome.kind }, 'key claimed');
    await this.#fault('after-claim', identity);
    return this.#runLeased({ ...run, log: log.with({ fence: outcome.fence }) }, outcome);
  }

  /** Outcomes where this consumer does not hold the key: replay, refuse, or defer. */
  #settleUnheld(run: Run<P, M>, outcome: Exclude<ClaimOutcome, HeldClaim>): RunOutcome {
    const { delivery, log } = run;
    switch (outcome.kind) {
      case 'completed':
        this.#emit('replayed', delivery, undefined, run.identity);
        log.info({ outcome: 'replayed' }, 'key already completed: replaying its result');
        return { kind: 'replayed', result: outcome.result };
      case 'failed': {
        this.#emit('replayed-failure', delivery, undefined, run.identity);
        const error = new KeyFailedError(outcome.scope, outcome.key, outcome.error);
        log.info({ outcome: 'replayed-failure' }, error.message);
        return { kind: 'replayed-failure', error };
      }
      case 'key-reused': {
        this.#emit('key-reused', delivery, undefined, run.identity);
        const error = new KeyReusedError(outcome.scope, outcome.key);
        log.warn({ outcome: 'key-reused' }, error.message);
        return { kind: 'key-reused', error };
      }
      case 'in-progress':
        return this.#defer(run, outcome.retryAfterMs, 'in-progress');
    }
  }

  /** Deferral without using an attempt, to replay once the owner finishes. */
  #defer(run: Run<P, M>, retryAfterMs: number, reason: 'in-progress' | 'contended' | 'fenced'): RunOutcome {
    const delayMs = deferralMs(this.#timing, retryAfterMs);
    this.#emit('deferred', run.delivery, undefined, run.identity);
    run.log.info({ outcome: 'deferred', delayMs }, 'key in progress elsewhere: deferring the job');
    return { kind: 'deferred', retryAfterMs: delayMs, reason };
  }

  /**
   * A transient store fault (Postgres restarting, a dropped connection, …): gives the key back
   * when this delivery holds it (best effort: the lease expires anyway), and defers without
   * using an attempt. The delay backs off exponentially with the delivery's `deferrals`.
   * Rethrows any other error.
   */
  async #deferAfterStoreFault(run: Run<P, M>, error: unknown, held?: Claim): Promise<RunOutcome> {
    const fault = findStoreUnavailable(error);
    if (!fault) throw error;
    if (held) {
      const released = await this.#keys.release(held, fault).catch(() => false);
      if (released) this.#emit('released', run.delivery, held);
    }
    const delayMs = storeRetryDelayMs(this.#timing, run.delivery.deferrals);
    this.#emit('store-unavailable', run.delivery, held, held ? undefined : run.identity);
    run.log.warn({ outcome: 'store-unavailable', delayMs, err: fault }, 'Postgres unavailable: deferring the job without using an attempt');
    return { kind: 'store-unavailable', retryAfterMs: delayMs, error: fault };
  }

  /**
   * The claim kept racing other writers of the key (see {@link ClaimContendedError}): the key is
   * as good as in progress elsewhere, so the delivery is deferred like an in-progress duplicate.
   */
  #deferContended(run: Run<P, M>): RunOutcome {
    return this.#defer(run, this.#timing.deferMinMs, 'contended');
  }

  async #waitForOwner(outcome: ClaimOutcome & { kind: 'in-progress' }, fingerprint: string, claimOptions: ClaimOptions) {
    const { scope, key } = outcome;
    const settled = await this.#options.listener!.waitForSettled(scope, key, this.#timing.waitMs, async () => {
      const row = await this.#keys.get(scope, key);
      return row !== undefined && row.status !== 'processing';
    });
    return settled ? this.#keys.claim(scope, key, fingerprint, claimOptions) : outcome;
  }

  async #runLeased(run: Run<P, M>, claim: HeldClaim): Promise<RunOutcome> {
    const { delivery, identity, log } = run;
    const controller = new AbortController();
    const brokerSignal = delivery.signal;
    brokerSignal?.addEventListener('abort', () => controller.abort(brokerSignal.reason), { once: true });
    const active: ActiveRun<M> = { delivery, claim, controller };
    this.#active.add(active);
    const stopHeartbeat = this.#startHeartbeat(delivery, claim, controller, log);
    const startedAt = performance.now();
    let committed: { result: unknown } | undefined;
    // Created at the handler's first ctx.step: a handler without steps pays nothing for them.
    let steps: JobSteps | undefined;
    const commit = async (effect: (tx: Transaction<any>) => Promise<unknown>) => {
      if (controller.signal.aborted) throw controller.signal.reason;
      // A step record still held back commits ahead of the completion, in its first round trip.
      const complete = (record?: LeadingStatements) =>
        this.#keys.commitEffect(claim, effect, () => this.#fault('before-commit', identity), record, { databaseOnly: this.#databaseOnly });
      const result = steps ? await steps.complete(complete) : await complete();
      committed = { result };
      // The key is completed: an extension would find no lease and report it lost.
      stopHeartbeat();
      return result;
    };
    const ctx = this.#context(
      delivery,
      identity,
      claim,
      controller.signal,
      (fn) => {
        if (committed) throw new Error('ctx.transaction may be called only once per job.');
        return commit(fn);
      },
      (name, body) => {
        if (committed) throw new Error(`ctx.step("${name}") was called after ctx.transaction: the key is completed; call every step before it.`);
        if (!this.#keys.supportsSteps) throw new StepsUnsupportedError(claim.scope, claim.key, 'the key store keeps no step records (KeyStore.steps).');
        steps ??= new JobSteps(
          this.#keys,
          claim,
          controller.signal,
          (report) => this.#emit(`step-${report.outcome}`, delivery, claim, undefined, report.durationMs, report),
          { holdRecords: true },
        );
        return steps.run(name, body);
      },
    );
    try {
      const returned = await this.#handler(ctx);
      // An external-effect handler: its return value is the result, stored now, fenced.
      if (!committed) await commit(async () => returned);
      await this.#fault('after-commit', identity);
      const durationMs = performance.now() - startedAt;
      this.#emit('completed', delivery, claim, undefined, durationMs);
      log.info({ outcome: 'completed', durationMs: Math.round(durationMs) }, 'effect committed');
      return { kind: 'completed', result: committed!.result };
    } catch (error) {
      if (committed) {
        log.warn({ err: error }, 'handler threw after its transaction committed; the job completes with the stored result');
        return { kind: 'completed', result: committed.result };
      }
      // The steps that finished stay recorded: a record held back goes before the key is released.
      await steps?.flush();
      // Before the key is released or failed, after which an extension would find no lease.
      stopHeartbeat();
      return await this.#settleHeldFailure(run, claim, controller.signal, error, steps?.failedStep(error));
    } finally {
      stopHeartbeat();
      this.#active.delete(active);
    }
  }

  async #runFastPath(run: Run<P, M>, fingerprint: string, claimOptions: ClaimOptions): Promise<RunOutcome> {
    const { delivery, identity, log } = run;
    const controller = new AbortController();
    const active: ActiveRun<M> = { delivery, claim: undefined, controller };
    this.#active.add(active);
    const startedAt = performance.now();
    let outcome;
    // The effect runs again, under the same claim, when its optimistic group rolls back (see
    // group-commit.ts): the claim is announced once.
    let announced: Claim | undefined;
    try {
      outcome = await this.#keys.executeOnce(
        identity.scope,
        identity.key,
        fingerprint,
        async (tx, claim) => {
          if (announced?.owner !== claim.owner || announced.fence !== claim.fence) {
            this.#emit(claim.attempts > 1 ? 'taken-over' : 'claimed', delivery, claim);
            announced = claim;
          }
          let transactionResult: { value: unknown } | undefined;
          const ctx = this.#context(
            delivery,
            identity,
            claim,
            controller.signal,
            async (fn) => {
              if (transactionResult) throw new Error('ctx.transaction may be called only once per job.');
              transactionResult = { value: await fn(tx) };
              return transactionResult.value;
            },
            () => {
              throw new StepsUnsupportedError(
                identity.scope,
                identity.key,
                'this worker runs on the fast path (fastPath: true), where the whole handler is one transaction and nothing can be recorded apart from the completion. Use ctx.transaction, or turn fastPath off to use steps.',
              );
            },
          );
          const returned = await this.#handler(ctx);
          await this.#fault('before-commit', identity);
          return transactionResult ? transactionResult.value : returned;
        },
        { ...claimOptions, databaseOnly: this.#databaseOnly },
      );
    } catch (error) {
      return await this.#settleFastPathFailure(run, fingerprint, claimOptions, error);
    } finally {
      this.#active.delete(active);
    }
    if (outcome.kind !== 'executed') return this.#settleUnheld(run, outcome);
    await this.#fault('after-commit', identity);
    const durationMs = performance.now() - startedAt;
    this.#emit('completed', delivery, outcome.claim, undefined, durationMs);
    log.info({ outcome: 'completed', fence: outcome.claim.fence, durationMs: Math.round(durationMs) }, 'effect committed');
    return { kind: 'completed', result: outcome.result ?? null };
  }

  #context(
    delivery: Delivery<M>,
    identity: JobIdentity<P>,
    claim: Claim,
    signal: AbortSignal,
    transaction: (fn: (tx: Transaction<any>) => Promise<unknown>) => Promise<unknown>,
    step: (name: string, body: ExternalStep<unknown> | DatabaseStep<unknown>) => Promise<unknown>,
  ): KeyedJobContext<P, M> {
    return {
      data: identity.payload,
      key: identity.key,
      scope: identity.scope,
      fence: claim.fence,
      attempt: claim.attempts,
      message: delivery.message,
      signal,
      transaction: transaction as KeyedJobContext<P, M>['transaction'],
      step: step as KeyedJobContext<P, M>['step'],
    };
  }

  /**
   * Extends the lease every `heartbeatMs`; on loss, aborts the handler's signal. One extension
   * at a time: a beat that finds the previous one still waiting skips. An extension that fails
   * (Postgres unreachable, or a lock wait past its timeout because a transaction that is
   * completing the key holds it) is "not known yet": the next beat tries again, and completion
   * is fenced anyway. The key found completed by this claim is the job's own commit, never a loss.
   */
  #startHeartbeat(delivery: Delivery<M>, claim: Claim, controller: AbortController, log: JobLogger): () => void {
    let stopped = false;
    let inFlight = false;
    const stop = () => {
      stopped = true;
      clearInterval(timer);
    };
    const timer = setInterval(async () => {
      if (inFlight) return;
      inFlight = true;
      try {
        const extension = await this.#keys.extend(claim, this.#timing.leaseMs);
        if (stopped) return;
        if (extension === 'completed') {
          stop();
        } else if (extension === null) {
          stop();
          this.#emit('lease-lost', delivery, claim);
          log.warn({ outcome: 'lease-lost' }, 'lease lost: another worker took the key over');
          controller.abort(new LeaseLostError(claim.scope, claim.key, claim.fence));
        } else {
          this.#emit('lease-extended', delivery, claim);
        }
      } catch (error) {
        if (!stopped) log.warn({ err: error }, 'lease heartbeat failed; trying again at the next beat');
      } finally {
        inFlight = false;
      }
    }, this.#timing.heartbeatMs);
    timer.unref();
    return stop;
  }

  async #settleHeldFailure(run: Run<P, M>, claim: Claim, signal: AbortSignal, error: unknown, step?: FailedStep): Promise<RunOutcome> {
    const { delivery, identity, log } = run;
    if (error instanceof LeaseLostError || signal.reason instanceof LeaseLostError) {
      // Another consumer owns the key now and will finish it; this delivery becomes a duplicate.
      this.#emit('fenced', delivery, claim);
      log.warn({ outcome: 'fenced' }, 'completion fenced: the key was taken over; deferring this job to replay');
      return this.#defer(run, this.#timing.deferMinMs, 'fenced');
    }
    if (signal.reason instanceof WorkerClosingError) return { kind: 'abandoned', error }; // key already released by abandonActive()
    // Postgres, not the handler, failed (an ambiguous COMMIT was already resolved, as failed).
    if (findStoreUnavailable(error)) return this.#deferAfterStoreFault(run, error, claim);
    if (this.#isFinal(delivery, error)) {
      let stored: boolean;
      try {
        stored = await this.#keys.fail(claim, error, step);
      } catch (failError) {
        // The failure could not be recorded for now: run the job again later rather than lose it.
        if (findStoreUnavailable(failError)) return this.#deferAfterStoreFault(run, failError, claim);
        stored = false;
      }
      if (stored) this.#emit('failed', delivery, claim);
      log.warn({ outcome: 'failed', err: error, step: step?.name }, 'job failed permanently; error stored for replay');
      return { kind: 'failed-permanently', error, description: describeFailure(identity, error, step) };
    }
    const released = await this.#keys.release(claim, error, step).catch(() => false);
    if (released) this.#emit('released', delivery, claim);
    log.info({ outcome: 'released', err: error, step: step?.name }, 'retryable error: key released for the next attempt');
    return { kind: 'retry', error };
  }

  async #settleFastPathFailure(run: Run<P, M>, fingerprint: string, claimOptions: ClaimOptions, error: unknown): Promise<RunOutcome> {
    const { delivery, identity, log } = run;
    // The transaction rolled back (an ambiguous COMMIT was resolved by executeOnce): the key is
    // as it was before, nothing to release. A store fault is deferred, never stored.
    if (findStoreUnavailable(error)) return this.#deferAfterStoreFault(run, error);
    if (error instanceof ClaimContendedError) return this.#deferContended(run);
    if (!this.#isFinal(delivery, error)) {
      this.#emit('released', delivery, undefined, identity);
      log.info({ outcome: 'released', err: error }, 'retryable error: transaction rolled back');
      return { kind: 'retry', error };
    }
    let outcome: ClaimOutcome | undefined;
    try {
      outcome = await this.#keys.recordFailure(identity.scope, identity.key, fingerprint, error, { ...claimOptions, leaseMs: this.#timing.leaseMs });
    } catch (recordError) {
      // Not recorded (recordFailure gave the key back if it could): run the job again later.
      if (findStoreUnavailable(recordError)) return this.#deferAfterStoreFault(run, recordError);
    }
    if (outcome && (outcome.kind === 'claimed' || outcome.kind === 'taken-over')) this.#emit('failed', delivery, outcome);
    log.warn({ outcome: 'failed', err: error }, 'job failed permanently; error stored for replay');
    return { kind: 'failed-permanently', error, description: describeFailure(identity, error) };
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

  async #fault(point: FaultPoint, identity: JobIdentity<P>): Promise<void> {
    if (this.#options.faultHook) await this.#options.faultHook(point, { scope: identity.scope, key: identity.key });
  }

  #emit(kind: WorkerEventKind, delivery: Delivery<M>, claim?: Claim, identity?: JobIdentity<P>, durationMs?: number, step?: StepReport): void {
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

/**
 * A database-only handler as a function of the full context: its transaction is the job's one
 * `ctx.transaction`, and it sees the context without `transaction` and `step`, at run time as in
 * its type.
 */
function runsInOneTransaction<P, R, M>(handler: DatabaseOnlyHandler<P, R, DatabaseOnlyContext<P, M>>) {
  return (ctx: KeyedJobContext<P, M>): Promise<R> => {
    const { data, key, scope, fence, attempt, message, signal } = ctx;
    const narrowed: DatabaseOnlyContext<P, M> = { data, key, scope, fence, attempt, message, signal };
    return ctx.transaction((tx) => handler.transaction(tx, narrowed));
  };
}

interface Run<P, M> {
  readonly delivery: Delivery<M>;
  readonly identity: JobIdentity<P>;
  readonly log: JobLogger;
}

/**
 * The default {@link ErrorDisposition}: validation errors, unstorable results and step errors
 * are stored for good (no retry can mend them); everything else is retried.
 */
export function defaultErrorDisposition(error: unknown): ErrorDisposition {
  if (error instanceof IdempotencyError && (error.code === 'RESULT_NOT_STORABLE' || error instanceof ValidationError)) return 'fail';
  if (error instanceof StepsUnsupportedError || error instanceof StepMismatchError) return 'fail';
  return 'retry';
}

function describeFailure(identity: JobIdentity, error: unknown, step?: FailedStep): string {
  const message = error instanceof Error ? error.message : String(error);
  const where = step ? ` at step "${step.name}" (position ${step.position})` : '';
  return `Job for key "${identity.key}" in scope "${identity.scope}" failed${where}: ${message}`;
}
