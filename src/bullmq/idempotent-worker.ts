import { EventEmitter } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { DelayedError, UnrecoverableError, WaitingError, isRedisInstance, type Job, type WorkerOptions } from 'bullmq';
import type { Logger } from 'pino';
import { defaultLogger } from '../default-logger.js';
import { resolveWorkerTiming, type ResolvedWorkerTiming, type WorkerTimingOptions } from '../consumer/worker-timing.js';
import { KeyedJobRunner } from '../consumer/keyed-job-runner.js';
import type { DataLayer } from '../store/data-layer.js';
import { defaultErrorDisposition, type ErrorDisposition } from '../consumer/runner-options.js';
import type { WorkerEvent } from '../consumer/worker-event.js';
import { checkDataLayersAtStart, dataLayersToCheck } from '../consumer/data-layer-check.js';
import type { FaultHook } from '../fault-hook.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import type { KeySettledListener } from '../store/key-settled-listener.js';
import { JobTracing } from '../telemetry/job-tracing.js';
import { identityFromWireContract, type JobIdentity } from '../consumer/wire-contract.js';
import { assertKeysFitConnection, warnOfClusterReadyCheck } from './redis-connection.js';
import { openWorker, postgresQueueSchema, type AnyWorker, type QueueConnectionOptions } from './queue-connection.js';
import { QueueLockLostError } from './queue-lock-lost-error.js';
import { delayWithoutAttempt } from './delay-without-attempt.js';
import { JobFinishInEffect } from './finish-in-effect.js';
import { runnerHandler, type DataLayerJobHandler, type DatabaseOnlyJobHandler, type JobHandler } from './job-handler.js';
import { ConcurrencyWaiterWakes } from './concurrency-waiter-wakes.js';
import { DataLayerElsewhereError, ValidationError } from '../errors.js';
import { WorkerErrorLog } from './worker-error-log.js';
import { redisAddress, watchRedisStart, type StartWatch } from './queue-start-wait.js';
import { assertStartupWaitMs } from '../service-unreachable.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';
import { WORKER_TIMING_OPTION_NAMES } from '../consumer/worker-timing.js';
import { QUEUE_CONNECTION_OPTION_NAMES, assertQueueBackend } from './queue-connection.js';


/** How long a forced close waits for BullMQ's worker to close (and then for its connections to disconnect). */
const FORCED_CLOSE_WAIT_MS = 5_000;

export type { DataLayerJobHandler, DatabaseOnlyJobContext, DatabaseOnlyJobHandler, JobContext, JobHandler } from './job-handler.js';
export type { ErrorDisposition } from '../consumer/runner-options.js';

