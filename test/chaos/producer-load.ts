/**
 * The producer side of a chaos run: N enqueue requests paced over the run, D% of them
 * duplicates of a key — repeated `enqueue` calls (same job id), foreign raw BullMQ adds under
 * other job ids (the wire contract, as a producer in another language would send), and bursts
 * of concurrent adds of a fresh key. A request is retried until Redis acknowledges it; only
 * acknowledged keys are held to "never lost".
 *
 * Every job has BullMQ's default `attempts: 1`, which is what a foreign producer gets: a fault
 * (a dead worker, a cut connection, a Postgres restart) must delay a job, never use up its only
 * attempt. The chaos handler never fails on its own, so a failed job is a fault's doing —
 * except, with `jobFaults`, the jobs of the keys marked with a failing fault (`job-faults.ts`),
 * which must fail.
 */
import { Queue, createPostgresBackend, type JobsOptions } from 'bullmq';
import { IdempotentProducer, toWireJobData, type ConcurrencyLimit } from '../../src/index.js';
import { openRedisConnection, type RedisConnectionSettings } from '../../src/process/index.js';
import type { ChaosPayload } from './chaos-handler.js';
import { jobFaultFor, jobNameFor } from './job-faults.js';
import { abortableSleep } from './nemesis.js';
import { seededRandom } from './random.js';

/** A key as the producer knows it. */
export interface ProducedKey {
  readonly scope: string;
  readonly key: string;
  readonly payload: ChaosPayload;
  /** Adds of this key that Redis acknowledged. */
  acks: number;
  /** When each of those adds was acknowledged (ms since epoch), in order. */
  readonly ackedAt: number[];
}

/** How each request was sent. */
export type RequestMode = 'new' | 'repeat' | 'foreign' | 'concurrent';

/** What the producer did. */
export interface LoadResult {
  /** Every key the producer tried to enqueue, by `scope/key`. */
  readonly keys: Map<string, ProducedKey>;
  readonly requests: Record<RequestMode, number>;
  readonly acknowledged: number;
  /** Failed attempts that were retried (Redis down, connection cut). */
  readonly retries: number;
  /** Requests given up unacknowledged at the deadline. */
  readonly unacknowledged: number;
}

/** Options of {@link runProducerLoad}. */
export interface LoadOptions {
  readonly seed: number;
  readonly jobs: number;
  readonly duplicateRatio: number;
  /** Requests are spread evenly over this long. */
  readonly spreadMs: number;
  readonly maxWorkMs: number;
  /**
   * Mark a seeded share of keys with a job fault (`jobFaultFor(seed, n)`), carried in every
   * add's payload and job name (`--job-faults`).
   */
  readonly jobFaults?: boolean;
  /**
   * Keep completed jobs (BullMQ's default) instead of removing them: the reconciler compares
   * them with the keys (`--reconcile`). @defaultValue false
   */
  readonly keepCompleted?: boolean;
  readonly queue: string;
  readonly prefix: string;
  /** The run's Redis: a single server or a cluster (unused when `postgresQueue` is set). */
  readonly redis?: RedisConnectionSettings;
  /** The queue in Postgres (BullMQ's PostgreSQL backend): its database and schema. Completed jobs are kept there. */
  readonly postgresQueue?: { readonly url: string; readonly schema: string };
  /**
   * The concurrency keys and limits of key number `n`, carried by every add of it (`--concurrency-limits`).
   * @defaultValue none
   */
  readonly concurrencyFor?: (n: number) => ConcurrencyLimit | readonly ConcurrencyLimit[];
  /** The simulated work of key number `n` where it is not random (the concurrency profile's long runs). @defaultValue none: random up to `maxWorkMs` */
  readonly workMsFor?: (n: number) => number | undefined;
  /** The map the keys are recorded in, to read while the load runs (`--tombstones`). @defaultValue a new map */
  readonly keys?: Map<string, ProducedKey>;
  /** Stops sending new requests. */
  readonly stop: AbortSignal;
  /** Stops retrying unacknowledged ones. */
  readonly giveUp: AbortSignal;
}

const MAX_IN_FLIGHT = 32;

/**
 * Options of the jobs the library's producer adds: BullMQ's defaults (one attempt, failed jobs
 * kept, so the checker finds them), except that completed jobs are removed, which bounds
 * Redis's memory on a long run. The foreign adds use BullMQ's defaults as they are.
 */
export const CHAOS_JOB_OPTIONS: Omit<JobsOptions, 'jobId'> = {
  removeOnComplete: true,
};

