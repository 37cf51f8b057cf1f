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
import { waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let workerDb: Kysely<any>;
const appName = `ij-gc-terminations-${randomBytes(4).toString('hex')}`;
let queue: Queue;
const QUEUE = 'gc-terminations';
const scope = 'gc-terminations';
const workers: IdempotentWorker<any, any>[] = [];

beforeAll(async () => {
  env = await createTestEnv('gc_terminations');
  await createEffectsTable(env.db, env.schema);
  workerDb = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 12, applicationName: appName }, () => {});
  queue = new Queue(QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.close({ force: true })));
});
afterAll(async () => {
  await queue?.close();
  await workerDb?.destroy();
  await env?.teardown();
});

/** Terminates some of the worker's backends, at random, until `stop` is set. */
async function terminateAtRandom(stop: { done: boolean }): Promise<number> {
  let terminated = 0;
  while (!stop.done) {
    await new Promise((resolve) => setTimeout(resolve, 5 + Math.random() * 60));
    const { rows } = await sql<{ pid: number }>`
      select pid from pg_stat_activity where application_name = ${appName} and random() < 0.5`.execute(env.db);
    for (const { pid } of rows) await sql`select pg_terminate_backend(${pid})`.execute(env.db);
    terminated += rows.length;
  }
  return terminated;
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
  for (const { name, groupCommit, fastPath, handler: jobHandler } of cases) {
    it(`every job completes once, none fails (${name})`, async () => {
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
      const terminations = terminateAtRandom(stop);
      const added: Array<{ job: Job; key: string }> = [];
      for (let n = 0; n < 400; n++) {
        const key = `k-${n}-${randomUUID()}`;
        added.push({ job: await queue.add('pay', { idempotencyKey: key, scope, payload: { n } }), key });
      }
      try {
        for (const { job } of added) {
          const { job: finished, state } = await waitForJobState(queue, job.id!, ['completed', 'failed'], 120_000);
          expect({ id: job.id, state, failedReason: finished.failedReason }).toEqual({ id: job.id, state: 'completed', failedReason: undefined });
        }
      } finally {
        stop.done = true;
      }
      expect(await terminations).toBeGreaterThan(0);
      for (const { key } of added) expect(await effectsOf(env.db, env.schema, scope, key)).toHaveLength(1);
      expect(events.filter((e) => e.kind === 'failed')).toEqual([]);
    }, 300_000);
  }
});
