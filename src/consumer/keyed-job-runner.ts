import type { Logger } from 'pino';
import { ClaimContendedError, StepsUnsupportedError, ValidationError } from '../errors.js';
import type { FaultPoint } from '../fault-hook.js';
import type { ClaimOptions } from '../protocol/effect-options.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { JobSteps } from '../protocol/job-steps.js';
import { boundRetention } from '../protocol/key-retention.js';
import { kindOf } from '../protocol/store-calls.js';
import type { GroupRefusal } from '../protocol/group-refusals.js';
import type { Claim, ClaimOutcome, HeldClaim } from '../store/claim-outcome.js';
import type { HeldRecord } from '../store/one-trip-commit.js';
import type { KeyRetention } from '../store/records.js';
import type { DataLayer } from '../store/data-layer.js';
import { runCoalescing, type CoalescingRunDeps } from './coalescing-run.js';
import { ConcurrencySlotPool } from './concurrency-slot-pool.js';
import { runInSlots, runInTransactionSlots, TransactionSlotsNotTaken, takeTransactionSlots, type SlotsRunDeps, type TransactionSlots } from './concurrency-slots-run.js';
import { handlerForm, isDataLayerHandler, runsInOneTransaction, type DatabaseOnlyContext, type DatabaseOnlyHandler } from './database-only-handler.js';
import { jobContext, transactionOptionsOf, type Delivery, type KeyedJobContext, type TransactionOptions } from './job-context.js';
import { JobLogger } from './job-logger.js';
import { startLeaseHeartbeat } from './lease-heartbeat.js';
import { RunFailures, WorkerClosingError } from './run-failures.js';
import { describeFailure, passedTheStore, streakId, type Run, type RunOutcome, type RunResult } from './run-outcome.js';
import { RunReporter } from './run-report.js';
import type { KeyedJobRunnerOptions } from './runner-options.js';
import { StoreFaultStreaks } from './store-fault-streaks.js';
import { concurrencyLimitsOf, type JobIdentity } from './wire-contract.js';
import type { ResolvedWorkerTiming } from './worker-timing.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

interface ActiveRun<M> {
  readonly delivery: Delivery<M>;
  readonly claim: Claim | undefined;
  readonly controller: AbortController;
}

const KEYED_JOB_RUNNER_OPTION_NAMES = optionNames<KeyedJobRunnerOptions<unknown, unknown, unknown>>()([
  'keys', 'timing', 'handler', 'identityOf', 'errorDisposition', 'fastPath', 'listener', 'storePayload', 'countAttemptsOnKey', 'logger',
  'faultHook', 'events', 'tracing', 'wakesConcurrencyWaiters',
]);

/** How long a kept concurrency slot no run holds stays kept, at most (see `ConcurrencySlotPool`). */
const SLOT_IDLE_MS = 50;

