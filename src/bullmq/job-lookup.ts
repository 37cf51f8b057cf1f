import type { ConnectionOptions, JobsOptions, Worker } from 'bullmq';
import { readStoredJob, removeFinishedJob } from './finished-job-removal.js';
import { QueuesByName } from './queues-by-name.js';

/**
 * Whether BullMQ still has a job: `pending` (waiting, delayed, prioritized, active, waiting for
 * children: it will run or is running), `finished` (completed or failed: it will not run
 * again) or `missing` (removed, evicted, or never added).
 */
export type JobPresence = 'pending' | 'finished' | 'missing';

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
export interface BullmqJobLookupOptions {
  /** BullMQ connection (ioredis options or instance) of the queues to look in. */
  readonly connection: ConnectionOptions;
  /** BullMQ key prefix. @defaultValue `'bull'` */
  readonly prefix?: string;
}

/**
 * The sweeper's view of BullMQ: asks whether a key's job still exists and re-adds lost jobs.
 * Keeps one `Queue` per queue name it has been asked about; {@link BullmqJobLookup.close}
 * closes them.
 *
 * @example
 * ```ts
 * import { BullmqJobLookup, jobIdFor } from 'idempotent-jobs';
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

  /** The presence of the first of `jobIds` that is pending, else finished, else `missing`. */
  async presence(queue: string, jobIds: readonly string[]): Promise<JobPresence> {
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

  /** Closes the queues' Redis connections. */
  async close(): Promise<void> {
    await this.#queues.close();
  }
}

/**
 * A health check of a BullMQ worker's Redis connection: one round trip (HEXISTS on the queue's
 * meta hash). Throws when Redis does not answer or the connection is not ready.
 */
export async function pingBullWorker(worker: Worker): Promise<void> {
  const client = await worker.getBackend().client;
  if (client.status !== 'ready') throw new Error(`Redis connection is ${client.status}`);
  await client.hexists(worker.toKey('meta'), 'version');
}
