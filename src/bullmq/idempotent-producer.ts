import { Queue, type ConnectionOptions, type JobsOptions } from 'bullmq';
import type { Kysely } from 'kysely';
import { KeyReusedError } from '../errors.js';
import { sha256Fingerprint, type Fingerprinter } from '../fingerprint.js';
import { DEFAULT_SCOPE, assertValidKeyPart } from '../protocol/validate.js';
import { insertOutboxRows } from '../store/sql/outbox.js';
import { MessageSpans } from '../telemetry/message-spans.js';
import { messageAttributes } from '../telemetry/trace-attributes.js';
import { addOrReplaceFinished } from './add-or-replace-finished.js';
import { jobIdFor, toWireJobData } from './job-identity.js';
import { assertKeysFitConnection } from './redis-connection.js';

/** Options of {@link IdempotentProducer}. */
export interface IdempotentProducerOptions {
  /** BullMQ queue name. */
  readonly queue: string;
  /** BullMQ connection (ioredis options or instance). */
  readonly connection: ConnectionOptions;
  /** BullMQ key prefix. @defaultValue `'bull'` */
  readonly prefix?: string;
  /** Scope for requests that name none. @defaultValue `'default'` */
  readonly defaultScope?: string;
  /** Schema of the outbox table, for transactional enqueues. @defaultValue `'idempotent_jobs'` */
  readonly schema?: string;
  /** Must match the workers' fingerprinter. @defaultValue SHA-256 of canonical JSON */
  readonly fingerprint?: Fingerprinter;
  /** Options for every job (attempts, backoff, removeOnComplete…); a request's `opts` override them. @defaultValue none (BullMQ's defaults) */
  readonly defaultJobOptions?: Omit<JobsOptions, 'jobId'>;
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
   */
  readonly status: 'added' | 'duplicate' | 'outboxed';
}

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
  readonly #queue: Queue;
  readonly #fingerprint: Fingerprinter;

  constructor(options: IdempotentProducerOptions) {
    this.#options = Object.freeze({ ...options });
    this.#fingerprint = options.fingerprint ?? sha256Fingerprint;
    assertKeysFitConnection(options.connection, options.prefix, options.queue);
    this.#queue = new Queue(options.queue, { connection: options.connection, prefix: options.prefix });
  }

  /** The underlying BullMQ queue. */
  get queue(): Queue {
    return this.#queue;
  }

  /**
   * Enqueues one job; with `tx`, into the outbox within that transaction (the
   * {@link OutboxRelay} adds it to the queue once the transaction commits).
   *
   * Throws {@link KeyReusedError} when the key's job is still waiting, delayed or running with
   * another payload or job name, and a {@link ValidationError} for a key, scope or payload the
   * workers would refuse.
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
    const spans = MessageSpans.start(
      options.tx ? `outbox insert ${queue}` : `send ${queue}`,
      'producer',
      jobs.map((job) => ({ attributes: () => messageAttributes(queue, job.jobId, job.scope, job.key, 'send') })),
    );
    const dataOf = (job: (typeof jobs)[number], i: number) => spans?.dataFor(i, job.data) ?? job.data;
    let outcomes: Awaited<ReturnType<typeof addOrReplaceFinished>>;
    try {
      if (options.tx) {
        await insertOutboxRows(
          options.tx,
          this.#options.schema ?? 'idempotent_jobs',
          jobs.map((job, i) => ({ queue, jobName: job.name, jobId: job.jobId, data: dataOf(job, i), opts: job.opts })),
        );
        spans?.end();
        return jobs.map((job) => ({ jobId: job.jobId, scope: job.scope, key: job.key, status: 'outboxed' }));
      }
      outcomes = await addOrReplaceFinished(
        this.#queue,
        jobs.map((job, i) => ({ name: job.name, data: dataOf(job, i), opts: { ...job.opts, jobId: job.jobId }, fingerprint: job.fingerprint })),
        this.#fingerprint,
      );
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

  /** Closes the queue's Redis connection. */
  close(): Promise<void> {
    return this.#queue.close();
  }

  #toJob<P>(request: EnqueueRequest<P>) {
    const scope = request.scope ?? this.#options.defaultScope ?? DEFAULT_SCOPE;
    assertValidKeyPart('scope', scope);
    assertValidKeyPart('key', request.key);
    const data = toWireJobData(scope, request.key, request.data);
    return {
      name: request.name,
      scope,
      key: request.key,
      jobId: jobIdFor(scope, request.key),
      data,
      opts: { ...this.#options.defaultJobOptions, ...request.opts },
      fingerprint: this.#fingerprint({ name: request.name, payload: request.data }),
    };
  }
}
