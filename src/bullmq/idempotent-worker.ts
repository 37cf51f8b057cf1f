import { EventEmitter } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { DelayedError, Job, UnrecoverableError, WaitingError, isRedisInstance, type WorkerOptions } from 'bullmq';
import type { Transaction } from 'kysely';
import { pino, type Logger } from 'pino';
import { resolveWorkerTiming, type ResolvedWorkerTiming, type WorkerTimingOptions } from '../consumer/worker-timing.js';
import { KeyedJobRunner } from '../consumer/keyed-job-runner.js';
import type { KeyedJobContext, TransactionOptions } from '../consumer/job-context.js';
import type { DataLayer } from '../store/data-layer.js';
import { defaultErrorDisposition, type ErrorDisposition } from '../consumer/runner-options.js';
import type { WorkerEvent } from '../consumer/worker-event.js';
import { handlerForm, isDataLayerHandler, withDatabaseOnlyContext, type DataLayerHandler, type DatabaseOnlyContext, type DatabaseOnlyHandler } from '../consumer/database-only-handler.js';
import { checkDataLayersAtStart, dataLayersToCheck } from '../consumer/data-layer-check.js';
import type { FaultHook } from '../fault-hook.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import type { KeySettledListener } from '../store/key-settled-listener.js';
import { JobTracing } from '../telemetry/job-tracing.js';
import { identityFromWireContract, type JobIdentity } from '../consumer/wire-contract.js';
import { assertKeysFitConnection, warnOfClusterReadyCheck } from './redis-connection.js';
import { openWorker, postgresQueueSchema, type AnyWorker, type QueueConnectionOptions } from './queue-connection.js';
import { openTransactionQueue } from './transaction-queue.js';
import { QueueLockLostError, isLockRefusal } from './queue-lock-lost-error.js';
import { DataLayerElsewhereError, ValidationError } from '../errors.js';
import { WorkerErrorLog } from './worker-error-log.js';

/**
 * What a handler receives for one job whose key this worker holds: the broker-agnostic
 * context ({@link KeyedJobContext}, where `message` is the job too) and the BullMQ job.
 */
export interface JobContext<P = unknown> extends KeyedJobContext<P, Job> {
  /** The BullMQ job being run (the same object as `message`). */
  readonly job: Job;
}

/** How long a forced close waits for BullMQ's worker to close (and then for its connections to disconnect). */
const FORCED_CLOSE_WAIT_MS = 5_000;

/** The user's job handler. Its return value is stored (when it never calls `ctx.transaction`). */
export type JobHandler<P = unknown, R = unknown> = (ctx: JobContext<P>) => Promise<R>;

/** What a database-only handler's transaction receives: {@link JobContext} without `transaction` and `step`. */
export type DatabaseOnlyJobContext<P = unknown> = Omit<JobContext<P>, 'transaction' | 'step'>;

/** A database-only handler for the BullMQ worker (see {@link DatabaseOnlyHandler}). */
export type DatabaseOnlyJobHandler<P = unknown, R = unknown> = DatabaseOnlyHandler<P, R, DatabaseOnlyJobContext<P>>;

/** A database-only handler written in a data layer of your own, for the BullMQ worker (see {@link DataLayerHandler}). */
export type DataLayerJobHandler<P = unknown, R = unknown> = DataLayerHandler<P, R, DatabaseOnlyJobContext<P>, any>;

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
   * @defaultValue `'fail'` for `UnrecoverableError`, validation errors and unstorable results; else `'retry'`
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
  /** Structured logger. @defaultValue `pino()` at level info */
  readonly logger?: Logger;
  /** Chaos testing only: called at named protocol points. @defaultValue unset */
  readonly faultHook?: FaultHook;
  /** Further BullMQ worker options (not those set above). @defaultValue none */
  readonly workerOptions?: Omit<WorkerOptions, 'connection' | 'prefix' | 'concurrency' | 'lockDuration' | 'stalledInterval' | 'maxStalledCount' | 'autorun'>;
}

