// @module-tag redis
/**
 * Group commit under backends terminated at random moments: the leased path's groups and the
 * fast path's (every effect grouped, `groupCommit: true`), and a database-only handler with the
 * defaults, with jobs of one attempt each. Every job completes once; none fails, whatever
 * statement of a group the termination cut.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { Queue, type Job } from 'bullmq';
import { sql, type Kysely } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, createIdempotentWorker, type DatabaseOnlyJobHandler, createPostgresDb, type IdempotentWorker, type JobContext, type WorkerEvent } from '../src/index.js';
import { createEffectsTable, effectsOf } from './support/protocol-fixtures.js';
import { sleep } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let workerDb: Kysely<any>;
const appName = `ij-gc-terminations-${randomBytes(4).toString('hex')}`;
/** Each case has a queue of its own: a case that fails leaves no job for the next to count. */
const queues: Queue[] = [];
const scope = 'gc-terminations';
const workers: IdempotentWorker<any, any>[] = [];

beforeAll(async () => {
  env = await createTestEnv('gc_terminations');
  await createEffectsTable(env.db, env.schema);
  workerDb = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 12, applicationName: appName }, () => {});
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.close({ force: true })));
});
afterAll(async () => {
  await Promise.all(queues.map((queue) => queue.close()));
  await workerDb?.destroy();
  await env?.teardown();
});

/**
 * Terminates some of the worker's backends, at random, until `stop` is set: in bursts of a second,
 * each followed by a lull that lasts until a job has finished (at most 5 s). A deployment's
 * connections fail now and then, not for ever: without the lulls, a loaded machine's groups,
 * slower than the pace of the terminations, would all be cut (the test checks that no
 * termination loses or repeats a job, not that jobs finish under an endless storm).
 */
async function terminateAtRandom(stop: { done: boolean }, times: number[], queue: Queue): Promise<number> {
  let terminated = 0;
  while (!stop.done) {
    const burstEnd = Date.now() + 1_000;
    while (!stop.done && Date.now() < burstEnd) {
      await sleep(5 + Math.random() * 60);
      const { rows } = await sql<{ pid: number }>`
        select pid from pg_stat_activity where application_name = ${appName} and random() < 0.5`.execute(env.db);
      for (const { pid } of rows) await sql`select pg_terminate_backend(${pid})`.execute(env.db);
      terminated += rows.length;
      for (const _ of rows) times.push(Date.now());
    }
    const finishedAtLull = await finishedCount(queue);
    const lullEnd = Date.now() + 5_000;
    while (!stop.done && Date.now() < lullEnd && (await finishedCount(queue)) === finishedAtLull) await sleep(20);
  }
  return terminated;
}

/** Jobs of the queue that are completed or failed. */
async function finishedCount(queue: Queue): Promise<number> {
  const counts = await queue.getJobCounts('completed', 'failed');
  return (counts.completed ?? 0) + (counts.failed ?? 0);
}

/** Waits until `total` jobs have finished; throws, with `describeStall()`, when none has for `stallMs`. */
async function untilAllFinished(queue: Queue, total: number, stallMs: number, describeStall: () => Promise<string>): Promise<void> {
  let finished = await finishedCount(queue);
  let progressAt = Date.now();
  while (finished < total) {
    await sleep(200);
    const now = await finishedCount(queue);
    if (now > finished) progressAt = Date.now();
    finished = now;
    if (Date.now() - progressAt > stallMs) {
      throw new Error(`no job finished for ${stallMs} ms (${total - finished} of them unfinished); the first unfinished:\n${await describeStall()}`);
    }
  }
}

function countsOf(values: readonly string[]): Map<string, number> {
  const counts = new Map<string, number>();
  for (const value of values) counts.set(value, (counts.get(value) ?? 0) + 1);
  return counts;
}

