import type { Logger } from 'pino';
import { describeError } from '../describe-error.js';
import { ClaimContendedError, StepsUnsupportedError, ValidationError } from '../errors.js';
import type { FaultPoint } from '../fault-hook.js';
import type { ClaimOptions } from '../protocol/effect-options.js';
import type { ConcurrencySlot, IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { JobSteps, type StepReport } from '../protocol/job-steps.js';
import { boundRetention } from '../protocol/key-retention.js';
import type { Claim, ClaimOutcome, HeldClaim } from '../store/claim-outcome.js';
import type { HeldRecord } from '../store/one-trip-commit.js';
import type { KeyRetention } from '../store/records.js';
import type { DataLayer } from '../store/data-layer.js';
import { sqlStateOf } from '../store/pg-errors.js';
import { generationKey } from '../store/coalescing-keys.js';
import { handlerForm, isDataLayerHandler, runsInOneTransaction, type DatabaseOnlyContext, type DatabaseOnlyHandler } from './database-only-handler.js';
import { jobContext, transactionOptionsOf, type Delivery, type KeyedJobContext, type TransactionOptions } from './job-context.js';
import { JobLogger } from './job-logger.js';
import { startLeaseHeartbeat } from './lease-heartbeat.js';
import { RunFailures, WorkerClosingError } from './run-failures.js';
import { describeFailure, passedTheStore, streakId, type Run, type RunOutcome, type RunResult } from './run-outcome.js';
import type { KeyedJobRunnerOptions } from './runner-options.js';
import { StoreFaultStreaks } from './store-fault-streaks.js';
import { concurrencyLimitsOf, type ConcurrencyLimit, type JobIdentity } from './wire-contract.js';
import type { WorkerEventKind } from './worker-event.js';
import type { ResolvedWorkerTiming } from './worker-timing.js';

/** What an event concerns: the claim, or else the identity read from the message; a duration, a step. */
interface EventAbout<P> {
  readonly claim?: Claim;
  readonly identity?: JobIdentity<P>;
  readonly durationMs?: number;
  readonly step?: StepReport;
  readonly cause?: string;
  readonly retentionPart?: keyof KeyRetention;
  /** On `concurrency-limited`: the concurrency key that was at its limit. */
  readonly concurrencyKey?: string;
}

interface ActiveRun<M> {
  readonly delivery: Delivery<M>;
  readonly claim: Claim | undefined;
  readonly controller: AbortController;
}

/**
 * The claim protocol around one handler, for any broker: claim the message's key, replay or
 * refuse or defer when it is not this consumer's to run, else run the handler under a fenced
 * lease (heartbeat, steps, `ctx.transaction`) and complete, release or fail the key. Returns a
 * {@link RunOutcome}; the adapter acknowledges, delays or dead-letters the message accordingly.
 *
 * A run computes its result and reports it once ({@link KeyedJobRunner.run}'s one report: the
 * event, the log line, the trace), whichever way it ended. The pieces live beside it: the
 * lease's heartbeat (`lease-heartbeat.ts`), deferrals and failures (`run-failures.ts`), the
 * outcomes (`run-outcome.ts`), the handler's `ctx` (`job-context.ts`).
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
  /**
   * A database-only handler: the fast path is its default, and on it the whole handler (the
   * claim's transaction) may share a group's (see `EffectOptions.databaseOnly`). A function
   * handler's `ctx.transaction` may share one either way (see `TransactionOptions`).
   */
  readonly #databaseOnly: boolean;
  readonly #fastPath: boolean;
  /** The data layer of a database-only handler written in one (`databaseOnly(dataLayer, …)`): its fast path runs there. */
  readonly #dataLayer: DataLayer<unknown> | undefined;
  /** Bounds the deferrals of store faults that never pass (`storeRetryWindowMs`). */
  readonly #storeFaults: StoreFaultStreaks;
  readonly #failures: RunFailures<P, M>;

  constructor(options: KeyedJobRunnerOptions<P, R, M>) {
    this.#options = Object.freeze({ ...options });
    this.#keys = options.keys;
    this.#timing = options.timing;
    this.#log = options.logger;
    this.#storeFaults = new StoreFaultStreaks({ windowMs: options.timing.storeRetryWindowMs });
    if (this.#timing.waitMs > 0 && !options.listener) {
      throw new ValidationError('INVALID_OPTIONS', 'listener', 'waitMs > 0 needs a KeySettledListener (option listener).');
    }
    const handler = options.handler;
    this.#databaseOnly = handlerForm(handler) === 'database-only';
    this.#handler = this.#databaseOnly
      ? runsInOneTransaction(handler as DatabaseOnlyHandler<P, R, DatabaseOnlyContext<P, M>>)
      : (handler as (ctx: KeyedJobContext<P, M>) => Promise<R>);
    this.#dataLayer = isDataLayerHandler(handler) ? handler.dataLayer : undefined;
    // A database-only handler is one transaction: nothing of a run that rolled back is seen
    // outside it, so the single-transaction path is safe for it by construction.
    this.#fastPath = options.fastPath ?? this.#databaseOnly;
    this.#failures = new RunFailures({
      keys: this.#keys,
      timing: this.#timing,
      storeFaults: this.#storeFaults,
      errorDisposition: options.errorDisposition,
      countAttemptsOnKey: options.countAttemptsOnKey ?? false,
      emit: (kind, delivery, claim) => this.#emit(kind, delivery, { claim }),
    });
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
          if (released) this.#emit('released', active.delivery, { claim: active.claim });
        }
      }),
    );
    return abandoned.map((active) => active.delivery);
  }

  /**
   * Runs one delivery and reports what it came to, once. Rejects only with an error that is
   * neither the handler's nor a store fault (a bug); the adapter should treat that like `retry`.
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
      const named = identity ? ` (scope "${identity.scope}", key "${identity.key}")` : '';
      const reason = `${delivery.label}${named} was not run: ${(error as Error).message}`;
      return this.#report(delivery, identity, undefined, { outcome: { kind: 'invalid-message', reason, error } });
    }
    const { scope, key } = identity;
    const log = new JobLogger(this.#log, { jobId: delivery.id, ...(delivery.deliveryCount === undefined ? {} : { delivery: delivery.deliveryCount }), scope, key });
    const retention = identity.retention && this.#boundedRetention(delivery, identity, identity.retention, log);
    const claimOptions: ClaimOptions = {
      leaseMs: this.#timing.leaseMs,
      jobId: delivery.id,
      queue: delivery.queue,
      jobName: delivery.name,
      ...(this.#options.storePayload ? { payload: identity.payload } : {}),
      ...(retention ? { retention } : {}),
    };
    const run: Run<P, M> = { delivery, identity, log, fingerprint, claimOptions };
    const result = identity.coalesce ? await this.#runCoalescing(run) : await this.#runPath(run);
    const outcome = this.#report(delivery, identity, result.log ?? run.log, result);
    if (passedTheStore(outcome)) this.#storeFaults.end(streakId(identity));
    return outcome;
  }

  /**
   * The job's own retention held to the keys' bounds (`maxJobRetentionMs`, `maxJobTombstoneMs`):
   * a part above its bound gets the bound, and the job's log says so, since the job then keeps
   * its key for less than its producer asked.
   */
  #boundedRetention(delivery: Delivery<M>, identity: JobIdentity<P>, asked: KeyRetention, log: JobLogger): KeyRetention {
    const { retention, clamped } = boundRetention(asked, this.#keys.options);
    for (const { part, askedMs, boundMs } of clamped) {
      const option = part === 'resultMs' ? 'maxJobRetentionMs (MAX_JOB_RETENTION_MS)' : 'maxJobTombstoneMs (MAX_JOB_TOMBSTONE_MS)';
      log.warn(
        { retentionPart: part, askedMs, boundMs },
        `the job asked for retention.${part} ${askedMs} ms, more than the bound ${option} of ${boundMs} ms: its key gets ${boundMs} ms. ` +
          `Ask for less, or raise ${option} on the workers.`,
      );
      this.#emit('retention-clamped', delivery, { identity, retentionPart: part });
    }
    return retention;
  }

  /** One run of the job's key: in a slot of each concurrency key it names, if any. */
  #runPath(run: Run<P, M>): Promise<RunResult> {
    const limits = concurrencyLimitsOf(run.identity.concurrency);
    return limits.length > 0 ? this.#runInSlots(run, limits) : this.#runClaimed(run);
  }

  #runClaimed(run: Run<P, M>): Promise<RunResult> {
    return this.#fastPath ? this.#runFastPath(run) : this.#runLeasedPath(run);
  }

  /**
   * Coalescing mode: the job either runs the key's next generation (each generation its own
   * idempotency key, `<key>#<generation>`, so each run's effect commits once, and a redelivered
   * job runs or replays its own generation) or is folded into the run in flight, its payload
   * becoming the pending successor's. A job that ran a generation then runs the pending
   * successor, if one arrived meanwhile, until none is pending; each run is reported as it ends,
   * and the job's outcome is its last run's. A run that did not end (deferred, retried, store
   * fault) ends the job there: its redelivery picks the same generation up again.
   */
  async #runCoalescing(run: Run<P, M>): Promise<RunResult> {
    const { delivery, identity } = run;
    const { scope, key } = identity;
    if (delivery.id === undefined) {
      const error = new ValidationError('INVALID_JOB_DATA', 'job.id', `A coalescing job needs a job (message) id of its own (scope "${scope}", key "${key}").`);
      return { outcome: { kind: 'invalid-message', reason: describeFailure(identity, error), error } };
    }
    let next: { readonly generation: number; readonly payload: unknown } | undefined;
    try {
      const arrival = await this.#keys.coalesceArrive(scope, key, delivery.id, identity.payload, { staleMs: this.#timing.leaseMs * 10, sentAtMs: delivery.sentAtMs });
      if (arrival.action === 'coalesced') return { outcome: { kind: 'replayed', result: null, coalesced: true } };
      next = arrival;
    } catch (error) {
      return this.#failures.storeFault(run, error);
    }
    for (;;) {
      const payload = next.payload as P;
      const generation: JobIdentity<P> = { ...identity, key: generationKey(key, next.generation), payload, fingerprintOf: { name: delivery.name, payload }, coalesce: undefined };
      const result = await this.#runPath({
        ...run,
        identity: generation,
        fingerprint: this.#keys.fingerprint(generation.fingerprintOf),
        claimOptions: { ...run.claimOptions, ...(this.#options.storePayload ? { payload } : {}) },
        log: run.log.with({ generation: next.generation }),
      });
      const ended = ['completed', 'replayed', 'replayed-failure', 'failed-permanently', 'key-reused'].includes(result.outcome.kind);
      if (!ended) return result;
      let successor: typeof next | undefined;
      try {
        successor = await this.#keys.coalesceNext(scope, key, delivery.id, next.generation);
      } catch {
        // The successor stays pending: this job's redelivery, or the key's next arrival, runs it.
        return result;
      }
      if (!successor) return result;
      this.#report(delivery, generation, result.log ?? run.log, result);
      next = successor;
    }
  }

  /**
   * A job with concurrency limits: takes a slot of each of its concurrency keys first (one
   * statement each), runs in them and frees them, whatever the run came to; a key at its limit
   * defers the job without using an attempt, as an in-progress duplicate is.
   *
   * *Why sorted, and why all or nothing:* every job takes its keys' slots in the same order (by
   * key, {@link concurrencyLimitsOf}), and one refused frees the slots taken before it before the
   * job is deferred. So no job holds a slot while it waits for another (no deadlock, and no slot
   * held by a job that is not running), and two jobs never wait on each other in a cycle.
   *
   * A slot that cannot be freed (Postgres gone) frees itself when its time is up: never later
   * than the run's lease.
   */
  async #runInSlots(run: Run<P, M>, limits: readonly ConcurrencyLimit[]): Promise<RunResult> {
    const { scope, key } = run.identity;
    const groups = limits.length > 1 ? limits.map((limit) => limit.key) : undefined;
    const held: ConcurrencySlot[] = [];
    try {
      for (const limit of limits) {
        let answer: Awaited<ReturnType<IdempotencyKeys['acquireConcurrencySlot']>>;
        try {
          answer = await this.#keys.acquireConcurrencySlot(scope, key, limit, {
            leaseMs: this.#timing.leaseMs,
            starvationMs: this.#timing.concurrencyStarvationMs,
            ...(groups && { groups }),
          });
        } catch (error) {
          return this.#failures.storeFault(run, error);
        }
        if (!answer.acquired) return this.#failures.defer(answer.retryAfterMs, 'concurrency-limit', limit.key);
        held.push(answer);
      }
      return await this.#runClaimed(run);
    } finally {
      for (const slot of held) {
        await this.#keys.releaseConcurrencySlot(scope, key, slot).catch((error: unknown) => {
          run.log.warn({ err: error, concurrencyKey: slot.group }, 'could not free the concurrency slot; it frees itself when its time is up');
        });
      }
    }
  }

  /**
   * The one report of a run: the event (and its trace), the log line, the outcome returned. Every
   * outcome is said here, and only here.
   */
  #report(delivery: Delivery<M>, identity: JobIdentity<P> | undefined, log: JobLogger | undefined, result: RunResult): RunOutcome {
    const { outcome, claim, step } = result;
    const confirmed = result.confirmed ?? true;
    switch (outcome.kind) {
      case 'completed':
        if (result.thrownAfterCommit) {
          log?.warn({ err: result.thrownAfterCommit.error }, 'handler threw after its transaction committed; the job completes with the stored result');
        } else {
          this.#emit('completed', delivery, { claim, durationMs: result.durationMs });
          log?.info({ outcome: 'completed', durationMs: Math.round(result.durationMs ?? 0) }, 'effect committed');
        }
        break;
      case 'replayed':
      case 'replayed-failure':
        if (outcome.kind === 'replayed' && outcome.coalesced) {
          this.#emit('coalesced', delivery, { identity });
          log?.info({ outcome: 'coalesced' }, 'a run of this key is in flight: its pending successor now carries this payload');
        } else if (outcome.resultExpired) {
          // Only the key's tombstone is left: the duplicate is acknowledged (or refused) as it was, never run.
          this.#emit('result-expired', delivery, { identity });
          log?.info(
            { outcome: 'result-expired', finishedAt: outcome.resultExpired.finishedAt, tombstoneExpiresAt: outcome.resultExpired.tombstoneExpiresAt },
            `key already ${outcome.kind === 'replayed' ? 'completed' : 'failed'}; its result has expired (tombstone): not running it again`,
          );
        } else if (outcome.kind === 'replayed') {
          this.#emit('replayed', delivery, { identity });
          log?.info({ outcome: 'replayed' }, 'key already completed: replaying its result');
        } else {
          this.#emit('replayed-failure', delivery, { identity });
          log?.info({ outcome: 'replayed-failure' }, outcome.error.message);
        }
        break;
      case 'key-reused':
        this.#emit('key-reused', delivery, { identity });
        log?.warn({ outcome: 'key-reused' }, outcome.error.message);
        break;
      case 'invalid-message':
        this.#emit('invalid', delivery, { identity });
        // A message whose key could be read logs on the job's logger, with the refusal.
        if (log) log.warn({ outcome: 'invalid', err: outcome.error }, (outcome.error as Error).message);
        else this.#log.warn({ jobId: delivery.id, outcome: 'invalid' }, outcome.reason);
        break;
      case 'deferred':
        if (outcome.reason === 'concurrency-limit') {
          const concurrencyKey = outcome.concurrencyKey ?? concurrencyLimitsOf(identity?.concurrency)[0]?.key;
          this.#emit('concurrency-limited', delivery, { identity, ...(concurrencyKey !== undefined && { concurrencyKey }) });
          log?.info(
            { outcome: 'concurrency-limited', delayMs: outcome.retryAfterMs, concurrencyKey },
            'concurrency key at its limit: deferring the job without using an attempt',
          );
          break;
        }
        this.#emit('deferred', delivery, { identity });
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
        this.#emit('store-unavailable', delivery, { claim, identity, cause: storeFaultOf(outcome.error) });
        log?.warn({ outcome: 'store-unavailable', delayMs: outcome.retryAfterMs, err: outcome.error }, 'Postgres unavailable: deferring the job without using an attempt');
        break;
      case 'failed-permanently':
        if (confirmed) this.#emit('failed', delivery, { claim });
        log?.warn({ outcome: 'failed', err: outcome.error, step: step?.name }, 'job failed permanently; error stored for replay');
        break;
      case 'retry':
        if (confirmed) this.#emit('released', delivery, { claim, identity });
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

  async #runLeasedPath(run: Run<P, M>): Promise<RunResult> {
    const { delivery, identity, log, fingerprint, claimOptions } = run;
    const { scope, key } = identity;
    let outcome: ClaimOutcome;
    try {
      outcome = await this.#keys.claim(scope, key, fingerprint, claimOptions);
      if (outcome.kind === 'in-progress' && this.#timing.waitMs > 0) {
        outcome = await this.#waitForOwner(outcome, fingerprint, claimOptions);
      }
    } catch (error) {
      // Refused before anything was claimed (a payload storePayload cannot keep): no attempt can do better.
      if (error instanceof ValidationError) {
        return { outcome: { kind: 'invalid-message', reason: describeFailure(identity, error), error } };
      }
      if (error instanceof ClaimContendedError) return this.#failures.contended();
      return this.#failures.storeFault(run, error);
    }
    if (outcome.kind !== 'claimed' && outcome.kind !== 'taken-over') return this.#failures.notHeld(outcome);
    this.#emit(outcome.kind, delivery, { claim: outcome });
    log.info({ fence: outcome.fence, outcome: outcome.kind }, 'key claimed');
    await this.#fault('after-claim', identity);
    const held = log.with({ fence: outcome.fence });
    return { ...(await this.#runLeased({ ...run, log: held }, outcome)), log: held };
  }

  async #waitForOwner(outcome: ClaimOutcome & { kind: 'in-progress' }, fingerprint: string, claimOptions: ClaimOptions) {
    const { scope, key } = outcome;
    const settled = await this.#options.listener!.waitForSettled(scope, key, this.#timing.waitMs, async () => {
      const row = await this.#keys.get(scope, key);
      return row !== undefined && row.status !== 'processing';
    });
    return settled ? this.#keys.claim(scope, key, fingerprint, claimOptions) : outcome;
  }

  async #runLeased(run: Run<P, M>, claim: HeldClaim): Promise<RunResult> {
    const { delivery, identity, log } = run;
    const controller = new AbortController();
    const brokerSignal = delivery.signal;
    brokerSignal?.addEventListener('abort', () => controller.abort(brokerSignal.reason), { once: true });
    const active: ActiveRun<M> = { delivery, claim, controller };
    this.#active.add(active);
    const stopHeartbeat = startLeaseHeartbeat({
      keys: this.#keys,
      claim,
      leaseMs: this.#timing.leaseMs,
      heartbeatMs: this.#timing.heartbeatMs,
      controller,
      log,
      onBeat: (kind) => this.#emit(kind, delivery, { claim }),
    });
    const startedAt = performance.now();
    let committed: { result: unknown } | undefined;
    // Created at the handler's first ctx.step: a handler without steps pays nothing for them.
    let steps: JobSteps | undefined;
    const commit = async (effect: (tx: any) => Promise<unknown>, dataLayer?: DataLayer<unknown>, transactionOptions: TransactionOptions = {}) => {
      if (controller.signal.aborted) throw controller.signal.reason;
      // A step record still held back commits ahead of the completion, in its first round trip.
      const complete = (held?: HeldRecord) => {
        // ctx.transaction's callback may run more than once, one run committing (see
        // TransactionOptions): it may share a group's transaction unless it asked to run alone.
        const options = {
          beforeCommit: () => this.#fault('before-commit', identity),
          heldRecord: held,
          databaseOnly: true,
          runsAlone: transactionOptions.runsAlone === true,
        };
        return dataLayer ? this.#keys.commitEffectIn(claim, dataLayer, effect, options) : this.#keys.commitEffect(claim, effect, options);
      };
      const result = steps ? await steps.complete(complete) : await complete();
      committed = { result };
      // The key is completed: an extension would find no lease and report it lost.
      stopHeartbeat();
      return result;
    };
    const ctx = jobContext(
      delivery,
      identity,
      claim,
      controller.signal,
      (first, second) => {
        if (committed) throw new Error('ctx.transaction may be called only once per job.');
        return typeof first === 'function' ? commit(first, undefined, transactionOptionsOf(second)) : commit(second as (tx: unknown) => Promise<unknown>, first);
      },
      (name, body) => {
        if (committed) throw new Error(`ctx.step("${name}") was called after ctx.transaction: the key is completed; call every step before it.`);
        if (!this.#keys.supportsSteps) throw new StepsUnsupportedError(claim.scope, claim.key, 'the key store keeps no step records (KeyStore.steps).');
        steps ??= new JobSteps(
          this.#keys,
          claim,
          controller.signal,
          (report) => this.#emit(`step-${report.outcome}`, delivery, { claim, durationMs: report.durationMs, step: report }),
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
      return { outcome: { kind: 'completed', result: committed!.result }, claim, durationMs: performance.now() - startedAt };
    } catch (error) {
      if (committed) return { outcome: { kind: 'completed', result: committed.result }, claim, thrownAfterCommit: { error } };
      // The steps that finished stay recorded: a record held back goes before the key is released.
      await steps?.flush();
      // Before the key is released or failed, after which an extension would find no lease.
      stopHeartbeat();
      return await this.#failures.heldFailure(run, claim, controller.signal, error, steps?.failedStep(error));
    } finally {
      stopHeartbeat();
      this.#active.delete(active);
    }
  }

  async #runFastPath(run: Run<P, M>): Promise<RunResult> {
    const { delivery, identity, fingerprint, claimOptions } = run;
    const controller = new AbortController();
    const active: ActiveRun<M> = { delivery, claim: undefined, controller };
    this.#active.add(active);
    const startedAt = performance.now();
    let outcome;
    // The effect runs again, under the same claim, when its group rolls back (see
    // group-commit.ts): the claim is announced once.
    let announced: Claim | undefined;
    const dataLayer = this.#dataLayer;
    try {
      const effect = async (tx: any, claim: Claim): Promise<unknown> => {
          if (announced?.owner !== claim.owner || announced.fence !== claim.fence) {
            this.#emit(claim.attempts > 1 ? 'taken-over' : 'claimed', delivery, { claim });
            announced = claim;
          }
          let transactionResult: { value: unknown } | undefined;
          const ctx = jobContext(
            delivery,
            identity,
            claim,
            controller.signal,
            async (first, second) => {
              if (transactionResult) throw new Error('ctx.transaction may be called only once per job.');
              // Read for their errors only: on the fast path the whole handler runs inside the
              // claim's transaction, grouped or not by the handler's kind.
              if (typeof first === 'function') transactionOptionsOf(second);
              // On the fast path the handler runs inside the one transaction that claims the key:
              // a transaction of another data layer could not commit with it.
              if ((typeof first === 'function' ? undefined : first) !== dataLayer) throw fastPathDataLayerMismatch(dataLayer, first);
              transactionResult = { value: await (typeof first === 'function' ? first(tx) : (second as (tx: unknown) => Promise<unknown>)(tx)) };
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
      };
      const options = { ...claimOptions, databaseOnly: this.#databaseOnly };
      outcome = dataLayer
        ? await this.#keys.executeOnceIn(identity.scope, identity.key, fingerprint, dataLayer, effect, options)
        : await this.#keys.executeOnce(identity.scope, identity.key, fingerprint, effect, options);
    } catch (error) {
      return await this.#failures.fastPathFailure(run, error);
    } finally {
      this.#active.delete(active);
    }
    if (outcome.kind !== 'executed') return this.#failures.notHeld(outcome);
    await this.#fault('after-commit', identity);
    const { claim } = outcome;
    return { outcome: { kind: 'completed', result: outcome.result ?? null }, claim, durationMs: performance.now() - startedAt, log: run.log.with({ fence: claim.fence }) };
  }

  async #fault(point: FaultPoint, identity: JobIdentity<P>): Promise<void> {
    if (this.#options.faultHook) await this.#options.faultHook(point, { scope: identity.scope, key: identity.key });
  }

  /** Emits one event (and records it on the message's span): `about` names the claim, or else the identity, it concerns. */
  #emit(kind: WorkerEventKind, delivery: Delivery<M>, about: EventAbout<P> = {}): void {
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

/** A fast-path handler asked for another transaction than the one that claims its key. */
function fastPathDataLayerMismatch(dataLayer: DataLayer<unknown> | undefined, asked: unknown): ValidationError {
  const running = dataLayer ? `a ${dataLayer.name} transaction (databaseOnly(dataLayer, …))` : "the worker's Kysely transaction";
  const wanted = typeof asked === 'function' ? "the worker's Kysely transaction (ctx.transaction(fn))" : `a ${(asked as DataLayer<unknown>).name} transaction (ctx.transaction(dataLayer, fn))`;
  return new ValidationError(
    'INVALID_OPTIONS',
    'fastPath',
    `This job runs on the fast path inside ${running}, which also claims its key, and asked for ${wanted}: they cannot commit together. ` +
      'Write a database-only handler in your data layer, databaseOnly(dataLayer, async (tx, ctx) => …), or turn fastPath off for this worker.',
  );
}

/** The driver's error under a store fault, SQLSTATE first when it has one. */
function storeFaultOf(error: unknown): string {
  const driverError = error instanceof Error && error.cause !== undefined ? error.cause : error;
  const state = sqlStateOf(driverError);
  return `${state !== undefined ? `${state} ` : ''}${describeError(driverError)}`;
}
