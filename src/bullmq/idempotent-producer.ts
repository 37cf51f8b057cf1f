import { randomBytes } from 'node:crypto';
import type { JobsOptions } from 'bullmq';
import type { Kysely } from 'kysely';
import { KeyReusedError } from '../errors.js';
import { sha256Fingerprint, type Fingerprinter } from '../fingerprint.js';
import { DEFAULT_SCOPE, assertValidKeyPart } from '../protocol/validate.js';
import { OutboxStore } from '../store/outbox-store.js';
import type { KeyRetention } from '../store/records.js';
import { MessageSpans } from '../telemetry/message-spans.js';
import { messageAttributes } from '../telemetry/trace-attributes.js';
import { addOrReplaceFinished } from './add-or-replace-finished.js';
import { jobIdFor, toWireJobData, type ConcurrencyLimit } from '../consumer/wire-contract.js';
import { assertKeysFitConnection } from './redis-connection.js';
import { openQueue, postgresQueueSchema, type AnyQueue, type QueueConnectionOptions } from './queue-connection.js';
import { openTransactionQueue } from './transaction-queue.js';
import { ValidationError } from '../errors.js';
import { defaultLogger } from '../default-logger.js';
import { redisAddress, watchRedisStart, type StartWatch } from './queue-start-wait.js';
import { assertStartupWaitMs } from '../service-unreachable.js';
import { WorkerErrorLog } from './worker-error-log.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';
import { QUEUE_CONNECTION_OPTION_NAMES, assertQueueBackend } from './queue-connection.js';

/** Options of {@link IdempotentProducer}. */
export interface IdempotentProducerOptions extends QueueConnectionOptions {
  /** BullMQ queue name. */
  readonly queue: string;
  /** Scope for requests that name none. @defaultValue `'default'` */
  readonly defaultScope?: string;
  /** Schema of the outbox table, for transactional enqueues through the outbox. @defaultValue `'idempotent_jobs'` */
  readonly schema?: string;
  /**
   * Where an enqueue given a transaction (`{ tx }`) writes: `'queue'` adds the BullMQ job itself
   * in that transaction (the Postgres backend only, with the queue in the transaction's
   * database: no outbox, no relay); `'outbox'` writes an outbox row that the {@link OutboxRelay}
   * adds once the transaction has committed.
   * @defaultValue `'queue'` on the Postgres backend, `'outbox'` on Redis
   */
  readonly enqueueInTransaction?: 'queue' | 'outbox';
  /** Must match the workers' fingerprinter. @defaultValue SHA-256 of canonical JSON */
  readonly fingerprint?: Fingerprinter;
  /** Options for every job (attempts, backoff, removeOnComplete…); a request's `opts` override them. @defaultValue none (BullMQ's defaults) */
  readonly defaultJobOptions?: Omit<JobsOptions, 'jobId'>;
  /**
   * How long the producer waits for Redis to answer at start (milliseconds). Past it, the
   * producer closes itself and every enqueue rejects with a `ServiceUnreachableError` naming
   * Redis and its address; meanwhile each failed try is one warning line. `Infinity`: wait for as
   * long as it takes.
   * @defaultValue `STARTUP_WAIT_MS` when set, else 60 000
   */
  readonly startupWaitMs?: number;
}

