import { Queue, type ConnectionOptions, type Job } from 'bullmq';
import type { Kysely } from 'kysely';
import { PostgresOperatorStore, presentKeyId } from '../store/operator-store.js';
import { readStoredJob, removeFinishedJob } from './finished-job-removal.js';

/** Options of {@link VanishedKeyReconciler}. */
export interface VanishedKeyReconcilerOptions {
  /** The BullMQ queue whose completed jobs are compared with the keys. */
  readonly queue: string;
  /** BullMQ's Redis connection (`openRedisConnection(…).connection`). */
  readonly connection: ConnectionOptions;
  /** BullMQ key prefix. @defaultValue `'bull'` */
  readonly prefix?: string;
  /** The pool on the keys' Postgres. */
  readonly db: Kysely<any>;
  /** Schema of the keys table. @defaultValue `'idempotent_jobs'` */
  readonly schema?: string;
  /**
   * Only jobs BullMQ completed this recently are compared: cover the failover, and stay well
   * inside the keys' retention (`RETENTION_MS`), past which the janitor deletes keys on purpose.
   * @defaultValue `3_600_000` (one hour)
   */
  readonly windowMs?: number;
  /** Completed jobs read from Redis per round trip. @defaultValue `500` */
  readonly pageSize?: number;
}

/** A completed job whose key a failover lost, as {@link VanishedKeyReconciler.run} found it. */
export interface VanishedKey {
  /** The key's scope. */
  readonly scope: string;
  /** The idempotency key. */
  readonly key: string;
  /** The BullMQ job that BullMQ holds as completed. */
  readonly jobId: string;
  /** `'missing'`: no row at all (the claim was lost too); `'unfinished'`: `processing` past its lease (the completion was lost). */
  readonly found: 'missing' | 'unfinished';
}

/** What one {@link VanishedKeyReconciler.run} found and did. */
export interface ReconcileReport {
  /** Completed jobs inside the window that carry an idempotency key. */
  readonly checked: number;
  /**
   * Of those, the jobs whose key has no row at all (`'missing'`: the claim was lost too), or is
   * still `processing` past its lease (`'unfinished'`: the completion was lost, the claim not).
   */
  readonly vanished: readonly VanishedKey[];
  /** Vanished keys whose job was removed from the completed set and added again (it will run). */
  readonly reenqueued: number;
  /** Vanished keys left alone because their job changed meanwhile (re-added by someone else, or pending). */
  readonly skipped: number;
}

/**
 * Closes the hole that asynchronous replication leaves in a Postgres failover: a commit the old
 * primary acknowledged but had not shipped is missing on the promoted standby, so a job's key
 * *and* its effect vanish together while BullMQ already holds the job as completed. No sweeper
 * can see that (there is no key left to find). This compares BullMQ's retained completed jobs
 * (newest first, back to `windowMs`) with the keys table; each completed job whose key has no
 * row at all — or whose key is still `processing` past its lease: the failover kept the claim
 * but lost the completion and the effect — is removed from the completed set (only if it is
 * still that very job) and added again under the same id, data and options: it runs again,
 * claims the key (or takes the expired claim over) and commits its effect, which the failover
 * had lost. A job whose key is completed, failed or held under a live lease is left alone.
 *
 * Run it after a failover of an asynchronously replicated keys database, with a window that
 * covers the failover; it needs completed jobs kept at least that long (BullMQ's
 * `removeOnComplete`). A key deleted on purpose inside the window (`keys purge`) would make its
 * job run again: keep the window short of such deletions, and inside the keys' retention. A job
 * that asked for a retention of its own (`retention.resultMs`) that may have ended since it
 * finished (a minute allowed for clocks apart) is not checked, nor is a coalescing job (its runs
 * are keys of their own, `<key>#<generation>`): neither could be told from a loss.
 *
 * @example
 * ```ts
 * import { VanishedKeyReconciler, openRedisConnection } from 'idempotent-jobs/process';
 * import { createPostgresDb } from 'idempotent-jobs';
 *
 * const db = createPostgresDb({ connectionString: 'postgres://127.0.0.1/app' });
 * const redis = openRedisConnection({ url: 'redis://127.0.0.1:6379' });
 * const reconciler = new VanishedKeyReconciler({ queue: 'payments', connection: redis.connection, db, windowMs: 15 * 60_000 });
 * const report = await reconciler.run();
 * console.log(`${report.vanished.length} of ${report.checked} completed jobs had lost their key; ${report.reenqueued} sent again`);
 * await reconciler.close();
 * await db.destroy();
 * ```
 */
export class VanishedKeyReconciler {
  readonly #options: Readonly<VanishedKeyReconcilerOptions>;
  readonly #queue: Queue;
  readonly #store: PostgresOperatorStore;

