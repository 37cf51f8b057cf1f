/**
 * Runs that need real worker processes: throughput with 1, 2 and 4 processes, RSS under load,
 * and recovery after SIGKILL. Workers are `bench/support/bench-worker.ts` children.
 */
import { randomBytes } from 'node:crypto';
import { Queue } from 'bullmq';
import { IdempotencyKeys, toWireJobData } from '../../src/index.js';
import type { BenchEnv } from './bench-env.js';
import { sleep, type BenchPayload } from './bench-handler.js';
import { rssMb, startChild, type BenchChild } from './child-process.js';
import { fillQueue, redisConnection, withTimeout } from './throughput.js';

function workerEnv(env: BenchEnv, queue: string, extra: Record<string, string>): Record<string, string> {
  return {
    DATABASE_URL: env.databaseUrl,
    REDIS_URL: env.redisUrl,
    SCHEMA: env.schema,
    REDIS_PREFIX: env.redisPrefix,
    QUEUE: queue,
    MIGRATE: 'false',
    LOG_LEVEL: 'warn',
    SHUTDOWN_TIMEOUT_MS: '1000',
    ...extra,
  };
}

async function startWorkers(env: BenchEnv, queue: string, count: number, extra: Record<string, string>): Promise<BenchChild[]> {
  const children = Array.from({ length: count }, () => startChild('support/bench-worker.ts', workerEnv(env, queue, extra)));
  try {
    await Promise.all(children.map((child) => child.waitForLine((line) => line.msg === 'bench worker ready')));
  } catch (error) {
    await Promise.all(children.map((child) => child.stop()));
    throw error;
  }
  return children;
}

async function completedCount(queue: Queue): Promise<number> {
  const counts = await queue.getJobCounts('completed', 'failed');
  return (counts.completed ?? 0) + (counts.failed ?? 0);
}

/** One multi-process drain. */
export interface ProcessesRun {
  readonly processes: number;
  readonly concurrencyPerProcess: number;
  readonly n: number;
  readonly elapsedMs: number;
  readonly jobsPerSec: number;
}

/** `processes` leased-path workers drain N prefilled jobs. Completion is polled every 50 ms. */
export async function runProcesses(env: BenchEnv, spec: { processes: number; n: number; concurrency: number }): Promise<ProcessesRun> {
  const queueName = `mp-${spec.processes}-${randomBytes(3).toString('hex')}`;
  const queue = new Queue(queueName, { connection: redisConnection(env.redisUrl), prefix: env.redisPrefix });
  await fillQueue(queue, spec.n, 0);
  const children = await startWorkers(env, queueName, spec.processes, {
    CONCURRENCY: String(spec.concurrency),
    PG_POOL_SIZE: String(spec.concurrency + 1),
  });
  try {
    const startedAt = performance.now();
    await queue.resume();
    let elapsedMs = 0;
    await withTimeout(
      (async () => {
        while ((await completedCount(queue)) < spec.n) await sleep(50);
        elapsedMs = performance.now() - startedAt;
      })(),
      15 * 60_000,
      `${spec.processes} processes draining ${spec.n} jobs`,
    );
    return { processes: spec.processes, concurrencyPerProcess: spec.concurrency, n: spec.n, elapsedMs, jobsPerSec: (spec.n / elapsedMs) * 1000 };
  } finally {
    await Promise.all(children.map((child) => child.stop()));
    await queue.close();
    await env.deleteQueueKeys(queueName);
    await env.resetTables();
  }
}

/** Resident memory of one worker process under load. */
export interface RssRun {
  readonly concurrency: number;
  readonly poolSize: number;
  readonly maxRssMb: number;
  readonly medianRssMb: number;
  /** Jobs completed while sampling (shows the load was real). */
  readonly jobsInWindow: number;
  readonly windowMs: number;
}

/**
 * One worker process with `concurrency`; every job sleeps `sleepMs` before its effect, so that
 * many jobs are in flight. RSS is sampled from /proc every 100 ms for `windowMs` after a warm-up.
 */