/** Options of {@link createIdempotentWorker}. */
export interface IdempotentWorkerOptions<P = unknown, R = unknown> extends WorkerTimingOptions, QueueConnectionOptions {
  /** BullMQ queue name. */
  readonly queue: string;
  /** The claim protocol (its Kysely instance is where transactional effects run). */
  readonly keys: IdempotencyKeys;
  /**
   * The job: a function `async (ctx) => result`, or a database-only handler
   * `{ transaction: async (tx, ctx) => result }` (see {@link DatabaseOnlyHandler}: it runs on the
   * fast path and with group commit unless they are turned off).
   */
  readonly handler: JobHandler<P, R> | DatabaseOnlyJobHandler<P, R> | DataLayerJobHandler<P, R>;
  /** Jobs run at once by this worker. @defaultValue `1` */
  readonly concurrency?: number;
  /**
   * Single-transaction fast path for handlers whose effects only touch this database: claim,
   * effect and completion commit once. No lease, no heartbeat.
   * @defaultValue `true` for a database-only handler, `false` for a function
   */
  readonly fastPath?: boolean;
  /** Needed for `waitMs > 0`: wakes a waiting duplicate when the owner finishes. @defaultValue unset (a duplicate defers at once) */
  readonly listener?: KeySettledListener;
  /** Reads key, scope and payload from a job. @defaultValue the wire contract ({@link identityFromWireContract}) */
  readonly keyOf?: (job: Job) => JobIdentity<P>;
  /**
   * Which handler errors are stored (`'fail'`) and which release the key for BullMQ's retry
   * (`'retry'`). The last attempt's error is stored either way. Never consulted for a
   * `StoreUnavailableError` (a transient store fault, also when `ctx.transaction` throws it):
   * such a job is deferred without using an attempt.
   * @defaultValue `'fail'` for BullMQ's `UnrecoverableError` (`import { UnrecoverableError } from 'bullmq'`), validation errors and unstorable results; else `'retry'`
   */
  readonly errorDisposition?: (error: unknown, job: Job) => ErrorDisposition;
  /**
   * On the Postgres backend: BullMQ's move of the job to completed runs in the effect's
   * transaction (`ctx.transaction`, a database-only handler's, the fast path's), so the job is
   * completed if and only if its effect and its key's completion commit, and a committed effect
   * is never delivered again. The queue must be in the database of `keys`. Needs
   * `backend: 'postgres'`.
   * @defaultValue `true` on the Postgres backend, `false` on Redis
   */
  readonly finishJobInEffect?: boolean;
  /**
   * The data layers the handler writes in (`ctx.transaction(dataLayer, fn)`): each is checked
   * at start, in one transaction, to meet the keys in one database
   * ({@link IdempotencyKeys.checkDataLayer}). One on another database stops the start:
   * {@link IdempotentWorker.waitUntilReady} rejects with {@link DataLayerElsewhereError}, which
   * names the fix, and no job is taken. A database-only handler's own data layer
   * (`databaseOnly(dataLayer, …)`) is checked without being named here. A data layer named
   * nowhere is checked at its first transaction; found elsewhere there, the job is deferred
   * without using an attempt, and the error is logged, until the data layer is fixed.
   * @defaultValue none
   */
  readonly dataLayers?: readonly DataLayer<any>[];
  /** Keep each job's payload on its key so the sweeper can re-enqueue a lost job. @defaultValue `false` */
  readonly storePayload?: boolean;
  /** Structured logger. @defaultValue pino at `LOG_LEVEL`, else `warn` (docs/configuration.md, "Start-up and logs") */
  readonly logger?: Logger;
  /**
   * How long the worker waits for Redis to answer at start (milliseconds). Past it, the worker
   * closes itself and {@link IdempotentWorker.waitUntilReady} rejects with a
   * `ServiceUnreachableError` naming Redis and its address; meanwhile each failed try is one
   * warning line. `Infinity`: wait for as long as it takes (ioredis reconnects by itself).
   * @defaultValue `STARTUP_WAIT_MS` when set, else 60 000
   */
  readonly startupWaitMs?: number;
  /** Chaos testing only: called at named protocol points. @defaultValue unset */
  readonly faultHook?: FaultHook;
  /** Further BullMQ worker options (not those set above). @defaultValue none */
  readonly workerOptions?: Omit<WorkerOptions, 'connection' | 'prefix' | 'concurrency' | 'lockDuration' | 'stalledInterval' | 'maxStalledCount' | 'autorun'>;
}

export type { StepEventKind, WorkerEvent, WorkerEventKind } from '../consumer/worker-event.js';

const WORKER_OPTION_NAMES = optionNames<IdempotentWorkerOptions>()([
  ...QUEUE_CONNECTION_OPTION_NAMES,
  ...WORKER_TIMING_OPTION_NAMES,
  'queue', 'keys', 'handler', 'concurrency', 'fastPath', 'listener', 'keyOf', 'errorDisposition', 'finishJobInEffect', 'dataLayers',
  'storePayload', 'logger', 'startupWaitMs', 'faultHook', 'workerOptions',
]);