  constructor(options: VanishedKeyReconcilerOptions) {
    this.#options = Object.freeze({ ...options });
    this.#queue = new Queue(options.queue, { connection: options.connection, ...(options.prefix !== undefined ? { prefix: options.prefix } : {}) });
    this.#queue.on('error', () => {});
    this.#store = new PostgresOperatorStore(options.db, options.schema ?? 'idempotent_jobs');
  }

  /** One pass over the window: compares, re-enqueues what vanished, and reports. */
  async run(): Promise<ReconcileReport> {
    const since = Date.now() - (this.#options.windowMs ?? 3_600_000);
    const pageSize = this.#options.pageSize ?? 500;
    let checked = 0;
    let reenqueued = 0;
    let skipped = 0;
    const vanished: VanishedKey[] = [];
    // Read the whole window first: re-enqueueing removes jobs from the completed set, which
    // would shift the offsets of the pages still to read.
    const pages: Array<Array<{ scope: string; key: string; job: Job }>> = [];
    for (let start = 0; ; start += pageSize) {
      // Newest first (the completed set is ordered by finishing time): stop past the window.
      const page = (await this.#queue.getJobs(['completed'], start, start + pageSize - 1, false)).filter(Boolean);
      const inWindow = page.filter((job) => (job.finishedOn ?? 0) >= since);
      pages.push(
        inWindow.flatMap((job) => {
          const identity = keyOf(job);
          return identity && !ownRetentionMayHaveEnded(job) ? [{ ...identity, job }] : [];
        }),
      );
      if (page.length < pageSize || inWindow.length < page.length) break;
    }
    for (const keyed of pages) {
      checked += keyed.length;
      const present = await this.#store.presentKeys(keyed);
      for (const { scope, key, job } of keyed) {
        const row = present.get(presentKeyId(scope, key));
        if (row && !row.leaseExpired) continue;
        vanished.push({ scope, key, jobId: String(job.id), found: row ? 'unfinished' : 'missing' });
        if (await this.#reenqueue(job)) reenqueued++;
        else skipped++;
      }
    }
    return { checked, vanished, reenqueued, skipped };
  }

  /** Closes the queue's Redis connections (not `connection` itself when it is a client you passed). */
  async close(): Promise<void> {
    await this.#queue.close();
  }

  /** Removes `job` if it is still that completed job, then adds it again under its id. */
  async #reenqueue(job: Job): Promise<boolean> {
    const stored = await readStoredJob(this.#queue, String(job.id));
    if (!stored || stored.timestamp !== String(job.timestamp)) return false;
    if ((await removeFinishedJob(this.#queue, stored)) !== 'removed') return false;
    const { attempts, backoff, priority, removeOnComplete, removeOnFail } = job.opts;
    await this.#queue.add(job.name, job.data, {
      jobId: String(job.id),
      ...(attempts !== undefined ? { attempts } : {}),
      ...(backoff !== undefined ? { backoff } : {}),
      ...(priority !== undefined ? { priority } : {}),
      ...(removeOnComplete !== undefined ? { removeOnComplete } : {}),
      ...(removeOnFail !== undefined ? { removeOnFail } : {}),
    });
    return true;
  }
}

/**
 * The scope and key of a job that follows the wire contract, else undefined: a job of another
 * kind on the queue, or a coalescing job, whose runs are keys of their own (`<key>#<generation>`,
 * which its data does not name): its key would always look missing, and sent again it would run
 * its payload as a new generation, after newer ones.
 */
function keyOf(job: Job): { scope: string; key: string } | undefined {
  const data = job.data as { idempotencyKey?: unknown; scope?: unknown; coalesce?: unknown } | null;
  if (!data || typeof data.idempotencyKey !== 'string' || data.coalesce === true) return undefined;
  return { scope: typeof data.scope === 'string' ? data.scope : 'default', key: data.idempotencyKey };
}

/** How far the workers' clocks (which stamp `finishedOn`) may be from the database's, which ends a key's retention. */
const CLOCKS_APART_MS = 60_000;

/**
 * Whether the job asked for a retention of its own (`retention.resultMs`) that may have ended
 * since it finished: its key was then deleted by the janitor, by design, and sent again the job
 * would run a second time. Such a job is not checked (nothing can tell that deletion from a loss).
 */
function ownRetentionMayHaveEnded(job: Job): boolean {
  const resultMs = (job.data as { retention?: { resultMs?: unknown } } | null)?.retention?.resultMs;
  if (typeof resultMs !== 'number') return false;
  return (job.finishedOn ?? 0) + resultMs - CLOCKS_APART_MS <= Date.now();
}
