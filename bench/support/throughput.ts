/**
 * In-process throughput runs: a paused queue is filled with N jobs, a worker is started, the
 * queue is resumed and the clock runs until the last job completes. Round trips to Postgres
 * are counted over exactly that window.
 */
import { randomBytes } from 'node:crypto';
import { Queue, Worker, type Job } from 'bullmq';
import type { Kysely } from 'kysely';
import { pino } from 'pino';
import { IdempotencyKeys, createIdempotentWorker, createPostgresDb, identityFromWireContract, toWireJobData, type ClaimOutcome } from '../../src/index.js';
import { PostgresKeyStore } from '../../src/store/index.js';
import { benchHandler, insertEffect, threeStepsHandler, threeWritesHandler, type BenchPayload } from './bench-handler.js';
import type { BenchEnv, RoundTripCounter } from './bench-env.js';
import { cpuSince, cpuSnapshot, type CpuSnapshot, type CpuSpent } from './cpu-usage.js';
import { percentile } from './stats.js';
import { TimedKeyStore } from './timed-key-store.js';

/** Who processes the jobs. */
export type Contender =
  | 'bullmq-noop'
  | 'bullmq-tx'
  | 'leased'
  | 'fast-path'
  | 'leased-group'
  | 'fast-path-group'
  | 'leased-async-claim'
  | 'leased-unbatched'
  | 'fast-path-no-probe'
  | 'leased-two-trip-commit'
  | 'fast-path-two-trip-commit'
  | 'leased-3-writes'
  | 'leased-3-steps';

/** One measured drain. */
export interface ThroughputRun {
  readonly contender: Contender;
  readonly n: number;
  readonly concurrency: number;
  readonly duplicateRatio: number;
  readonly elapsedMs: number;
  readonly jobsPerSec: number;
  /** Postgres round trips in the window (counted by wrapping `pg.Client#query`). */
  readonly roundTrips: number;
  readonly roundTripsPerJob: number;
  /**
   * Rows the effect wrote: N for at-least-once, the number of distinct keys for exactly-once
   * (three times that for the multi-step contenders: two writes and the completion's).
   */
  readonly effects: number;
  readonly distinctKeys: number;
  readonly failedJobs: number;
  /** CPU time of this Node process (worker, BullMQ, drivers) per job over the window, in ms. */
  readonly nodeCpuMsPerJob: number;
  /** Per job over the window, in ms: the whole machine's busy CPU, the Postgres and the Redis server processes' (Linux only). */
  readonly machineCpuMsPerJob?: number;
  readonly postgresCpuMsPerJob?: number;
  readonly redisCpuMsPerJob?: number;
  /** Claim statement latency in ms by outcome (idempotent contenders only). */
  readonly claimLatency?: Record<string, { count: number; p50: number; p99: number }>;
}

/** Parameters of one drain. */
export interface ThroughputSpec {
  readonly contender: Contender;
  readonly n: number;
  readonly concurrency: number;
  /** Share of jobs whose key repeats an earlier job's key (0, 0.5, 0.9). */
  readonly duplicateRatio: number;
}

const SCOPE = 'bench';

/** Redis connection options from a redis:// URL. */
export function redisConnection(redisUrl: string) {
  const url = new URL(redisUrl);
  return { host: url.hostname, port: Number(url.port || 6379), maxRetriesPerRequest: null };
}

/**
 * Fills a paused queue with `n` jobs. Job i carries key `k<i mod distinct>`: the duplicates of
 * a key come `distinct` jobs after it (thousands of jobs later, long after it completed), each
 * with its own job id, as a redelivery or a re-enqueue by a producer without the job-id
 * convention would. Duplicates carry the same payload, so they replay rather than being refused.
 */
export async function fillQueue(queue: Queue, n: number, duplicateRatio: number, extra: Partial<BenchPayload> = {}, wireExtra: Record<string, unknown> = {}): Promise<number> {
  const distinct = Math.max(1, Math.round(n * (1 - duplicateRatio)));
  await queue.pause();
  const chunk = 1000;
  for (let start = 0; start < n; start += chunk) {
    const jobs = [];
    for (let i = start; i < Math.min(n, start + chunk); i++) {
      const k = i % distinct;
      jobs.push({ name: 'charge', data: { ...toWireJobData(SCOPE, `k${k}`, { n: k, ...extra }), ...wireExtra }, opts: { jobId: `j${i}` } });
    }
    await queue.addBulk(jobs);
  }
  return distinct;
}