/**
 * A BullMQ worker that makes each job's effect happen once per idempotency key. Jobs follow
 * the wire contract ({@link WireJobData}, as {@link IdempotentProducer} adds them) unless
 * `keyOf` reads them otherwise. Throws a {@link ValidationError} (`INVALID_OPTIONS`) for
 * timings that contradict each other, and refuses a Redis Cluster prefix without a hash tag.
 *
 * @example
 * ```ts
 * import { IdempotencyKeys, createIdempotentWorker } from 'idempotent-jobs';
 *
 * const worker = createIdempotentWorker<{ orderId: string; cents: number }>({
 *   queue: 'payments',
 *   connection: { host: '127.0.0.1', port: 6379 },
 *   keys: new IdempotencyKeys({ db }),
 *   // The ledger row and the key's completion commit together: a redelivered job replays instead.
 *   handler: (ctx) =>
 *     ctx.transaction((tx) => tx.insertInto('ledger').values({ order_id: ctx.data.orderId, cents: ctx.data.cents }).execute()),
 * });
 * // A job that only writes to this database: fast path and group commit by default.
 * const ledger = createIdempotentWorker<{ amount: number }>({
 *   queue: 'ledger',
 *   connection: { host: '127.0.0.1', port: 6379 },
 *   keys: new IdempotencyKeys({ db }),
 *   handler: {
 *     transaction: async (tx, ctx) => {
 *       await tx.insertInto('ledger').values({ key: ctx.key, amount: ctx.data.amount }).execute();
 *       return { booked: ctx.data.amount };
 *     },
 *   },
 * });
 * ```
 */
export function createIdempotentWorker<P = unknown, R = unknown>(options: IdempotentWorkerOptions<P, R>): IdempotentWorker<P, R> {
  return new IdempotentWorker(options);
}

/**
 * A BullMQ worker whose jobs take effect once per idempotency key: what
 * {@link createIdempotentWorker} returns. It starts taking jobs when constructed.
 *
 * Each job's key is claimed in Postgres before the handler runs; a duplicate replays the stored
 * result (or error) instead of running, or is delayed while another worker holds the key,
 * without using an attempt. Emits `'event'` ({@link WorkerEvent}) for every outcome.
 *
 * @example
 * ```ts
 * import { IdempotencyKeys, createIdempotentWorker, createPostgresDb, type WorkerEvent } from 'idempotent-jobs';
 *
 * const db = createPostgresDb({ connectionString: 'postgres://postgres@127.0.0.1:5432/postgres' });
 * const worker = createIdempotentWorker<{ orderId: string; amount: number }, { charged: number }>({
 *   queue: 'payments',
 *   connection: { host: '127.0.0.1', port: 6379 },
 *   keys: new IdempotencyKeys({ db }),
 *   concurrency: 8,
 *   handler: (ctx) =>
 *     ctx.transaction(async (tx) => {
 *       await tx.insertInto('ledger').values({ order_id: ctx.data.orderId, amount: ctx.data.amount }).execute();
 *       return { charged: ctx.data.amount };
 *     }),
 * });
 * worker.on('event', (event: WorkerEvent) => {
 *   if (event.kind === 'replayed') console.log(`job ${event.jobId}: key ${event.key} was done already`);
 * });
 * await worker.waitUntilReady();
 * process.once('SIGTERM', () => {
 *   void worker.close().then(() => db.destroy());
 * });
 * ```
 */
