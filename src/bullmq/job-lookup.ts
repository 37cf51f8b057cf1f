import type { JobsOptions } from 'bullmq';
import { readStoredJob, removeFinishedJob } from './finished-job-removal.js';
import { QueuesByName } from './queues-by-name.js';
import { redisBackendOf, type AnyWorker, type QueueConnectionOptions } from './queue-connection.js';

/** A job the sweeper puts back, under the wire contract. */
export interface ReenqueueRequest {
  /** The queue the key's row names. */
  readonly queue: string;
  /** The deterministic id (`jobIdFor(scope, key)`). */
  readonly jobId: string;
  /** The job name the key's row names. */
  readonly name: string;
  /** The job's data under the wire contract, with the payload kept on the key. */
  readonly data: unknown;
  /** BullMQ options of the new job (attempts and backoff of the queue's retry policy). @defaultValue none */
  readonly opts?: Omit<JobsOptions, 'jobId'>;
}

/** Options of {@link BullmqJobLookup}. */
export type BullmqJobLookupOptions = QueueConnectionOptions;

/**
 * The sweeper's view of BullMQ (it satisfies the sweeper's `JobLookup`): asks whether a key's job still exists and re-adds lost jobs.
 * Keeps one `Queue` per queue name it has been asked about; {@link BullmqJobLookup.close}
 * closes them.
 *
 * @example
 * ```ts
 * import { jobIdFor } from 'idempotent-jobs';
 * import { BullmqJobLookup } from 'idempotent-jobs/process';
 *
 * const lookup = new BullmqJobLookup({ connection: { url: 'redis://127.0.0.1:6379' } });
 * const presence = await lookup.presence('payments', [jobIdFor('acme', 'order-42')]);
 * console.log(presence); // 'pending', 'finished' or 'missing'
 * await lookup.close();
 * ```
 */
export class BullmqJobLookup {
  readonly #queues: QueuesByName;

  constructor(options: BullmqJobLookupOptions) {
    this.#queues = new QueuesByName(options);
  }

  /**
   * The presence of the first of `jobIds` that is pending (waiting, delayed, prioritized, active,
   * waiting for children), else finished (completed or failed), else `missing`.
   */
  async presence(queue: string, jobIds: readonly string[]): Promise<'pending' | 'finished' | 'missing'> {
    const states = await Promise.all([...new Set(jobIds)].map((id) => this.#queues.get(queue).getJobState(id)));
    if (states.some((state) => state !== 'unknown' && state !== 'completed' && state !== 'failed')) return 'pending';
    if (states.some((state) => state === 'completed' || state === 'failed')) return 'finished';
    return 'missing';
  }

  /**
   * Adds the job under its deterministic id. A finished job with that id is removed first
   * (BullMQ ignores an add whose id exists in any state); a pending one is left alone and
   * `'exists'` is returned, as it will run anyway. The removal takes only the finished job
   * that was read: should a producer or relay replace it at the same moment, their new job is
   * never removed, and this add is then ignored in its favour.
   */
  async reenqueue(request: ReenqueueRequest): Promise<'added' | 'exists'> {
    const queue = this.#queues.get(request.queue);
    const stored = await readStoredJob(queue, request.jobId);
    if (stored) {
      const removal = await removeFinishedJob(queue, stored);
      if (removal === 'pending') return 'exists';
      // A finished job inside a flow: BullMQ's own removal also settles its parent's bookkeeping.
      if (removal === 'in-flow') await queue.remove(request.jobId);
    }
    await queue.add(request.name, request.data, { ...request.opts, jobId: request.jobId });
    return 'added';
  }

  /** Closes the queues' connections. */
  async close(): Promise<void> {
    await this.#queues.close();
  }
}

/**
 * A health check of a BullMQ worker's queue connection: one round trip (on Redis, HEXISTS on
 * the queue's meta hash; on Postgres, a read of one of the queue's meta fields). Throws when
 * the server does not answer or the Redis connection is not ready.
 */
export async function pingBullWorker(worker: AnyWorker): Promise<void> {
  const redis = redisBackendOf(worker);
  if (!redis) {
    await worker.getBackend().getQueueMetaField('version');
    return;
  }
  const client = await redis.client;
  if (client.status !== 'ready') throw new Error(`Redis connection is ${client.status}`);
  await client.hexists(worker.toKey('meta'), 'version');
}