/** Runs the producer; resolves when every request was acknowledged or given up. */
export async function runProducerLoad(options: LoadOptions): Promise<LoadResult> {
  const random = seededRandom(options.seed, 3);
  const pg = options.postgresQueue;
  const redis = pg ? undefined : openRedisConnection(options.redis!);
  const producer = pg
    ? new IdempotentProducer({ queue: options.queue, backend: 'postgres', connection: pg.url, prefix: pg.schema, defaultJobOptions: { ...CHAOS_JOB_OPTIONS, removeOnComplete: false } })
    : new IdempotentProducer({ queue: options.queue, connection: redis!.connection, prefix: options.prefix, defaultJobOptions: options.keepCompleted ? {} : CHAOS_JOB_OPTIONS });
  const foreign = pg
    ? (new Queue(options.queue, { connection: { connectionString: pg.url, schema: pg.schema } }, createPostgresBackend) as unknown as Queue)
    : new Queue(options.queue, { connection: redis!.connection, prefix: options.prefix });
  producer.queue.on('error', () => {});
  foreign.on('error', () => {});

  const keys = options.keys ?? new Map<string, ProducedKey>();
  const order: ProducedKey[] = [];
  const requests: Record<RequestMode, number> = { new: 0, repeat: 0, foreign: 0, concurrent: 0 };
  let acknowledged = 0;
  let retries = 0;
  let unacknowledged = 0;
  const inFlight = new Set<Promise<void>>();

  const send = (mode: RequestMode, produced: ProducedKey, foreignJobId?: string) => {
    requests[mode]++;
    const name = jobNameFor(produced.payload.fault);
    const concurrency = options.concurrencyFor?.(produced.payload.n);
    const add = foreignJobId
      ? () => foreign.add(name, toWireJobData(produced.scope, produced.key, produced.payload, { concurrency }), { jobId: foreignJobId })
      : () => producer.enqueue({ name, scope: produced.scope, key: produced.key, data: produced.payload, ...(concurrency ? { concurrency } : {}) });
    const task = (async () => {
      for (;;) {
        try {
          await add();
          produced.acks++;
          produced.ackedAt.push(Date.now());
          acknowledged++;
          return;
        } catch {
          if (options.giveUp.aborted) {
            unacknowledged++;
            return;
          }
          retries++;
          await abortableSleep(100, options.giveUp);
        }
      }
    })();
    inFlight.add(task);
    void task.finally(() => inFlight.delete(task));
  };

  const newKey = (): ProducedKey => {
    const n = order.length;
    const fault = options.jobFaults ? jobFaultFor(options.seed, n) : undefined;
    // Drawn whatever the key's work: the seeded sequence stays the one of a run without long runs.
    const drawnWorkMs = random.int(0, options.maxWorkMs);
    const produced: ProducedKey = {
      scope: n % 2 === 0 ? 'acme' : 'globex',
      key: `order-${n}`,
      payload: { n, workMs: options.workMsFor?.(n) ?? drawnWorkMs, ...(fault ? { fault } : {}) },
      acks: 0,
      ackedAt: [],
    };
    keys.set(`${produced.scope}/${produced.key}`, produced);
    order.push(produced);
    return produced;
  };
  // Half the duplicates hit a recent key (likely still in flight), half any earlier key.
  const earlierKey = () => (random.next() < 0.5 ? order[random.int(Math.max(0, order.length - 100), order.length - 1)]! : random.pick(order));

  const startedAt = Date.now();
  const gapMs = options.spreadMs / options.jobs;
  let sent = 0;
  try {
    while (sent < options.jobs && !options.stop.aborted) {
      const wait = startedAt + sent * gapMs - Date.now();
      if (wait > 0) await abortableSleep(wait, options.stop);
      while (inFlight.size >= MAX_IN_FLIGHT) await Promise.race(inFlight);
      if (order.length === 0 || random.next() >= options.duplicateRatio) {
        send('new', newKey());
        sent++;
        continue;
      }
      const mode = random.pick(['repeat', 'foreign', 'concurrent'] as const);
      if (mode === 'repeat') send('repeat', earlierKey());
      else if (mode === 'foreign') send('foreign', earlierKey(), `foreign-${sent}`);
      else {
        // A fresh key, added three times at once: twice through the producer, once raw.
        const produced = newKey();
        send('new', produced);
        send('concurrent', produced);
        send('concurrent', produced, `foreign-${sent}`);
        sent += 2;
      }
      sent++;
    }
    await Promise.all(inFlight);
  } finally {
    await producer.close().catch(() => {});
    await foreign.close().catch(() => {});
    await redis?.close();
  }
  return { keys, requests, acknowledged, retries, unacknowledged };
}

/** Options of {@link resendKeys}. */
export interface ResendOptions {
  readonly queue: string;
  readonly prefix: string;
  /** The run's Redis (the re-sending is a Redis remedy: never with the queue in Postgres). */
  readonly redis: RedisConnectionSettings;
  /** As in {@link LoadOptions.keepCompleted}. @defaultValue false */
  readonly keepCompleted?: boolean;
  /** Stops retrying the adds not acknowledged yet. */
  readonly giveUp: AbortSignal;
}

/** What {@link resendKeys} did. */
export interface ResendResult {
  /** Keys sent again and acknowledged. */
  readonly acknowledged: number;
  /** Failed attempts that were retried. */
  readonly retries: number;
  /** Keys given up unacknowledged. */
  readonly unacknowledged: number;
}

/**
 * Sends each key again once, through the library's producer with the same scope, key, name and
 * payload as its first request (a foreign add's key included: the same key is what makes a
 * re-send safe), retrying each until Redis acknowledges it, at most {@link MAX_IN_FLIGHT} at once.
 */
export async function resendKeys(keys: readonly ProducedKey[], options: ResendOptions): Promise<ResendResult> {
  const redis = openRedisConnection(options.redis);
  const producer = new IdempotentProducer({ queue: options.queue, connection: redis.connection, prefix: options.prefix, defaultJobOptions: options.keepCompleted ? {} : CHAOS_JOB_OPTIONS });
  producer.queue.on('error', () => {});
  let acknowledged = 0;
  let retries = 0;
  let unacknowledged = 0;
  const resendOne = async (produced: ProducedKey) => {
    for (;;) {
      try {
        await producer.enqueue({ name: jobNameFor(produced.payload.fault), scope: produced.scope, key: produced.key, data: produced.payload });
        acknowledged++;
        return;
      } catch {
        if (options.giveUp.aborted) {
          unacknowledged++;
          return;
        }
        retries++;
        await abortableSleep(100, options.giveUp);
      }
    }
  };
  try {
    let next = 0;
    const lane = async () => {
      while (next < keys.length) await resendOne(keys[next++]!);
    };
    await Promise.all(Array.from({ length: Math.min(MAX_IN_FLIGHT, keys.length) }, lane));
  } finally {
    await producer.close().catch(() => {});
    await redis.close();
  }
  return { acknowledged, retries, unacknowledged };
}