export class IdempotentWorker<P = unknown, R = unknown> extends EventEmitter<{
  /** Every outcome of every job: claims, completions, replays, deferrals, failures, steps. */
  event: [WorkerEvent];
}> {
  readonly #options: IdempotentWorkerOptions<P, R>;
  readonly #timing: ResolvedWorkerTiming;
  readonly #log: Logger;
  readonly #runner: KeyedJobRunner<P, R, Job>;
  readonly #tokens = new WeakMap<Job, string | undefined>();
  readonly #bull: AnyWorker;
  readonly #tracing: JobTracing;
  /** Finishes jobs in their effect's transaction (`finishJobInEffect`), or undefined when BullMQ finishes them after the commit. */
  readonly #finishInEffect: JobFinishInEffect | undefined;
  /** With a listener: wakes the jobs it deferred for a concurrency limit when a slot frees. */
  readonly #wakes: ConcurrencyWaiterWakes | undefined;
  /** The start-up check of the data layers: resolves to the refusal that stopped the start, if any. */
  readonly #dataLayersChecked: Promise<DataLayerElsewhereError | undefined>;
  #closing: Promise<void> | undefined;
  /** The first connection to Redis, watched until it comes or the start's wait runs out. */
  readonly #start: StartWatch;
  /** Whether a caller awaits {@link IdempotentWorker.waitUntilReady}, which then carries a failed start. */
  #startAwaited = false;

  constructor(options: IdempotentWorkerOptions<P, R>) {
    super();
    refuseUnknownOptions(options, WORKER_OPTION_NAMES, 'createIdempotentWorker(options)');
    assertQueueBackend(options, 'createIdempotentWorker(options)');
    assertStartupWaitMs(options.startupWaitMs, 'createIdempotentWorker(options)');
    this.#options = Object.freeze({ ...options });
    const finishInEffect = options.finishJobInEffect ?? options.backend === 'postgres';
    if (finishInEffect && options.backend !== 'postgres') {
      throw new ValidationError('INVALID_OPTIONS', 'finishJobInEffect', "finishJobInEffect needs the queue in Postgres (backend: 'postgres'): on Redis the job's completion cannot join a Postgres transaction.");
    }
    const inEffect = finishInEffect
      ? new JobFinishInEffect(options.queue, postgresQueueSchema(options), (job) => this.#tokens.get(job), options.keys.options.maxResultBytes, options.workerOptions)
      : undefined;
    this.#finishInEffect = inEffect;
    this.#timing = resolveWorkerTiming(options, options.keys.options.leaseMs);
    this.#log = (options.logger ?? defaultLogger()).child({ queue: options.queue });
    assertKeysFitConnection(options, options.queue);
    warnOfClusterReadyCheck(options, this.#log);
    const identityOf = options.keyOf ?? (identityFromWireContract as (job: Job) => JobIdentity<P>);
    this.#tracing = new JobTracing(
      options.queue,
      (error) => error instanceof DelayedError,
      (job) => {
        try {
          return identityOf(job as Job);
        } catch {
          return undefined; // Data that names no valid key: the run fails it, and says why.
        }
      },
    );
    this.#wakes = options.listener && new ConcurrencyWaiterWakes(options.listener, options.queue);
    this.#runner = new KeyedJobRunner<P, R, Job>({
      keys: options.keys,
      timing: this.#timing,
      handler: runnerHandler(options.handler, inEffect),
      identityOf,
      errorDisposition: options.errorDisposition ?? bullmqErrorDisposition,
      fastPath: options.fastPath,
      listener: options.listener,
      wakesConcurrencyWaiters: this.#wakes !== undefined,
      storePayload: options.storePayload,
      logger: this.#log,
      faultHook: options.faultHook,
      events: { wanted: () => this.listenerCount('event') > 0, emit: (event) => this.emit('event', event) },
      tracing: this.#tracing,
    });
    const layers = dataLayersToCheck(options.dataLayers, options.handler);
    this.#bull = openWorker(options.queue, (job, token, signal) => this.#tracing.run(job, () => this.#process(job, token, signal)), options, {
      ...options.workerOptions,
      // With data layers to check, jobs are taken only once they passed.
      autorun: layers.length === 0,
      concurrency: options.concurrency ?? 1,
      lockDuration: this.#timing.lockDurationMs,
      stalledInterval: this.#timing.stalledIntervalMs,
      maxStalledCount: this.#timing.maxStalledCount,
    });
    const errors = new WorkerErrorLog((options.backend ?? 'redis') === 'redis' ? this.#log.child({ redis: redisAddress(options) }) : this.#log);
    this.#bull.on('error', (error) => errors.report(error));
    // The wait's own lines would repeat the error log's: it says only how the start ended.
    this.#start = watchRedisStart(this.#bull, options, this.#log.child({}, { level: 'silent' }), async (failure) => {
      if (!this.#startAwaited) this.#log.error({ service: failure.service, address: failure.address }, failure.message);
      // Never connected, so no job to put back. BullMQ's forced close ends the connections at
      // once, though its promise may wait on a connection that never came: a second is enough.
      this.#closing ??= Promise.race([this.#bull.close(true).then(() => {}, () => {}), sleep(1_000, undefined, { ref: false })]);
      await this.#closing;
    });
    this.#dataLayersChecked = layers.length === 0 ? Promise.resolve(undefined) : this.#checkDataLayersThenRun(layers);
  }

  /**
   * Checks each data layer, then starts taking jobs. A data layer on another database stops the
   * start (the refusal is logged, and {@link IdempotentWorker.waitUntilReady} rejects with it); a
   * check that could not be carried out (Postgres unreachable) does not: the data layer is then
   * checked at its first transaction, as one named nowhere is.
   */
  async #checkDataLayersThenRun(layers: readonly DataLayer<unknown>[]): Promise<DataLayerElsewhereError | undefined> {
    const refused = await checkDataLayersAtStart(this.#options.keys, layers, this.#log);
    if (refused) {
      await this.#bull.close().catch(() => {});
      return refused;
    }
    if (!this.#closing && !this.#bull.closing) {
      // As BullMQ's own autorun: a failure of the loop is the worker's error.
      this.#bull.run().catch((error: unknown) => this.#bull.emit('error', error as Error));
    }
    return undefined;
  }

  /** The underlying BullMQ worker (for events such as `completed` and `failed`). */
  get bullWorker(): AnyWorker {
    return this.#bull;
  }

  /** The resolved timing options. */
  get timing(): ResolvedWorkerTiming {
    return this.#timing;
  }

  /**
   * Resolves when the worker is connected and taking jobs. Rejects with
   * {@link DataLayerElsewhereError} when a data layer it was given is on another database than
   * the keys (see {@link IdempotentWorkerOptions.dataLayers}): the worker then takes no job.
   * Rejects with a `ServiceUnreachableError` when Redis did not answer within
   * {@link IdempotentWorkerOptions.startupWaitMs}: the worker has then closed itself.
   */
  async waitUntilReady(): Promise<unknown> {
    this.#startAwaited = true;
    const refused = await this.#dataLayersChecked;
    if (refused) throw refused;
    const failure = await this.#start.failure;
    if (failure) throw failure;
    return this.#bull.waitUntilReady();
  }

  /**
   * Graceful shutdown: stop taking jobs, let active ones finish within `shutdownTimeoutMs`;
   * then abort the rest (their `ctx.signal` fires), release their keys so another worker takes
   * them over at once, and close. The forced part waits at most 5 s for BullMQ's own close (a
   * Redis that does not answer, a BullMQ loop stuck on its connection), then disconnects the
   * connections BullMQ opened for the worker and returns. Does not close the IdempotencyKeys'
   * database.
   *
   * @param options.force - skip the wait: abort and release active jobs at once
   */
  close(options: { force?: boolean } = {}): Promise<void> {
    this.#wakes?.close();
    this.#start.stop();
    if (options.force) return this.#forceClose();
    this.#closing ??= (async () => {
      this.#log.info({ active: this.#runner.activeCount }, 'closing: waiting for active jobs');
      const graceful = this.#bull.close().then(() => true);
      const finished = await Promise.race([graceful, sleep(this.#timing.shutdownTimeoutMs, false, { ref: false })]);
      if (!finished) await this.#forceClose();
      await this.#runner.close();
      this.#log.info('closed');
    })();
    return this.#closing;
  }

  async #forceClose(): Promise<void> {
    const abandoned = await this.#runner.abandonActive();
    // Not waited for: the concurrency slots kept for reuse are freed beside the moves (a release
    // that fails is logged; the slot frees itself when its time is up).
    void this.#runner.close();
    const closed = await Promise.race([
      (async () => {
        // Put the jobs straight back in the queue instead of waiting for them to stall.
        await Promise.all(abandoned.map(({ message: job }) => job.moveToWait(this.#tokens.get(job)).catch(() => {})));
        await this.#bull.close(true);
        return true;
      })(),
      sleep(FORCED_CLOSE_WAIT_MS, false, { ref: false }),
    ]);
    if (closed) return;
    // Redis unreachable (the moves wait for it), or BullMQ's loop stuck on a connection that
    // never comes back: a forced close must still end, or a second SIGTERM could not stop the
    // process. The abandoned jobs' keys are released already; their BullMQ jobs stall back.
    this.#log.error({ waitedMs: FORCED_CLOSE_WAIT_MS }, "BullMQ's worker did not close in time; its own connections are disconnected instead");
    await Promise.race([this.#disconnectOwnConnections().catch(() => {}), sleep(FORCED_CLOSE_WAIT_MS, undefined, { ref: false })]);
  }

  /**
   * Disconnects the connections BullMQ opened for this worker. A client the caller passed in may
   * be shared (with their producers, say), so then only BullMQ's duplicate of it is: the blocking
   * client, which BullMQ 6 keeps on its backend (no public method reaches it).
   */
  #disconnectOwnConnections(): Promise<void> {
    if (!isRedisInstance(this.#options.connection)) return this.#bull.disconnect();
    const backend = (this.#bull as unknown as { backend?: { disconnectBlocking?(wait: boolean): Promise<void> } }).backend;
    return backend?.disconnectBlocking?.(false) ?? Promise.resolve();
  }

  /** See {@link delayWithoutAttempt}. */
  #delay(job: Job, token: string | undefined, delayMs: number): Promise<Error> {
    return delayWithoutAttempt(job, token, delayMs, this.#timing.lockDurationMs, this.#log);
  }

  async #process(job: Job, token: string | undefined, bullSignal?: AbortSignal): Promise<unknown> {
    this.#tokens.set(job, token);
    this.#wakes?.running(job);
    const outcome = await this.#runner.run({
      message: job,
      id: job.id,
      label: `Job ${job.id} on queue "${this.#options.queue}"`,
      queue: this.#options.queue,
      name: job.name,
      lastAttempt: job.attemptsMade + 1 >= (job.opts.attempts ?? 1),
      // Activations that used no attempt (deferrals, stalls): no write is needed to keep a count.
      deferrals: job.attemptsStarted - job.attemptsMade - 1,
      deliveryCount: job.attemptsStarted,
      sentAtMs: job.timestamp,
      signal: bullSignal,
    });
    switch (outcome.kind) {
      case 'completed':
        if (this.#finishInEffect?.finished(job)) {
          // BullMQ's move to completed committed with the effect: tell BullMQ's worker the job
          // is no longer its to move (WaitingError: "moved by the processor"), and say what its
          // own completion would have said.
          this.#bull.emit('completed', job, outcome.result, 'active');
          throw new WaitingError();
        }
        return outcome.result;
      case 'replayed':
        return outcome.result;
      case 'replayed-failure':
        throw new UnrecoverableError(outcome.error.message);
      case 'key-reused':
        throw new UnrecoverableError(`Job ${job.id}: ${outcome.error.message}`);
      case 'invalid-message':
        throw new UnrecoverableError(outcome.reason);
      case 'failed-permanently':
        throw new UnrecoverableError(outcome.description);
      case 'store-unavailable':
        // The job is no longer this worker's (its lock was lost): nothing to move; its holder runs it.
        if (outcome.error instanceof QueueLockLostError) throw new WaitingError();
      // falls through
      case 'deferred': {
        // Delayed without using an attempt; one waiting for a concurrency slot is woken when one frees.
        const moved = outcome.kind === 'deferred' && outcome.reason === 'concurrency-limit' ? this.#wakes?.deferring(job) : undefined;
        const delayed = await this.#delay(job, token, outcome.retryAfterMs);
        moved?.();
        throw delayed;
      }
      case 'abandoned':
        // Given back at the shutdown deadline (the key released): back to wait without using an
        // attempt, not failed with the error the handler ended on when its signal aborted. The
        // forced close moves it too; whichever move comes second finds the lock gone.
        await job.moveToWait(token).catch(() => {});
        throw new WaitingError();
      case 'retry':
        throw outcome.error;
    }
  }
}

/** The runner's default, and BullMQ's `UnrecoverableError` is stored for good too. */
function bullmqErrorDisposition(error: unknown): ErrorDisposition {
  if (error instanceof UnrecoverableError) return 'fail';
  return defaultErrorDisposition(error);
}