/** Runs one drain and cleans up after it (queue keys, tables, pools). */
export async function runThroughput(env: BenchEnv, counter: RoundTripCounter, spec: ThroughputSpec): Promise<ThroughputRun> {
  const { contender, n, concurrency, duplicateRatio } = spec;
  const queueName = `tp-${contender}-${randomBytes(3).toString('hex')}`;
  const connection = redisConnection(env.redisUrl);
  const queue = new Queue(queueName, { connection, prefix: env.redisPrefix });
  const distinctKeys = await fillQueue(queue, n, duplicateRatio);

  let db: Kysely<any> | undefined;
  let timed: TimedKeyStore | undefined;
  let bull: Worker<any, any, string, any>;
  let close: () => Promise<void>;
  if (contender === 'bullmq-noop' || contender === 'bullmq-tx') {
    const pool = contender === 'bullmq-tx' ? createPostgresDb({ connectionString: env.databaseUrl, maxConnections: concurrency + 2 }) : undefined;
    db = pool;
    const processor =
      pool === undefined
        ? async () => null
        : async (job: Job) => {
            const { scope, key } = identityFromWireContract(job);
            await pool.transaction().execute((tx) => insertEffect(tx, env.schema, scope, key, 'baseline'));
            return null;
          };
    bull = new Worker(queueName, processor, { connection, prefix: env.redisPrefix, concurrency });
    close = () => bull.close();
  } else {
    db = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: concurrency + 2 });
    // The *-two-trip-commit contenders are the ablation: completion (or result) and COMMIT as two round trips.
    // leased-unbatched: every claim its own statement and commit (no claim batching).
    const store = new PostgresKeyStore(db, env.schema, {
      batchClaims: contender !== 'leased-unbatched',
      probeSettledKeys: contender !== 'fast-path-no-probe',
    });
    timed = new TimedKeyStore(store, { oneTripCommit: !contender.endsWith('two-trip-commit') });
    const keys = new IdempotencyKeys(
      {
        db,
        schema: env.schema,
        leaseMs: 30_000,
        claimSynchronousCommit: contender !== 'leased-async-claim',
        // Group commit with the library's defaults (16 jobs a group, 2 groups open); BENCH_GROUPS and
        // BENCH_GROUP_JOBS set maxGroups and maxJobs instead, for profiling.
        groupCommit: contender.endsWith('-group') && groupCommitFromEnvironment(),
      },
      timed,
    );
    const pool = db;
    // leased-3-writes and leased-3-steps: the multi-step comparison (three effects, then the completion).
    const handler =
      contender === 'leased-3-steps'
        ? threeStepsHandler(env.schema, 'in-process')
        : contender === 'leased-3-writes'
          ? threeWritesHandler(env.schema, 'in-process', pool)
          : benchHandler(env.schema, 'in-process');
    const worker = createIdempotentWorker<BenchPayload>({
      queue: queueName,
      connection,
      prefix: env.redisPrefix,
      keys,
      concurrency,
      fastPath: contender.startsWith('fast-path'),
      handler,
      // Per-job info lines would measure pino, not the protocol; the baselines log nothing either.
      logger: pino({ level: 'warn' }),
    });
    bull = worker.bullWorker;
    close = () => worker.close();
  }

  let completed = 0;
  let failed = 0;
  let elapsedMs = 0;
  let roundTrips = 0;
  let cpuMicros = 0;
  const startCpu = { value: process.cpuUsage() };
  const startServers: { value: CpuSnapshot | undefined } = { value: undefined };
  let servers: CpuSpent | undefined;
  const startRoundTrips = { value: 0 };
  const startedAt = { value: 0 };
  const done = new Promise<void>((resolve) => {
    const settle = () => {
      if (completed + failed === n) {
        elapsedMs = performance.now() - startedAt.value;
        roundTrips = counter.count - startRoundTrips.value;
        const cpu = process.cpuUsage(startCpu.value);
        cpuMicros = cpu.user + cpu.system;
        servers = cpuSince(startServers.value);
        resolve();
      }
    };
    bull.on('completed', () => {
      completed++;
      settle();
    });
    bull.on('failed', (_job, error) => {
      // A deferral (DelayedError) is not a failure; the job comes back.
      if (error?.name === 'DelayedError') return;
      failed++;
      settle();
    });
  });
  await bull.waitUntilReady();
  timed?.reset();
  startRoundTrips.value = counter.count;
  startCpu.value = process.cpuUsage();
  startServers.value = cpuSnapshot();
  startedAt.value = performance.now();
  await queue.resume();
  await withTimeout(done, 15 * 60_000, `${contender}: ${completed}/${n} jobs completed`);

  await close();
  const effects = Number((await env.db.selectFrom(`${env.schema}.bench_effects`).select((eb) => eb.fn.countAll().as('c')).executeTakeFirst())?.c ?? 0);
  await db?.destroy();
  await queue.close();
  await env.deleteQueueKeys(queueName);
  await env.resetTables();

  return {
    contender,
    n,
    concurrency,
    duplicateRatio,
    elapsedMs,
    jobsPerSec: (n / elapsedMs) * 1000,
    roundTrips,
    roundTripsPerJob: roundTrips / n,
    effects,
    distinctKeys: contender === 'bullmq-noop' ? 0 : distinctKeys,
    failedJobs: failed,
    nodeCpuMsPerJob: cpuMicros / 1000 / n,
    machineCpuMsPerJob: servers && servers.machineMs / n,
    postgresCpuMsPerJob: servers && servers.postgresMs / n,
    redisCpuMsPerJob: servers && servers.redisMs / n,
    claimLatency: timed ? summarizeLatencies(timed.latencies) : undefined,
  };
}

function summarizeLatencies(latencies: Map<ClaimOutcome['kind'], number[]>) {
  const out: Record<string, { count: number; p50: number; p99: number }> = {};
  for (const [kind, values] of latencies) {
    const sorted = [...values].sort((a, b) => a - b);
    out[kind] = { count: sorted.length, p50: percentile(sorted, 50), p99: percentile(sorted, 99) };
  }
  return out;
}

/** Rejects with `what` if `promise` takes longer than `ms`. */
export async function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** The bench's group commit options: the library's defaults, or BENCH_GROUPS / BENCH_GROUP_JOBS. */
function groupCommitFromEnvironment(): true | { maxGroups?: number; maxJobs?: number } {
  const { BENCH_GROUPS: groups, BENCH_GROUP_JOBS: jobs } = process.env;
  if (!groups && !jobs) return true;
  return { ...(groups ? { maxGroups: Number(groups) } : {}), ...(jobs ? { maxJobs: Number(jobs) } : {}) };
}
