import { EventEmitter } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { DelayedError, UnrecoverableError, Worker, type ConnectionOptions, type Job, type WorkerOptions } from 'bullmq';
import { pino, type Logger } from 'pino';
import { resolveWorkerTiming, type ResolvedWorkerTiming, type WorkerTimingOptions } from '../config/worker-timing.js';
import {
  KeyedJobRunner,
  defaultErrorDisposition,
  type ErrorDisposition,
  type KeyedJobContext,
} from '../consumer/keyed-job-runner.js';
import type { WorkerEvent } from '../consumer/worker-event.js';
import { handlerForm, type DatabaseOnlyHandler } from '../consumer/database-only-handler.js';
import type { FaultHook } from '../fault-hook.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import type { KeySettledListener } from '../store/key-settled-listener.js';
import { JobTracing } from '../telemetry/job-tracing.js';
import { identityFromWireContract, type JobIdentity } from './job-identity.js';
import { assertKeysFitConnection } from './redis-connection.js';

/**
 * What a handler receives for one job whose key this worker holds: the broker-agnostic
 * context ({@link KeyedJobContext}, where `message` is the job too) and the BullMQ job.
 */
export interface JobContext<P = unknown> extends KeyedJobContext<P, Job> {
  /** The BullMQ job being run (the same object as `message`). */
  readonly job: Job;
}

/** The user's job handler. Its return value is stored (when it never calls `ctx.transaction`). */
export type JobHandler<P = unknown, R = unknown> = (ctx: JobContext<P>) => Promise<R>;

/** What a database-only handler's transaction receives: {@link JobContext} without `transaction` and `step`. */
export type DatabaseOnlyJobContext<P = unknown> = Omit<JobContext<P>, 'transaction' | 'step'>;

/** A database-only handler for the BullMQ worker (see {@link DatabaseOnlyHandler}). */
export type DatabaseOnlyJobHandler<P = unknown, R = unknown> = DatabaseOnlyHandler<P, R, DatabaseOnlyJobContext<P>>;

export type { ErrorDisposition } from '../consumer/keyed-job-runner.js';

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
  /**
   * The job: a function `async (ctx) => result`, or a database-only handler
   * `{ transaction: async (tx, ctx) => result }` (see {@link DatabaseOnlyHandler}: it runs on the
   * fast path and with group commit unless they are turned off).
   */
  readonly handler: JobHandler<P, R> | DatabaseOnlyJobHandler<P, R>;
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
  readonly #bull: Worker;
  readonly #tracing: JobTracing;
  #closing: Promise<void> | undefined;

  constructor(options: IdempotentWorkerOptions<P, R>) {
    super();
    this.#options = Object.freeze({ ...options });
    this.#timing = resolveWorkerTiming(options, options.keys.options.leaseMs);
    this.#log = (options.logger ?? pino()).child({ queue: options.queue });
    assertKeysFitConnection(options.connection, options.prefix, options.queue);
    this.#tracing = new JobTracing(options.queue, (error) => error instanceof DelayedError);
    const handler = options.handler;
    this.#runner = new KeyedJobRunner<P, R, Job>({
      keys: options.keys,
      timing: this.#timing,
      handler:
        handlerForm(handler) === 'database-only'
          ? { transaction: (tx, ctx) => (handler as DatabaseOnlyJobHandler<P, R>).transaction(tx, { ...ctx, job: ctx.message }) }
          : (ctx) => (handler as JobHandler<P, R>)({ ...ctx, job: ctx.message }),
      identityOf: options.keyOf ?? (identityFromWireContract as (job: Job) => JobIdentity<P>),
      errorDisposition: options.errorDisposition ?? bullmqErrorDisposition,
      fastPath: options.fastPath,
      listener: options.listener,
      storePayload: options.storePayload,
      logger: this.#log,
      faultHook: options.faultHook,
      events: { wanted: () => this.listenerCount('event') > 0, emit: (event) => this.emit('event', event) },
      tracing: this.#tracing,
    });
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
    // Put the jobs straight back in the queue instead of waiting for them to stall.
    await Promise.all(abandoned.map(({ message: job }) => job.moveToWait(this.#tokens.get(job)).catch(() => {})));
    await this.#bull.close(true);
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
      signal: bullSignal,
    });
    switch (outcome.kind) {
      case 'completed':
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
      case 'deferred':
      case 'store-unavailable':
        // Delayed without using an attempt.
        await job.moveToDelayed(Date.now() + outcome.retryAfterMs, token);
        throw new DelayedError();
      case 'retry':
      case 'abandoned':
        throw outcome.error;
    }
  }
}

/** The runner's default, and BullMQ's `UnrecoverableError` is stored for good too. */
function bullmqErrorDisposition(error: unknown): ErrorDisposition {
  if (error instanceof UnrecoverableError) return 'fail';
  return defaultErrorDisposition(error);
}