/**
 * The claim protocol around one handler, for any broker: claim the message's key, replay or
 * refuse or defer when it is not this consumer's to run, else run the handler under a fenced
 * lease (heartbeat, steps, `ctx.transaction`) and complete, release or fail the key. Returns a
 * {@link RunOutcome}; the adapter acknowledges, delays or dead-letters the message accordingly.
 *
 * A run computes its result and reports it once ({@link KeyedJobRunner.run}'s one report: the
 * event, the log line, the trace: `run-report.ts`), whichever way it ended. The pieces live
 * beside it: the lease's heartbeat (`lease-heartbeat.ts`), deferrals and failures
 * (`run-failures.ts`), the outcomes (`run-outcome.ts`), the handler's `ctx` (`job-context.ts`),
 * coalescing (`coalescing-run.ts`) and concurrency limits (`concurrency-slots-run.ts`).
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
  /** The keys' schema proved to have no function to take slots in a transaction: rows from then on. */
  #slotsInTransactionUnavailable = false;
  /** The data layer of a database-only handler written in one (`databaseOnly(dataLayer, …)`): its fast path runs there. */
  readonly #dataLayer: DataLayer<unknown> | undefined;
  /** Bounds the deferrals of store faults that never pass (`storeRetryWindowMs`). */
  readonly #storeFaults: StoreFaultStreaks;
  readonly #failures: RunFailures<P, M>;
  readonly #reporter: RunReporter<P, M>;
  readonly #slotsRunDeps: SlotsRunDeps<P, M>;
  /** The slot rows kept between runs of a concurrency key (`concurrencySlotReuseMs`); unset: each run takes its own. */
  readonly #slotPool: ConcurrencySlotPool | undefined;
  readonly #coalescingRunDeps: CoalescingRunDeps<P, M>;

  constructor(options: KeyedJobRunnerOptions<P, R, M>) {
    refuseUnknownOptions(options, KEYED_JOB_RUNNER_OPTION_NAMES, 'new KeyedJobRunner(options)');
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
      emit: (kind, delivery, claim) => this.#reporter.emit(kind, delivery, { claim }),
    });
    this.#reporter = new RunReporter(options);
    this.#slotsRunDeps = { keys: this.#keys, timing: this.#timing, failures: this.#failures, wakesWaiters: options.wakesConcurrencyWaiters === true, runClaimed: (run) => this.#runClaimed(run) };
    this.#slotPool =
      this.#timing.concurrencySlotReuseMs > 0
        ? new ConcurrencySlotPool({
            keys: this.#keys,
            reuseMs: this.#timing.concurrencySlotReuseMs,
            idleMs: Math.min(this.#timing.concurrencySlotReuseMs, SLOT_IDLE_MS),
            heartbeatMs: this.#timing.heartbeatMs,
            log: new JobLogger(this.#log, {}),
          })
        : undefined;
    this.#coalescingRunDeps = {
      keys: this.#keys,
      timing: this.#timing,
      failures: this.#failures,
      storePayload: options.storePayload === true,
      runPath: (run) => this.#runPath(run),
      report: (run, identity, log, result) => this.#reporter.report(run.delivery, identity, log, result),
      fault: (point, identity) => this.#fault(point, identity),
    };
  }

  /** Deliveries being run now. */
  get activeCount(): number {
    return this.#active.size;
  }

  /**
   * Frees the concurrency slots kept for the next runs of their keys (`concurrencySlotReuseMs`),
   * and every slot a run gives back from now on. Call it once the consumer takes no more jobs;
   * unfreed, they would hold their keys' limits until their time is up.
   */
  async close(): Promise<void> {
    await this.#slotPool?.close();
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
          if (released) this.#reporter.emit('released', active.delivery, { claim: active.claim });
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
      return this.#reporter.report(delivery, identity, undefined, { outcome: { kind: 'invalid-message', reason, error } });
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
    const result = identity.coalesce ? await runCoalescing(run, this.#coalescingRunDeps) : await this.#runPath(run);
    const outcome = this.#reporter.report(delivery, identity, result.log ?? run.log, result);
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
      this.#reporter.emit('retention-clamped', delivery, { identity, retentionPart: part });
    }
    return retention;
  }

  /** One run of the job's key: in a slot of each concurrency key it names, if any. */
  #runPath(run: Run<P, M>): Promise<RunResult> {
    const limits = concurrencyLimitsOf(run.identity.concurrency);
    if (limits.length === 0) return this.#runClaimed(run);
    if (this.#slotPool) return runInSlots(run, limits, this.#slotsRunDeps, this.#slotPool);
    // A run that is one transaction holds its slots by it; a data layer's transaction is the
    // handler's, so its slots are rows as on the leased path.
    if (this.#fastPath && run.leased !== true && !this.#dataLayer && this.#keys.supportsSlotsInTransaction && !this.#slotsInTransactionUnavailable) {
      return runInTransactionSlots(run, limits, {
        ...this.#slotsRunDeps,
        runFastPath: (inSlots, slots) => this.#runFastPath(inSlots, slots),
        unavailable: (error) => {
          if (this.#slotsInTransactionUnavailable) return;
          this.#slotsInTransactionUnavailable = true;
          run.log.warn(
            { err: error },
            'the keys\' schema is not migrated to 034_concurrency_slots_in_groups: concurrency slots are taken as rows until this worker restarts on a migrated schema (run idempotent-jobs migrate)',
          );
        },
      });
    }
    return runInSlots(run, limits, this.#slotsRunDeps);
  }

  #runClaimed(run: Run<P, M>): Promise<RunResult> {
    return this.#fastPath && run.leased !== true ? this.#runFastPath(run) : this.#runLeasedPath(run);
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
    this.#reporter.emit(outcome.kind, delivery, { claim: outcome });
    log.info({ fence: outcome.fence, outcome: outcome.kind }, 'key claimed');
    await this.#fault('after-claim', identity);
    const held = log.with({ fence: outcome.fence });
    return { ...(await this.#runLeased({ ...run, log: held }, outcome)), log: held };
  }

  async #waitForOwner(outcome: ClaimOutcome & { kind: 'in-progress' }, fingerprint: string, claimOptions: ClaimOptions) {
    const { scope, key } = outcome;
    const isSettled = async () => ((await this.#keys.get(scope, key))?.status ?? 'processing') !== 'processing';
    const settled = await this.#options.listener!.waitForSettled(scope, key, this.#timing.waitMs, isSettled);
    return settled ? this.#keys.claim(scope, key, fingerprint, claimOptions) : outcome;
  }

  async #runLeased(run: Run<P, M>, claim: HeldClaim): Promise<RunResult> {
    const { delivery, identity, log } = run;
    const controller = new AbortController();
    const brokerSignal = delivery.signal;
    brokerSignal?.addEventListener('abort', () => controller.abort(brokerSignal.reason), { once: true });
    // Its concurrency slots lost (their time ran out; another run may be in them): before the
    // commit, the commit is refused; after it, the handler's signal tells it to stop, since the
    // slot bounds the whole run, not only its transaction.
    const stopForwarding = forwardAbort(run.slotsLost, controller);
    const active: ActiveRun<M> = { delivery, claim, controller };
    this.#active.add(active);
    const stopHeartbeat = startLeaseHeartbeat({
      keys: this.#keys,
      claim,
      leaseMs: this.#timing.leaseMs,
      heartbeatMs: this.#timing.heartbeatMs,
      controller,
      log,
      onBeat: (kind) => this.#reporter.emit(kind, delivery, { claim }),
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
          // Its queue and job name: once one is found leaving state in a group, the rest run alone.
          kind: kindOf(run.claimOptions),
          onGroupRefusal: groupRefusalLog(log),
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
          (report) => this.#reporter.emit(`step-${report.outcome}`, delivery, { claim, durationMs: report.durationMs, step: report }),
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
      stopForwarding();
      this.#active.delete(active);
    }
  }

  /** `slots`: the run's concurrency slots are taken by its transaction's first statement (`runInTransactionSlots`). */
  async #runFastPath(run: Run<P, M>, slots?: TransactionSlots): Promise<RunResult> {
    const { delivery, identity, fingerprint, claimOptions } = run;
    const controller = new AbortController();
    const stopForwarding = forwardAbort(run.slotsLost, controller);
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
          // Run again after its group rolled back, with its slot already lost: not started
          // beside the run that may hold the slot now.
          if (run.slotsLost?.aborted) throw run.slotsLost.reason;
          if (slots) await takeTransactionSlots(this.#keys, this.#timing, run, tx, slots);
          if (announced?.owner !== claim.owner || announced.fence !== claim.fence) {
            this.#reporter.emit(claim.attempts > 1 ? 'taken-over' : 'claimed', delivery, { claim });
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
          // Its concurrency slot lost (another run may be in it): roll back rather than commit outside the limit.
          if (run.slotsLost?.aborted) throw run.slotsLost.reason;
          await this.#fault('before-commit', identity);
          return transactionResult ? transactionResult.value : returned;
      };
      const options = { ...claimOptions, databaseOnly: this.#databaseOnly, onGroupRefusal: groupRefusalLog(run.log) };
      outcome = dataLayer
        ? await this.#keys.executeOnceIn(identity.scope, identity.key, fingerprint, dataLayer, effect, options)
        : await this.#keys.executeOnce(identity.scope, identity.key, fingerprint, effect, options);
    } catch (error) {
      if (error instanceof TransactionSlotsNotTaken) throw error;
      return await this.#failures.fastPathFailure(run, error);
    } finally {
      stopForwarding();
      this.#active.delete(active);
    }
    if (outcome.kind !== 'executed') return this.#failures.notHeld(outcome);
    await this.#fault('after-commit', identity);
    return { outcome: { kind: 'completed', result: outcome.result ?? null }, claim: outcome.claim, durationMs: performance.now() - startedAt, log: run.log.with({ fence: outcome.claim.fence }) };
  }

  async #fault(point: FaultPoint, identity: JobIdentity<P>): Promise<void> {
    if (this.#options.faultHook) await this.#options.faultHook(point, { scope: identity.scope, key: identity.key });
  }
}

/**
 * Aborts `controller` when `signal` aborts (at once if it already has), with its reason, until the
 * returned function is called. *Why it must be called:* a slot kept between runs
 * (`ConcurrencySlotPool`) lends its one signal to every run in it, and a listener left on it
 * would hold each finished run's controller for as long as the slot lives.
 */
function forwardAbort(signal: AbortSignal | undefined, controller: AbortController): () => void {
  if (!signal) return () => {};
  if (signal.aborted) {
    controller.abort(signal.reason);
    return () => {};
  }
  const forward = () => controller.abort(signal.reason);
  signal.addEventListener('abort', forward, { once: true });
  return () => signal.removeEventListener('abort', forward);
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

/** Logs at debug why group commit sent the job out of its group (it runs alone, and its kind from then on). */
function groupRefusalLog(log: JobLogger): (refusal: GroupRefusal) => void {
  return ({ reason, error, kind }) =>
    log.debug({ reason, detail: error.message, kindRunsAlone: kind !== undefined }, 'group commit refused the job: it runs alone, and so do later jobs of its kind');
}