/** One job to enqueue. */
export interface EnqueueRequest<P = unknown> {
  /** Job name; part of the fingerprint. */
  readonly name: string;
  /** Namespace of the key. @defaultValue the producer's `defaultScope` */
  readonly scope?: string;
  /** The idempotency key: 1–255 characters; the same key is the same job. */
  readonly key: string;
  /** The payload the handler receives. */
  readonly data: P;
  /** BullMQ options; `jobId` is derived from scope + key and cannot be set. */
  readonly opts?: Omit<JobsOptions, 'jobId'>;
  /**
   * At most `limit` jobs naming the same concurrency key `key` (e.g. `tenant:acme`) run at once,
   * across all workers; the others wait, deferred without using an attempt. Not part of the
   * fingerprint. A list of up to 4 limits with distinct keys (e.g. the tenant's and one in all:
   * `[{ key: 'tenant:acme', limit: 2 }, { key: 'all-syncs', limit: 10 }]`): the job runs only
   * while it holds a slot of each. See the guide's "Per-key concurrency limits".
   * @defaultValue unset (no limit)
   */
  readonly concurrency?: ConcurrencyLimit | readonly ConcurrencyLimit[];
  /**
   * Coalescing mode instead of idempotency: while a job of this key runs, further jobs collapse
   * into one pending successor carrying the newest `data`, run after it; the same key with other
   * data is the next run, not `KEY_REUSED`. Each such job gets a job id of its own
   * (`ijc_` and 32 random hex digits). See the guide's "Coalescing while running".
   * @defaultValue `false`
   */
  readonly coalesce?: boolean;
  /**
   * This job's own retention: how long its key's result is kept and replayed (`resultMs`), and
   * how long its tombstone refuses duplicates once the janitor deleted the key (`tombstoneMs`;
   * `0`: none), each counted from when the key finished. Workers hold each part to their
   * `maxJobRetentionMs` / `maxJobTombstoneMs` (a larger one gets the bound, with a warning in
   * the job's log). A malformed value throws a `ValidationError` (`INVALID_JOB_DATA`) here. Not
   * part of the fingerprint. See the guide's "Per-job retention".
   * @defaultValue unset (the workers' `retentionMs`, the janitor's `tombstoneMs`)
   * @example
   * ```ts
   * import { IdempotentProducer } from 'idempotent-jobs';
   *
   * const producer = new IdempotentProducer({ queue: 'payments', connection: { host: '127.0.0.1' } });
   * // Replayed for 7 days; duplicates refused for 90 days after it finished.
   * await producer.enqueue({ name: 'charge', key: 'order-42', data: { cents: 1999 }, retention: { resultMs: 604_800_000, tombstoneMs: 7_776_000_000 } });
   * await producer.close();
   * ```
   */
  readonly retention?: KeyRetention;
}

/** What happened to one enqueue. */
export interface EnqueueResult {
  /** The BullMQ job id, derived from scope and key ({@link jobIdFor}). */
  readonly jobId: string;
  /** The key's scope (the producer's `defaultScope` when the request named none). */
  readonly scope: string;
  /** The idempotency key. */
  readonly key: string;
  /**
   * `added`: a new job (replacing, if need be, a finished job of an earlier request with
   * another payload); `duplicate`: the job for this key already exists with the same payload,
   * so BullMQ kept the existing one; `outboxed`: written to the outbox in the caller's transaction.
   * Added in the caller's transaction (the Postgres backend), a job is `added` or `duplicate` as
   * that transaction sees the queue, and exists once it commits.
   */
  readonly status: 'added' | 'duplicate' | 'outboxed';
}

const PRODUCER_OPTION_NAMES = optionNames<IdempotentProducerOptions>()([
  ...QUEUE_CONNECTION_OPTION_NAMES,
  'queue', 'defaultScope', 'schema', 'enqueueInTransaction', 'fingerprint', 'defaultJobOptions', 'startupWaitMs',
]);
const ENQUEUE_REQUEST_NAMES = optionNames<EnqueueRequest>()(['name', 'scope', 'key', 'data', 'opts', 'concurrency', 'coalesce', 'retention']);

/**
 * Enqueues jobs carrying idempotency keys, under the wire contract. The job id is derived from
 * scope + key, so a duplicate add while the job exists is a no-op. With a different payload
 * (or job name) it is refused with {@link KeyReusedError} while the existing job is still
 * waiting, delayed or running; once that job has finished it is replaced, never silently kept:
 * the new job runs if the key's record has expired, and the worker refuses it as reused if
 * not. Given a transaction, it writes to the outbox instead, and the relay delivers the jobs
 * once that transaction commits.
 *
 * @example
 * ```ts
 * import { IdempotentProducer, KeyReusedError } from 'idempotent-jobs';
 *
 * const producer = new IdempotentProducer({ queue: 'payments', connection: { host: '127.0.0.1' } });
 * try {
 *   const { jobId, status } = await producer.enqueue({ name: 'charge', scope: 'acme', key: 'order-42', data: { cents: 1999 } });
 *   console.log(jobId, status); // 'added' the first time, 'duplicate' when sent again
 * } catch (error) {
 *   if (error instanceof KeyReusedError) console.error('order-42 was already sent with another payload');
 *   else throw error;
 * }
 *
 * // Transactional: the job is enqueued if and only if the order commits (the OutboxRelay delivers it).
 * await db.transaction().execute(async (tx) => {
 *   await tx.insertInto('orders').values({ id: 43, cents: 500 }).execute();
 *   await producer.enqueue({ name: 'charge', key: 'order-43', data: { cents: 500 } }, { tx });
 * });
 * await producer.close();
 * ```
 */
