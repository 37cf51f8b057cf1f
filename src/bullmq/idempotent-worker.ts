import { EventEmitter } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { DelayedError, UnrecoverableError, Worker, type ConnectionOptions, type Job, type WorkerOptions } from 'bullmq';
import type { Transaction } from 'kysely';
import { pino, type Logger } from 'pino';
import {
  deferralMs,
  resolveWorkerTiming,
  storeRetryDelayMs,
  type ResolvedWorkerTiming,
  type WorkerTimingOptions,
} from '../config/worker-timing.js';
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
import type { ClaimOptions, IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { JobSteps, type DatabaseStep, type ExternalStep, type StepReport } from '../protocol/job-steps.js';
import type { FailedStep } from '../protocol/validate.js';
import type { Claim, ClaimOutcome, HeldClaim } from '../store/claim-outcome.js';
import type { KeySettledListener } from '../store/key-settled-listener.js';
import { JobTracing } from '../telemetry/job-tracing.js';
import { identityFromWireContract, type JobIdentity } from './job-identity.js';
import { JobLogger } from './job-logger.js';

/** What a handler receives for one job whose key this worker holds. */
export interface JobContext<P = unknown> {
  /** The job's payload (`job.data.payload` under the wire contract). */
  readonly data: P;
  readonly key: string;
  readonly scope: string;
  /** The claim's fence; pass it downstream if the downstream can fence too. */
  readonly fence: number;
  /** How many times the key has been claimed: 1 first, more after takeovers and retries. */
  readonly attempt: number;
  readonly job: Job;
  /** Fires when the lease is lost (reason: `LeaseLostError`) or the worker is shutting down. */
  readonly signal: AbortSignal;
  /**
   * Runs `fn(tx)` in a transaction that also completes the key, storing `fn`'s return value:
   * the effect and the completion commit together or not at all. Call it at most once.
   */
  transaction<T>(fn: (tx: Transaction<any>) => Promise<T>): Promise<T>;
  /**
   * A step of a multi-step job, recorded under the key and `name` when it succeeds, so that a
   * later run of the key (a retry, a takeover) returns the recorded result without running it
   * and goes on at the first step not recorded. Call steps before `ctx.transaction` (which
   * stays the completion), in the same order with the same names on every run; names are
   * unique within a run. Resolves to the result as stored (its JSON form), on the first run as
   * on replays.
   *
   * - `ctx.step(name, async (step) => …)`: an external step (a call to another system), at
   *   most once per lease: it runs again only under a new claim, when the last one died before
   *   recording it. Pass `step.stepKey` downstream; `step.starts` counts its starts.
   * - `ctx.step(name, { transaction: async (tx, step) => … })`: a database step, exactly once:
   *   its writes and its record commit together.
   *
   * Not available on the fast path (throws `StepsUnsupportedError`).
   */
  step<T>(name: string, run: ExternalStep<T>): Promise<T>;
  step<T>(name: string, database: DatabaseStep<T>): Promise<T>;
}

/** The user's job handler. Its return value is stored (when it never calls `ctx.transaction`). */
export type JobHandler<P = unknown, R = unknown> = (ctx: JobContext<P>) => Promise<R>;

/** What a thrown error does: `'retry'` releases the key for BullMQ's retry; `'fail'` stores it for good. */
export type ErrorDisposition = 'retry' | 'fail';

/** Options of {@link createIdempotentWorker}. */
export interface IdempotentWorkerOptions<P = unknown, R = unknown> extends WorkerTimingOptions {
  /** BullMQ queue name. */
  readonly queue: string;
  /** BullMQ connection (ioredis options or instance). */
  readonly connection: ConnectionOptions;
  /** BullMQ key prefix. @defaultValue `'bull'` */
  readonly prefix?: string;
  /** The claim protocol (its Kysely instance is where transactional effects run). */
  readonly keys: IdempotencyKeys;
  readonly handler: JobHandler<P, R>;
  /** Jobs run at once by this worker. @defaultValue `1` */
  readonly concurrency?: number;
  /**
   * Single-transaction fast path for handlers whose effects only touch this database: claim,
   * effect and completion commit once. No lease, no heartbeat. @defaultValue `false`
   */
  readonly fastPath?: boolean;
  /** Needed for `waitMs > 0`: wakes a waiting duplicate when the owner finishes. */
  readonly listener?: KeySettledListener;
  /** Reads key, scope and payload from a job. @defaultValue the wire contract ({@link identityFromWireContract}) */
  readonly keyOf?: (job: Job) => JobIdentity<P>;
  /**
   * Which handler errors are stored (`'fail'`) and which release the key for BullMQ's retry
   * (`'retry'`). The last attempt's error is stored either way. Never consulted for a
   * `StoreUnavailableError` (a transient store fault, also when `ctx.transaction` throws it):
   * such a job is deferred without using an attempt.
   * @defaultValue `'fail'` for `UnrecoverableError`, validation errors and unstorable results; else `'retry'`
   */
  readonly errorDisposition?: (error: unknown, job: Job) => ErrorDisposition;
  /** Keep each job's payload on its key so the sweeper can re-enqueue a lost job. @defaultValue `false` */
  readonly storePayload?: boolean;
  /** Structured logger. @defaultValue `pino()` at level info */
  readonly logger?: Logger;
  /** Chaos testing only: called at named protocol points. @defaultValue unset */
  readonly faultHook?: FaultHook;
  /** Further BullMQ worker options (not those set above). */
  readonly workerOptions?: Omit<WorkerOptions, 'connection' | 'prefix' | 'concurrency' | 'lockDuration' | 'stalledInterval' | 'maxStalledCount' | 'autorun'>;
}

/** Kinds of {@link WorkerEvent}; the metrics and the chaos checker count them. */
export type WorkerEventKind =
  | 'claimed'
  | 'taken-over'
  | 'replayed'
  | 'replayed-failure'
  | 'deferred'
  | 'key-reused'
  | 'invalid'
  | 'completed'
  | 'released'
  | 'failed'
  | 'lease-lost'
  | 'fenced'
  | 'lease-extended'
  | 'store-unavailable'
  | StepEventKind;

/**
 * Kinds of {@link WorkerEvent} for one call of `ctx.step` (named in `step`): ran under this
 * claim and recorded; replayed (returned a result an earlier run recorded); lease-lost (the
 * record was refused: another worker took the key over); failed (the step threw, or the
 * determinism guard refused the call).
 */
export type StepEventKind = 'step-ran' | 'step-replayed' | 'step-lease-lost' | 'step-failed';

/** One thing that happened to a job, emitted as `'event'` by {@link IdempotentWorker}. */
export interface WorkerEvent {
  readonly kind: WorkerEventKind;
  readonly jobId?: string;
  readonly scope?: string;
  readonly key?: string;
  readonly fence?: number;
  /** Handler run time, on `completed`. */
  readonly durationMs?: number;
  /** The step's name, on step events. */
  readonly step?: string;
  /** The step's 1-based position in its key's sequence, on step events. */
  readonly position?: number;
}

interface ActiveJob {
  readonly job: Job;
  readonly token: string | undefined;
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
 * A BullMQ worker that makes each job's effect happen once per idempotency key.
 *
 * @example
 * ```ts
 * const worker = createIdempotentWorker({
 *   queue: 'payments',
 *   connection: { host: '127.0.0.1', port: 6379 },
 *   keys: new IdempotencyKeys({ db }),
 *   handler: async (ctx) => ctx.transaction((tx) => tx.insertInto('ledger').values(ctx.data).execute()),
 * });
 * ```
 */
export function createIdempotentWorker<P = unknown, R = unknown>(options: IdempotentWorkerOptions<P, R>): IdempotentWorker<P, R> {
  return new IdempotentWorker(options);
}

/** See {@link createIdempotentWorker}. Emits `'event'` ({@link WorkerEvent}) for every outcome. */
export class IdempotentWorker<P = unknown, R = unknown> extends EventEmitter<{ event: [WorkerEvent] }> {
  readonly #options: IdempotentWorkerOptions<P, R>;
  readonly #timing: ResolvedWorkerTiming;
  readonly #keys: IdempotencyKeys;
  readonly #log: Logger;
  readonly #keyOf: (job: Job) => JobIdentity<P>;
  readonly #active = new Set<ActiveJob>();
  readonly #bull: Worker;
  readonly #tracing: JobTracing;
  #closing: Promise<void> | undefined;

  constructor(options: IdempotentWorkerOptions<P, R>) {
    super();
    this.#options = Object.freeze({ ...options });
    this.#keys = options.keys;
    this.#timing = resolveWorkerTiming(options, options.keys.options.leaseMs);
    if (this.#timing.waitMs > 0 && !options.listener) {
      throw new ValidationError('INVALID_OPTIONS', 'listener', 'waitMs > 0 needs a KeySettledListener (option listener).');
    }
    this.#log = (options.logger ?? pino()).child({ queue: options.queue });
    this.#keyOf = options.keyOf ?? (identityFromWireContract as (job: Job) => JobIdentity<P>);
    this.#tracing = new JobTracing(options.queue, (error) => error instanceof DelayedError);
    this.#bull = new Worker(options.queue, (job, token, signal) => this.#tracing.run(job, () => this.#process(job, token, signal)), {
      ...options.workerOptions,
      connection: options.connection,
      prefix: options.prefix,
      concurrency: options.concurrency ?? 1,
      lockDuration: this.#timing.lockDurationMs,
      stalledInterval: this.#timing.stalledIntervalMs,
      maxStalledCount: this.#timing.maxStalledCount,
    });
    this.#bull.on('error', (error) => this.#log.error({ err: error }, 'BullMQ worker error'));
  }

  /** The underlying BullMQ worker (for events such as `completed` and `failed`). */
  get bullWorker(): Worker {
    return this.#bull;
  }

  /** The resolved timing options. */
  get timing(): ResolvedWorkerTiming {
    return this.#timing;
  }

  /** Resolves when the worker is connected and taking jobs. */
  waitUntilReady(): Promise<unknown> {
    return this.#bull.waitUntilReady();
  }

  /**
   * Graceful shutdown: stop taking jobs, let active ones finish within `shutdownTimeoutMs`;
   * then abort the rest (their `ctx.signal` fires), release their keys so another worker takes
   * them over at once, and close. Does not close the IdempotencyKeys' database.
   */
  close(options: { force?: boolean } = {}): Promise<void> {
    if (options.force) return this.#forceClose();
    this.#closing ??= (async () => {
      this.#log.info({ active: this.#active.size }, 'closing: waiting for active jobs');
      const graceful = this.#bull.close().then(() => true);
      const finished = await Promise.race([graceful, sleep(this.#timing.shutdownTimeoutMs, false, { ref: false })]);
      if (!finished) await this.#forceClose();
      this.#log.info('closed');
    })();
    return this.#closing;
  }

  async #forceClose(): Promise<void> {
    const abandoned = [...this.#active];
    if (abandoned.length > 0) this.#log.warn({ active: abandoned.length }, 'shutdown deadline passed: releasing keys of unfinished jobs');
    await Promise.all(
      abandoned.map(async (active) => {
        active.controller.abort(new WorkerClosingError());
        if (active.claim) {
          const released = await this.#keys.release(active.claim, new WorkerClosingError()).catch(() => false);
          if (released) this.#emit('released', active.job, active.claim);
        }
        // Put the job straight back in the queue instead of waiting for it to stall.
        await active.job.moveToWait(active.token).catch(() => {});
      }),
    );
    await this.#bull.close(true);
  }

  async #process(job: Job, token: string | undefined, bullSignal?: AbortSignal): Promise<unknown> {
    let identity: JobIdentity<P> | undefined;
    let fingerprint: string;
    try {
      identity = this.#keyOf(job);
      // Inside the try: a custom keyOf may return what cannot be fingerprinted (too deep, say),
      // which no retry can mend.
      fingerprint = this.#keys.fingerprint(identity.fingerprintOf);
    } catch (error) {
      this.#emit('invalid', job);
      const named = identity ? ` (scope "${identity.scope}", key "${identity.key}")` : '';
      const reason = `Job ${job.id} on queue "${this.#options.queue}"${named} was not run: ${(error as Error).message}`;
      this.#log.warn({ jobId: job.id, outcome: 'invalid' }, reason);
      throw new UnrecoverableError(reason);
    }
    const { scope, key } = identity;
    const log = new JobLogger(this.#log, { jobId: job.id, scope, key });
    const claimOptions: ClaimOptions = {
      leaseMs: this.#timing.leaseMs,
      jobId: job.id,
      queue: this.#options.queue,
      jobName: job.name,
      ...(this.#options.storePayload ? { payload: identity.payload } : {}),
    };

    if (this.#options.fastPath) return this.#processFastPath(job, token, identity, fingerprint, claimOptions, log);

    let outcome: ClaimOutcome;
    try {
      outcome = await this.#keys.claim(scope, key, fingerprint, claimOptions);
      if (outcome.kind === 'in-progress' && this.#timing.waitMs > 0) {
        outcome = await this.#waitForOwner(outcome, fingerprint, claimOptions);
      }
    } catch (error) {
      // Refused before anything was claimed (a payload storePayload cannot keep): no attempt can do better.
      if (error instanceof ValidationError) {
        this.#emit('invalid', job);
        log.warn({ outcome: 'invalid', err: error }, error.message);
        throw new UnrecoverableError(describeFailure(identity, error));
      }
      if (error instanceof ClaimContendedError) return this.#deferContended(job, token, log);
      return this.#deferAfterStoreFault(job, token, error, log);
    }
    if (outcome.kind !== 'claimed' && outcome.kind !== 'taken-over') {
      return this.#settleUnheld(job, token, outcome, log);
    }
    this.#emit(outcome.kind, job, outcome);
    log.info({ fence: outcome.fence, outcome: outcome.kind }, 'key claimed');
    await this.#fault('after-claim', identity);
    return this.#runLeased(job, token, identity, outcome, bullSignal, log.with({ fence: outcome.fence }));
  }

  /** Outcomes where this worker does not hold the key: replay, refuse, or defer. */
  async #settleUnheld(job: Job, token: string | undefined, outcome: Exclude<ClaimOutcome, HeldClaim>, log: JobLogger): Promise<unknown> {
    switch (outcome.kind) {
      case 'completed':
        this.#emit('replayed', job);
        log.info({ outcome: 'replayed' }, 'key already completed: replaying its result');
        return outcome.result;
      case 'failed': {
        this.#emit('replayed-failure', job);
        const error = new KeyFailedError(outcome.scope, outcome.key, outcome.error);
        log.info({ outcome: 'replayed-failure' }, error.message);
        throw new UnrecoverableError(error.message);
      }
      case 'key-reused': {
        this.#emit('key-reused', job);
        const error = new KeyReusedError(outcome.scope, outcome.key);
        log.warn({ outcome: 'key-reused' }, error.message);
        throw new UnrecoverableError(`Job ${job.id}: ${error.message}`);
      }
      case 'in-progress':
        return this.#defer(job, token, outcome.retryAfterMs, log);
    }
  }

  /** Moves the job to delayed without consuming an attempt, to replay once the owner finishes. */
  async #defer(job: Job, token: string | undefined, retryAfterMs: number, log: JobLogger): Promise<never> {
    const delayMs = deferralMs(this.#timing, retryAfterMs);
    this.#emit('deferred', job);
    log.info({ outcome: 'deferred', delayMs }, 'key in progress elsewhere: deferring the job');
    await job.moveToDelayed(Date.now() + delayMs, token);
    throw new DelayedError();
  }

  /**
   * A transient store fault (Postgres restarting, a dropped connection, …): gives the key back
   * when this job holds it (best effort: the lease expires anyway), and moves the job to
   * delayed without using an attempt. The delay backs off exponentially with the number of
   * times the job has been deferred or has stalled: `attemptsStarted - attemptsMade - 1` counts
   * exactly the activations that used no attempt, so no write is needed to keep a count.
   * Rethrows any other error.
   */
  async #deferAfterStoreFault(job: Job, token: string | undefined, error: unknown, log: JobLogger, held?: Claim): Promise<never> {
    const fault = findStoreUnavailable(error);
    if (!fault) throw error;
    if (held) {
      const released = await this.#keys.release(held, fault).catch(() => false);
      if (released) this.#emit('released', job, held);
    }
    const delayMs = storeRetryDelayMs(this.#timing, job.attemptsStarted - job.attemptsMade - 1);
    this.#emit('store-unavailable', job, held);
    log.warn({ outcome: 'store-unavailable', delayMs, err: fault }, 'Postgres unavailable: deferring the job without using an attempt');
    await job.moveToDelayed(Date.now() + delayMs, token);
    throw new DelayedError();
  }

  /**
   * The claim kept racing other writers of the key (see {@link ClaimContendedError}): the key is
   * as good as in progress elsewhere, so the job is deferred like an in-progress duplicate,
   * without using an attempt.
   */
  #deferContended(job: Job, token: string | undefined, log: JobLogger): Promise<never> {
    return this.#defer(job, token, this.#timing.deferMinMs, log);
  }

  async #waitForOwner(outcome: ClaimOutcome & { kind: 'in-progress' }, fingerprint: string, claimOptions: ClaimOptions) {
    const { scope, key } = outcome;
    const settled = await this.#options.listener!.waitForSettled(scope, key, this.#timing.waitMs, async () => {
      const row = await this.#keys.get(scope, key);
      return row !== undefined && row.status !== 'processing';
    });
    return settled ? this.#keys.claim(scope, key, fingerprint, claimOptions) : outcome;
  }

  async #runLeased(
    job: Job,
    token: string | undefined,
    identity: JobIdentity<P>,
    claim: HeldClaim,
    bullSignal: AbortSignal | undefined,
    log: JobLogger,
  ): Promise<unknown> {
    const controller = new AbortController();
    bullSignal?.addEventListener('abort', () => controller.abort(bullSignal.reason), { once: true });
    const active: ActiveJob = { job, token, claim, controller };
    this.#active.add(active);
    const stopHeartbeat = this.#startHeartbeat(job, claim, controller, log);
    const startedAt = performance.now();
    let committed: { result: unknown } | undefined;
    // Created at the handler's first ctx.step: a handler without steps pays nothing for them.
    let steps: JobSteps | undefined;
    const commit = async (effect: (tx: Transaction<any>) => Promise<unknown>) => {
      if (controller.signal.aborted) throw controller.signal.reason;
      await steps?.assertComplete();
      const result = await this.#keys.commitEffect(claim, effect, () => this.#fault('before-commit', identity));
      committed = { result };
      // The key is completed: an extension would find no lease and report it lost.
      stopHeartbeat();
      return result;
    };
    const ctx = this.#context(
      job,
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
        steps ??= new JobSteps(this.#keys, claim, controller.signal, (report) =>
          this.#emit(`step-${report.outcome}`, job, claim, undefined, report),
        );
        return steps.run(name, body);
      },
    );
    try {
      const returned = await this.#options.handler(ctx);
      // An external-effect handler: its return value is the result, stored now, fenced.
      if (!committed) await commit(async () => returned);
      await this.#fault('after-commit', identity);
      const durationMs = performance.now() - startedAt;
      this.#emit('completed', job, claim, durationMs);
      log.info({ outcome: 'completed', durationMs: Math.round(durationMs) }, 'effect committed');
      return committed!.result;
    } catch (error) {
      if (committed) {
        log.warn({ err: error }, 'handler threw after its transaction committed; the job completes with the stored result');
        return committed.result;
      }
      // Before the key is released or failed, after which an extension would find no lease.
      stopHeartbeat();
      return await this.#handleHeldFailure(job, token, identity, claim, controller.signal, error, log, steps?.failedStep(error));
    } finally {
      stopHeartbeat();
      this.#active.delete(active);
    }
  }

  async #processFastPath(
    job: Job,
    token: string | undefined,
    identity: JobIdentity<P>,
    fingerprint: string,
    claimOptions: ClaimOptions,
    log: JobLogger,
  ): Promise<unknown> {
    const controller = new AbortController();
    const active: ActiveJob = { job, token, claim: undefined, controller };
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
            this.#emit(claim.attempts > 1 ? 'taken-over' : 'claimed', job, claim);
            announced = claim;
          }
          let transactionResult: { value: unknown } | undefined;
          const ctx = this.#context(
            job,
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
          const returned = await this.#options.handler(ctx);
          await this.#fault('before-commit', identity);
          return transactionResult ? transactionResult.value : returned;
        },
        claimOptions,
      );
    } catch (error) {
      return await this.#handleFastPathFailure(job, token, identity, fingerprint, claimOptions, error, log);
    } finally {
      this.#active.delete(active);
    }
    if (outcome.kind !== 'executed') return this.#settleUnheld(job, token, outcome, log);
    await this.#fault('after-commit', identity);
    const durationMs = performance.now() - startedAt;
    this.#emit('completed', job, outcome.claim, durationMs);
    log.info({ outcome: 'completed', fence: outcome.claim.fence, durationMs: Math.round(durationMs) }, 'effect committed');
    return outcome.result ?? null;
  }

  #context(
    job: Job,
    identity: JobIdentity<P>,
    claim: Claim,
    signal: AbortSignal,
    transaction: (fn: (tx: Transaction<any>) => Promise<unknown>) => Promise<unknown>,
    step: (name: string, body: ExternalStep<unknown> | DatabaseStep<unknown>) => Promise<unknown>,
  ): JobContext<P> {
    return {
      data: identity.payload,
      key: identity.key,
      scope: identity.scope,
      fence: claim.fence,
      attempt: claim.attempts,
      job,
      signal,
      transaction: transaction as JobContext<P>['transaction'],
      step: step as JobContext<P>['step'],
    };
  }

  /**
   * Extends the lease every `heartbeatMs`; on loss, aborts the handler's signal. One extension
   * at a time: a beat that finds the previous one still waiting skips. An extension that fails
   * (Postgres unreachable, or a lock wait past its timeout because a transaction that is
   * completing the key holds it) is "not known yet": the next beat tries again, and completion
   * is fenced anyway. The key found completed by this claim is the job's own commit, never a loss.
   */
  #startHeartbeat(job: Job, claim: Claim, controller: AbortController, log: JobLogger): () => void {
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
          this.#emit('lease-lost', job, claim);
          log.warn({ outcome: 'lease-lost' }, 'lease lost: another worker took the key over');
          controller.abort(new LeaseLostError(claim.scope, claim.key, claim.fence));
        } else {
          this.#emit('lease-extended', job, claim);
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

  async #handleHeldFailure(
    job: Job,
    token: string | undefined,
    identity: JobIdentity<P>,
    claim: Claim,
    signal: AbortSignal,
    error: unknown,
    log: JobLogger,
    step?: FailedStep,
  ): Promise<never> {
    if (error instanceof LeaseLostError || signal.reason instanceof LeaseLostError) {
      // Another worker owns the key now and will finish it; this job becomes a duplicate.
      this.#emit('fenced', job, claim);
      log.warn({ outcome: 'fenced' }, 'completion fenced: the key was taken over; deferring this job to replay');
      return this.#defer(job, token, this.#timing.deferMinMs, log);
    }
    if (signal.reason instanceof WorkerClosingError) throw error; // key already released by close()
    // Postgres, not the handler, failed (an ambiguous COMMIT was already resolved, as failed).
    if (findStoreUnavailable(error)) return this.#deferAfterStoreFault(job, token, error, log, claim);
    if (this.#isFinal(job, error)) {
      let stored: boolean;
      try {
        stored = await this.#keys.fail(claim, error, step);
      } catch (failError) {
        // The failure could not be recorded for now: run the job again later rather than lose it.
        if (findStoreUnavailable(failError)) return this.#deferAfterStoreFault(job, token, failError, log, claim);
        stored = false;
      }
      if (stored) this.#emit('failed', job, claim);
      log.warn({ outcome: 'failed', err: error, step: step?.name }, 'job failed permanently; error stored for replay');
      throw new UnrecoverableError(describeFailure(identity, error, step));
    }
    const released = await this.#keys.release(claim, error, step).catch(() => false);
    if (released) this.#emit('released', job, claim);
    log.info({ outcome: 'released', err: error, step: step?.name }, 'retryable error: key released for the next attempt');
    throw error;
  }

  async #handleFastPathFailure(
    job: Job,
    token: string | undefined,
    identity: JobIdentity<P>,
    fingerprint: string,
    claimOptions: ClaimOptions,
    error: unknown,
    log: JobLogger,
  ): Promise<never> {
    // The transaction rolled back (an ambiguous COMMIT was resolved by executeOnce): the key is
    // as it was before, nothing to release. A store fault is deferred, never stored.
    if (findStoreUnavailable(error)) return this.#deferAfterStoreFault(job, token, error, log);
    if (error instanceof ClaimContendedError) return this.#deferContended(job, token, log);
    if (!this.#isFinal(job, error)) {
      this.#emit('released', job);
      log.info({ outcome: 'released', err: error }, 'retryable error: transaction rolled back');
      throw error;
    }
    let outcome: ClaimOutcome | undefined;
    try {
      outcome = await this.#keys.recordFailure(identity.scope, identity.key, fingerprint, error, { ...claimOptions, leaseMs: this.#timing.leaseMs });
    } catch (recordError) {
      // Not recorded (recordFailure gave the key back if it could): run the job again later.
      if (findStoreUnavailable(recordError)) return this.#deferAfterStoreFault(job, token, recordError, log);
    }
    if (outcome && (outcome.kind === 'claimed' || outcome.kind === 'taken-over')) this.#emit('failed', job, outcome);
    log.warn({ outcome: 'failed', err: error }, 'job failed permanently; error stored for replay');
    throw new UnrecoverableError(describeFailure(identity, error));
  }

  /**
   * True when the error should be stored: permanent by disposition, or the job's last attempt.
   * A step mismatch always is: another attempt would run the same handler against the same steps.
   */
  #isFinal(job: Job, error: unknown): boolean {
    if (error instanceof StepMismatchError) return true;
    const disposition = (this.#options.errorDisposition ?? defaultErrorDisposition)(error, job);
    const attempts = job.opts.attempts ?? 1;
    return disposition === 'fail' || job.attemptsMade + 1 >= attempts;
  }

  async #fault(point: FaultPoint, identity: JobIdentity<P>): Promise<void> {
    if (this.#options.faultHook) await this.#options.faultHook(point, { scope: identity.scope, key: identity.key });
  }

  #emit(kind: WorkerEventKind, job: Job, claim?: Claim, durationMs?: number, step?: StepReport): void {
    this.#tracing.record(kind, job, claim, step);
    if (this.listenerCount('event') === 0) return;
    // A claim names its key; only events without one read the job's data again for it.
    const identity = claim ?? safeIdentity(job, this.#keyOf);
    this.emit('event', {
      kind,
      jobId: job.id,
      scope: identity?.scope,
      key: identity?.key,
      fence: claim?.fence,
      durationMs,
      ...(step && { step: step.name, position: step.position }),
    });
  }
}

function defaultErrorDisposition(error: unknown): ErrorDisposition {
  if (error instanceof UnrecoverableError) return 'fail';
  if (error instanceof IdempotencyError && (error.code === 'RESULT_NOT_STORABLE' || error instanceof ValidationError)) return 'fail';
  if (error instanceof StepsUnsupportedError || error instanceof StepMismatchError) return 'fail';
  return 'retry';
}

function describeFailure(identity: JobIdentity, error: unknown, step?: FailedStep): string {
  const message = error instanceof Error ? error.message : String(error);
  const where = step ? ` at step "${step.name}" (position ${step.position})` : '';
  return `Job for key "${identity.key}" in scope "${identity.scope}" failed${where}: ${message}`;
}

function safeIdentity<P>(job: Job, keyOf: (job: Job) => JobIdentity<P>): JobIdentity<P> | undefined {
  try {
    return keyOf(job);
  } catch {
    return undefined;
  }
}