export type { StepEventKind, WorkerEvent, WorkerEventKind } from '../consumer/worker-event.js';

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
  /** Jobs whose move to completed ran in an effect transaction (it committed if the run completed). */
  readonly #finishedInEffect = new WeakSet<Job>();
  /** The start-up check of the data layers: resolves to the refusal that stopped the start, if any. */
  readonly #dataLayersChecked: Promise<DataLayerElsewhereError | undefined>;
  #closing: Promise<void> | undefined;

  constructor(options: IdempotentWorkerOptions<P, R>) {
    super();
    this.#options = Object.freeze({ ...options });
    const finishInEffect = options.finishJobInEffect ?? options.backend === 'postgres';
    if (finishInEffect && options.backend !== 'postgres') {
      throw new ValidationError('INVALID_OPTIONS', 'finishJobInEffect', "finishJobInEffect needs the queue in Postgres (backend: 'postgres'): on Redis the job's completion cannot join a Postgres transaction.");
    }
    const finish = finishInEffect
      ? <T>(tx: Transaction<any>, ctx: { message: Job; scope: string; key: string }, result: T) => this.#finishInTransaction(tx, ctx, result)
      : undefined;
    this.#timing = resolveWorkerTiming(options, options.keys.options.leaseMs);
    this.#log = (options.logger ?? pino()).child({ queue: options.queue });
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
    const handler = options.handler;
    this.#runner = new KeyedJobRunner<P, R, Job>({
      keys: options.keys,
      timing: this.#timing,
      handler:
        handlerForm(handler) === 'database-only'
          ? isDataLayerHandler(handler)
            ? // A data layer's transaction is the ORM's: the job is finished as BullMQ finishes it.
              withDatabaseOnlyContext(handler as DataLayerJobHandler<P, R>, (ctx: DatabaseOnlyContext<P, Job>) => ({ ...ctx, job: ctx.message }))
            : {
                transaction: async (tx, ctx) => {
                  const result = await (handler as DatabaseOnlyJobHandler<P, R>).transaction(tx, { ...ctx, job: ctx.message });
                  await finish?.(tx, ctx, result);
                  return result;
                },
              }
          : (ctx) =>
              (handler as JobHandler<P, R>)({
                ...ctx,
                job: ctx.message,
                transaction: finish ? finishingTransaction(ctx, finish) : ctx.transaction,
              }),
      identityOf,
      errorDisposition: options.errorDisposition ?? bullmqErrorDisposition,
      fastPath: options.fastPath,
      listener: options.listener,
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
    const errors = new WorkerErrorLog(this.#log);
    this.#bull.on('error', (error) => errors.report(error));
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
   */
  async waitUntilReady(): Promise<unknown> {
    const refused = await this.#dataLayersChecked;
    if (refused) throw refused;
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
    if (options.force) return this.#forceClose();
    this.#closing ??= (async () => {
      this.#log.info({ active: this.#runner.activeCount }, 'closing: waiting for active jobs');
      const graceful = this.#bull.close().then(() => true);
      const finished = await Promise.race([graceful, sleep(this.#timing.shutdownTimeoutMs, false, { ref: false })]);
      if (!finished) await this.#forceClose();
      this.#log.info('closed');
    })();
    return this.#closing;
  }

  async #forceClose(): Promise<void> {
    const abandoned = await this.#runner.abandonActive();
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

  /**
   * Moves `job` to completed on the effect's transaction `tx` (the Postgres backend), with the
   * token this worker holds it under: BullMQ's own move. Refused because the lock was lost, it
   * throws a {@link QueueLockLostError}, which rolls the effect back and defers like a store
   * fault (no attempt used, the key released) instead of failing the key.
   */
  async #finishInTransaction(tx: Transaction<any>, ctx: { message: Job; scope: string; key: string }, result: unknown): Promise<void> {
    const job = ctx.message;
    const queue = openTransactionQueue(this.#options.queue, tx, postgresQueueSchema(this.#options));
    try {
      const bound = Job.fromJSON(queue as never, job.asJSON(), job.id);
      await bound.moveToCompleted(result, this.#tokens.get(job) ?? '', false);
      job.returnvalue = result;
      job.finishedOn = bound.finishedOn;
    } catch (error) {
      if (isLockRefusal(error)) throw new QueueLockLostError(ctx.scope, ctx.key, job.id, { cause: error });
      throw error;
    } finally {
      await queue.close();
    }
    this.#finishedInEffect.add(job);
  }

  /** See {@link delayWithoutAttempt}. */
  #delay(job: Job, token: string | undefined, delayMs: number): Promise<Error> {
    return delayWithoutAttempt(job, token, delayMs, this.#timing.lockDurationMs, this.#log);
  }

  async #process(job: Job, token: string | undefined, bullSignal?: AbortSignal): Promise<unknown> {
    this.#tokens.set(job, token);
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
        if (this.#finishedInEffect.has(job)) {
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
      case 'deferred':
        // Delayed without using an attempt.
        throw await this.#delay(job, token, outcome.retryAfterMs);
      case 'retry':
      case 'abandoned':
        throw outcome.error;
    }
  }
}

/**
 * What the processor throws to leave a job delayed without using an attempt. A move that the
 * queue's store does not answer (Redis, or the queue's Postgres, restarting) is tried again
 * for up to the lock's duration: thrown to BullMQ, its error would count as the job's failure,
 * and on the Postgres backend BullMQ could store it as failed once the server is back. If the
 * store still does not answer, the job is left to BullMQ's stall detection, which gives it
 * back (`WaitingError`: the processor has dealt with it; stalls never fail a job here, see
 * `maxStalledCount`): an infrastructure fault delays a job, it never fails it.
 */
export async function delayWithoutAttempt(job: Job, token: string | undefined, delayMs: number, lockDurationMs: number, log: Logger): Promise<Error> {
  const deadline = performance.now() + lockDurationMs;
  for (let waitMs = 100; ; waitMs = Math.min(waitMs * 2, 2_000)) {
    try {
      await job.moveToDelayed(Date.now() + delayMs, token);
      return new DelayedError();
    } catch (error) {
      // The job is no longer this worker's: its holder runs it.
      if (isLockRefusal(error)) return new WaitingError();
      if (performance.now() + waitMs > deadline) {
        log.warn({ err: error, jobId: job.id }, "could not delay the job: the queue's store did not answer; BullMQ's stall detection gives it back");
        return new WaitingError();
      }
      await sleep(waitMs);
    }
  }
}

/** The runner's default, and BullMQ's `UnrecoverableError` is stored for good too. */
function bullmqErrorDisposition(error: unknown): ErrorDisposition {
  if (error instanceof UnrecoverableError) return 'fail';
  return defaultErrorDisposition(error);
}

/** How the worker finishes a job inside its effect's transaction (the Postgres backend's `finishJobInEffect`). */
type FinishInEffect = <T>(tx: Transaction<any>, ctx: { message: Job; scope: string; key: string }, result: T) => Promise<void>;

/**
 * `ctx.transaction` that also finishes the job in the effect's transaction: `ctx.transaction(fn)`
 * runs on the worker's Kysely transaction, where BullMQ's move to completed can join it;
 * `ctx.transaction(dataLayer, fn)` runs on the data layer's own, which BullMQ cannot reach, so
 * the job is then finished as BullMQ finishes any job, after the commit.
 */
function finishingTransaction<P>(ctx: KeyedJobContext<P, Job>, finish: FinishInEffect): KeyedJobContext<P, Job>['transaction'] {
  // `second` is the data layer's callback, or the options of `ctx.transaction(fn, options)`.
  const transaction = (first: DataLayer<unknown> | ((tx: Transaction<any>) => Promise<unknown>), second?: unknown) => {
    if (typeof first !== 'function') return ctx.transaction(first, second as (tx: unknown) => Promise<unknown>);
    const finishing = async (tx: Transaction<any>) => {
      const result = await first(tx);
      await finish(tx, ctx, result);
      return result;
    };
    return ctx.transaction(finishing, second as TransactionOptions | undefined);
  };
  return transaction as KeyedJobContext<P, Job>['transaction'];
}