export async function runRss(env: BenchEnv, spec: { concurrency: number; n: number; windowMs: number; warmupMs: number; sleepMs: number }): Promise<RssRun> {
  const queueName = `rss-${spec.concurrency}-${randomBytes(3).toString('hex')}`;
  const queue = new Queue(queueName, { connection: redisConnection(env.redisUrl), prefix: env.redisPrefix });
  await fillQueue(queue, spec.n, 0, { sleepMs: spec.sleepMs });
  const poolSize = Math.min(spec.concurrency + 2, 20);
  const [child] = await startWorkers(env, queueName, 1, { CONCURRENCY: String(spec.concurrency), PG_POOL_SIZE: String(poolSize) });
  try {
    await queue.resume();
    await sleep(spec.warmupMs);
    const before = await completedCount(queue);
    const samples: number[] = [];
    const startedAt = performance.now();
    while (performance.now() - startedAt < spec.windowMs) {
      const rss = rssMb(child!.pid);
      if (!Number.isNaN(rss)) samples.push(rss);
      await sleep(100);
    }
    const jobsInWindow = (await completedCount(queue)) - before;
    samples.sort((a, b) => a - b);
    return {
      concurrency: spec.concurrency,
      poolSize,
      maxRssMb: samples[samples.length - 1] ?? NaN,
      medianRssMb: samples[Math.floor(samples.length / 2)] ?? NaN,
      jobsInWindow,
      windowMs: spec.windowMs,
    };
  } finally {
    await child!.stop();
    await queue.close();
    await env.deleteQueueKeys(queueName);
    await env.resetTables();
  }
}

/** One kill-and-recover measurement. */
export interface RecoveryRun {
  readonly leaseMs: number;
  readonly stalledIntervalMs: number;
  /** From SIGKILL of the worker holding the key to the key's completion by another worker. */
  readonly recoveryMs: number;
  readonly targetMs: number;
  /** Effect rows for the key (must be 1). */
  readonly effects: number;
}

/**
 * A victim worker claims a key whose handler holds on its first attempt; once a rescuer is up,
 * the victim is SIGKILLed. The clock runs from the kill until the key is completed (by the
 * rescuer, after BullMQ's stalled check hands it the job and the lease has expired).
 */
export async function runRecovery(env: BenchEnv, spec: { leaseMs: number; stalledIntervalMs: number }): Promise<RecoveryRun> {
  const queueName = `rec-${spec.leaseMs}-${randomBytes(3).toString('hex')}`;
  const queue = new Queue(queueName, { connection: redisConnection(env.redisUrl), prefix: env.redisPrefix });
  const timing = { LEASE_MS: String(spec.leaseMs), STALLED_INTERVAL_MS: String(spec.stalledIntervalMs), CONCURRENCY: '2', PG_POOL_SIZE: '3' };
  const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
  const key = `recover-${randomBytes(3).toString('hex')}`;
  const children: BenchChild[] = [];
  try {
    children.push(...(await startWorkers(env, queueName, 1, { ...timing, LOG_LEVEL: 'info' })));
    const victim = children[0]!;
    const payload: BenchPayload = { n: 1, holdFirstAttemptMs: 10 * 60_000 };
    await queue.add('charge', toWireJobData('bench', key, payload), { jobId: key });
    await victim.waitForLine((line) => line.key === key && line.msg === 'key claimed', 30_000);
    children.push(...(await startWorkers(env, queueName, 1, timing)));
    victim.process.kill('SIGKILL');
    const killedAt = performance.now();
    await victim.exited;
    let recoveryMs = NaN;
    await withTimeout(
      (async () => {
        for (;;) {
          const row = await keys.get('bench', key);
          if (row?.status === 'completed') break;
          await sleep(20);
        }
        recoveryMs = performance.now() - killedAt;
      })(),
      spec.leaseMs * 4 + 30_000,
      `recovery of ${key} with leaseMs ${spec.leaseMs}`,
    );
    const effects = Number(
      (await env.db.selectFrom(`${env.schema}.bench_effects`).where('key', '=', key).select((eb) => eb.fn.countAll().as('c')).executeTakeFirst())?.c ?? 0,
    );
    return { leaseMs: spec.leaseMs, stalledIntervalMs: spec.stalledIntervalMs, recoveryMs, targetMs: spec.leaseMs + 2000, effects };
  } finally {
    await Promise.all(children.map((child) => child.stop()));
    await queue.close();
    await env.deleteQueueKeys(queueName);
    await env.resetTables();
  }
}