/** What happened to a job that did not finish: its state, attempts, its key's row and events, the terminations' pace. */
async function historyOf(queue: Queue, jobId: string, key: string, events: readonly WorkerEvent[], terminations: readonly number[]): Promise<string> {
  const state = await queue.getJobState(jobId);
  const job = await queue.getJob(jobId);
  const { rows } = await sql`select * from ${sql.id(env.schema, 'idempotency_keys')} where scope = ${scope} and key = ${key}`.execute(env.db);
  const lastSecond = terminations.filter((t) => t > Date.now() - 1_000).length;
  return [
    `job ${jobId}: state ${state}, attemptsMade ${job?.attemptsMade}, delay ${job?.delay}, processedOn ${job?.processedOn ? `${job.processedOn - job.timestamp} ms after it was added` : '-'}`,
    `key row: ${JSON.stringify(rows)}`,
    `its events: ${events.filter((e) => e.key === key || e.jobId === jobId).map((e) => `${e.kind}${e.cause ? ` (${e.cause})` : ''}`).join(', ') || 'none'}`,
    `all events: ${[...countsOf(events.map((e) => e.kind))].map(([kind, count]) => `${kind} ${count}`).join(', ')}`,
    `backends terminated: ${terminations.length}, ${lastSecond} in the last second`,
  ].join('\n');
}

const handler = (ctx: JobContext<{ n: number }>) =>
  ctx.transaction(async (tx) => {
    await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, 'w')`.execute(tx);
    return { n: ctx.data.n };
  });

const databaseOnlyHandler: DatabaseOnlyJobHandler<{ n: number }, { n: number }> = {
  transaction: async (tx, ctx) => {
    await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, 'w')`.execute(tx);
    return { n: ctx.data.n };
  },
};

describe('group commit with backends terminated at random', () => {
  const cases = [
    { name: 'leased, every effect grouped', groupCommit: true, fastPath: false, handler },
    { name: 'fast path, every effect grouped', groupCommit: true, fastPath: true, handler },
    { name: 'a database-only handler with the defaults (fast path, grouped)', groupCommit: undefined, fastPath: undefined, handler: databaseOnlyHandler },
  ] as const;
  for (const [index, { name, groupCommit, fastPath, handler: jobHandler }] of cases.entries()) {
    it(`every job completes once, none fails (${name})`, async () => {
      const QUEUE = `gc-terminations-${index}`;
      const queue = new Queue(QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
      queues.push(queue);
      const keys = new IdempotencyKeys({ db: workerDb, schema: env.schema, leaseMs: 3_000, ...(groupCommit ? { groupCommit } : {}) });
      const events: WorkerEvent[] = [];
      const worker = createIdempotentWorker<{ n: number }>({
        queue: QUEUE, connection: { url: env.redisUrl }, prefix: env.redisPrefix, keys, handler: jobHandler,
        ...(fastPath === undefined ? {} : { fastPath }),
        concurrency: 16, logger: pino({ level: 'silent' }), storeRetryMinMs: 10, storeRetryMaxMs: 100,
      });
      worker.on('event', (event) => events.push(event));
      workers.push(worker);
      const stop = { done: false };
      const terminated: number[] = [];
      const terminations = terminateAtRandom(stop, terminated, queue);
      const added: Array<{ job: Job; key: string }> = [];
      for (let n = 0; n < 400; n++) {
        const key = `k-${n}-${randomUUID()}`;
        added.push({ job: await queue.add('pay', { idempotencyKey: key, scope, payload: { n } }), key });
      }
      try {
        // Liveness, not speed: the run fails when no job has finished for a minute (a job that can
        // never finish), however slow a loaded machine makes the terminated groups' retries.
        await untilAllFinished(queue, added.length, 60_000, async () => {
          const unfinished: string[] = [];
          for (const { job, key } of added) {
            if (unfinished.length === 3) break;
            if (!['completed', 'failed'].includes(await queue.getJobState(job.id!))) unfinished.push(await historyOf(queue, job.id!, key, events, terminated));
          }
          return unfinished.join('\n');
        });
        for (const { job } of added) {
          const finished = (await queue.getJob(job.id!))!;
          expect({ id: job.id, state: await finished.getState(), failedReason: finished.failedReason }).toEqual({ id: job.id, state: 'completed', failedReason: undefined });
        }
      } finally {
        stop.done = true;
      }
      expect(await terminations).toBeGreaterThan(0);
      for (const { key } of added) expect(await effectsOf(env.db, env.schema, scope, key)).toHaveLength(1);
      expect(events.filter((e) => e.kind === 'failed')).toEqual([]);
    }, 600_000);
  }
});