export class IdempotentProducer {
  readonly #options: IdempotentProducerOptions;
  readonly #queue: AnyQueue;
  readonly #fingerprint: Fingerprinter;
  readonly #inTransaction: 'queue' | 'outbox';
  readonly #start: StartWatch;

  constructor(options: IdempotentProducerOptions) {
    refuseUnknownOptions(options, PRODUCER_OPTION_NAMES, 'new IdempotentProducer(options)');
    assertQueueBackend(options, 'new IdempotentProducer(options)');
    assertStartupWaitMs(options.startupWaitMs, 'new IdempotentProducer(options)');
    this.#options = Object.freeze({ ...options });
    this.#inTransaction = options.enqueueInTransaction ?? (options.backend === 'postgres' ? 'queue' : 'outbox');
    if (this.#inTransaction === 'queue' && options.backend !== 'postgres') {
      throw new ValidationError(
        'INVALID_OPTIONS',
        'enqueueInTransaction',
        "enqueueInTransaction: 'queue' needs the queue in Postgres (backend: 'postgres'); on Redis a transactional enqueue goes through the outbox.",
      );
    }
    this.#fingerprint = options.fingerprint ?? sha256Fingerprint;
    assertKeysFitConnection(options, options.queue);
    this.#queue = openQueue(options.queue, options);
    // BullMQ prints each connection error of a queue nobody listens to, stack and all, on every
    // reconnect; one warning line per try says the same.
    const log = defaultLogger().child({ queue: options.queue, component: 'producer', ...((options.backend ?? 'redis') === 'redis' ? { redis: redisAddress(options) } : {}) });
    const errors = new WorkerErrorLog(log);
    this.#queue.on('error', (error: Error) => errors.report(error));
    this.#start = watchRedisStart(this.#queue, options, log, () => this.#queue.close());
  }

  /** The underlying BullMQ queue. */
  get queue(): AnyQueue {
    return this.#queue;
  }

  /**
   * Enqueues one job; with `tx`, within that transaction: on the Postgres backend the job itself
   * (it exists if and only if the transaction commits), else into the outbox (the
   * {@link OutboxRelay} adds it to the queue once the transaction commits).
   *
   * Throws {@link KeyReusedError} when the key's job is still waiting, delayed or running with
   * another payload or job name, a {@link ValidationError} for a key, scope or payload the
   * workers would refuse, and a `ServiceUnreachableError` when Redis did not answer within
   * {@link IdempotentProducerOptions.startupWaitMs} of the producer's creation.
   */
  async enqueue<P>(request: EnqueueRequest<P>, options: { tx?: Kysely<any> } = {}): Promise<EnqueueResult> {
    const [result] = await this.enqueueBulk([request], options);
    return result!;
  }

  /**
   * Enqueues several jobs (one BullMQ round trip, or one outbox insert with `tx`), with the
   * results in request order. Throws as {@link IdempotentProducer.enqueue} does.
   */
  async enqueueBulk<P>(requests: readonly EnqueueRequest<P>[], options: { tx?: Kysely<any> } = {}): Promise<EnqueueResult[]> {
    const jobs = requests.map((request) => this.#toJob(request));
    const queue = this.#options.queue;
    // A span per job (an outbox row or a BullMQ add), whose trace context the job's data carries.
    const viaOutbox = options.tx !== undefined && this.#inTransaction === 'outbox';
    const spans = MessageSpans.start(
      viaOutbox ? `outbox insert ${queue}` : `send ${queue}`,
      'producer',
      jobs.map((job) => ({ attributes: () => messageAttributes(queue, job.jobId, job.scope, job.key, 'send') })),
    );
    const dataOf = (job: (typeof jobs)[number], i: number) => spans?.dataFor(i, job.data) ?? job.data;
    let outcomes: Awaited<ReturnType<typeof addOrReplaceFinished>>;
    try {
      if (options.tx && viaOutbox) {
        await new OutboxStore(this.#options.schema ?? 'idempotent_jobs').insert(
          options.tx,
          jobs.map((job, i) => ({ queue, jobName: job.name, jobId: job.jobId, data: dataOf(job, i), opts: job.opts })),
        );
        spans?.end();
        return jobs.map((job) => ({ jobId: job.jobId, scope: job.scope, key: job.key, status: 'outboxed' }));
      }
      const failure = await this.#start.failure;
      if (failure) throw failure;
      const toAdd = jobs.map((job, i) => ({ name: job.name, data: dataOf(job, i), opts: { ...job.opts, jobId: job.jobId }, fingerprint: job.fingerprint }));
      outcomes = options.tx ? await this.#addInTransaction(options.tx, toAdd) : await addOrReplaceFinished(this.#queue, toAdd, this.#fingerprint, { inIdOrder: this.#options.backend === 'postgres' });
    } catch (error) {
      spans?.end(error);
      throw error;
    }
    outcomes.forEach((outcome, i) => spans?.setOutcome(i, outcome));
    spans?.end();
    return jobs.map((job, i) => {
      const outcome = outcomes[i]!;
      if (outcome === 'held-by-other') throw new KeyReusedError(job.scope, job.key);
      return { jobId: job.jobId, scope: job.scope, key: job.key, status: outcome === 'duplicate' ? 'duplicate' : 'added' };
    });
  }

  /** Closes the queue's connection. */
  close(): Promise<void> {
    this.#start.stop();
    return this.#queue.close();
  }

  /**
   * Adds the jobs on the caller's transaction, with the same read-back and replacement of a
   * finished job as outside one: all of it commits or rolls back with the caller's rows. The
   * queue's own connection runs BullMQ's migrations first (once), outside the transaction.
   */
  async #addInTransaction(tx: Kysely<any>, jobs: Parameters<typeof addOrReplaceFinished>[1]) {
    await this.#queue.waitUntilReady();
    const queue = openTransactionQueue(this.#options.queue, tx, postgresQueueSchema(this.#options));
    try {
      return await addOrReplaceFinished(queue, jobs, this.#fingerprint, { inIdOrder: true, inCallersTransaction: true });
    } finally {
      await queue.close();
    }
  }

  #toJob<P>(request: EnqueueRequest<P>) {
    refuseUnknownOptions(request, ENQUEUE_REQUEST_NAMES, 'producer.enqueue(request)');
    // A request without data carries null: the job stores it and the fingerprint covers it, so
    // the job read back (whose JSON would have dropped an undefined payload) matches the request.
    const payload = request.data === undefined ? null : request.data;
    const scope = request.scope ?? this.#options.defaultScope ?? DEFAULT_SCOPE;
    assertValidKeyPart('scope', scope);
    assertValidKeyPart('key', request.key);
    const wire = toWireJobData(scope, request.key, payload, {
      ...(request.concurrency ? { concurrency: request.concurrency } : {}),
      ...(request.retention ? { retention: request.retention } : {}),
    });
    const data = request.coalesce ? { ...wire, coalesce: true } : wire;
    return {
      name: request.name,
      scope,
      key: request.key,
      // A coalescing key's jobs are many jobs, one per arrival: BullMQ must not drop them as one.
      jobId: request.coalesce ? `ijc_${randomBytes(16).toString('hex')}` : jobIdFor(scope, request.key),
      data,
      opts: { ...this.#options.defaultJobOptions, ...request.opts },
      fingerprint: this.#fingerprint({ name: request.name, payload }),
    };
  }
}
