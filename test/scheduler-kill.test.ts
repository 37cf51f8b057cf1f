// @module-tag redis
/**
 * Schedulers killed and restarted: two maintenance processes (real processes, `idempotent-jobs
 * maintenance`) run the scheduler of a one-second schedule while one of them, then both, are
 * killed with SIGKILL and started again, and finished jobs are cleaned from the queue so that a
 * repeated tick would be a new BullMQ job. Every tick from the first to the last must have its
 * effect committed exactly once: no tick twice, none lost.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { IdempotencyKeys, Schedules, createIdempotentWorker, scheduleScope, tickKey, type IdempotentWorker } from '../src/index.js';
import { createEffectsTable } from './support/protocol-fixtures.js';
import { waitFor } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const BIN = fileURLToPath(new URL('../bin/idempotent-jobs.js', import.meta.url));
const NAME = 'killed';
const QUEUE = 'killed-schedulers';

let env: TestEnv;
let schedules: Schedules;
let worker: IdempotentWorker<any, any> | undefined;
let queue: Queue | undefined;
const children = new Set<ChildProcess>();

beforeAll(async () => {
  env = await createTestEnv('scheduler_kill');
  await createEffectsTable(env.db, env.schema);
  schedules = new Schedules({ db: env.db, schema: env.schema });
});
afterAll(async () => {
  for (const child of children) child.kill('SIGKILL');
  await worker?.close({ force: true });
  await queue?.close();
  await env?.teardown();
});

function startScheduler(): ChildProcess {
  const child = spawn(process.execPath, [BIN, 'maintenance'], {
    env: {
      ...process.env,
      DATABASE_URL: env.databaseUrl,
      SCHEMA: env.schema,
      REDIS_URL: env.redisUrl,
      REDIS_PREFIX: env.redisPrefix,
      QUEUE,
      JANITOR_ENABLED: 'false',
      SWEEPER_ENABLED: 'false',
      SCHEDULER_INTERVAL_MS: '100',
      MIGRATE: 'false',
      LOG_LEVEL: 'silent',
    },
    stdio: 'ignore',
  });
  children.add(child);
  child.once('exit', () => children.delete(child));
  return child;
}

async function kill(child: ChildProcess): Promise<void> {
  const exited = once(child, 'exit');
  child.kill('SIGKILL');
  await exited;
}

const lastTick = async () => (await schedules.get(NAME))!.lastTick?.getTime() ?? 0;

/** Waits until the schedule's last tick is `count` ticks past what it was (past its first tick, before any). */
async function ticksPass(count: number): Promise<void> {
  await waitFor('the first tick', async () => ((await lastTick()) > 0 ? true : undefined), 60_000, 100);
  const from = await lastTick();
  await waitFor(`${count} more ticks`, async () => ((await lastTick()) >= from + count * 1000 ? true : undefined), 60_000, 100);
}

it('killed and restarted schedulers commit every tick of a one-second schedule exactly once, none lost', async () => {
  await schedules.upsert({ name: NAME, every: 1000, queue: QUEUE, missed: 'all', maxMissed: 1000 });
  const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
  worker = createIdempotentWorker({
    queue: QUEUE,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    keys,
    concurrency: 4,
    logger: pino({ level: 'silent' }),
    handler: async (ctx) =>
      ctx.transaction(async (tx) => {
        await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, 'w')`.execute(tx);
        return null;
      }),
  });
  queue = new Queue(QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  let a = startScheduler();
  let b = startScheduler();
  await ticksPass(2);
  for (let round = 0; round < 3; round++) {
    // One scheduler killed while the other goes on; then both, so the restarted ones catch up the missed ticks.
    if (round < 2) {
      await kill(round === 0 ? a : b);
      if (round === 0) a = startScheduler();
      else b = startScheduler();
    } else {
      await Promise.all([kill(a), kill(b)]);
      await queue.clean(0, 10_000, 'completed');
      a = startScheduler();
      b = startScheduler();
    }
    await queue.clean(0, 10_000, 'completed');
    await ticksPass(2);
  }
  await Promise.all([kill(a), kill(b)]);
  const first = (await sql<{ cursor: Date }>`select created_at as cursor from ${sql.id(env.schema, 'schedules')} where name = ${NAME}`.execute(env.db)).rows[0]!.cursor.getTime();
  const last = await lastTick();
  const expected: string[] = [];
  for (let tick = Math.floor(first / 1000) * 1000 + 1000; tick <= last; tick += 1000) expected.push(tickKey(new Date(tick)));
  expect(expected.length).toBeGreaterThanOrEqual(8);
  await waitFor('every tick committed', async () => {
    const { rows } = await sql<{ n: string }>`select count(distinct key) as n from ${sql.id(env.schema, 'effects')}`.execute(env.db);
    return Number(rows[0]!.n) >= expected.length || undefined;
  }, 60_000);
  await waitFor('the queue drained', async () => {
    const counts = await queue!.getJobCounts('waiting', 'active', 'delayed', 'prioritized');
    return Object.values(counts).every((n) => n === 0) || undefined;
  }, 60_000);
  const { rows } = await sql<{ key: string; n: string }>`
    select key, count(*) as n from ${sql.id(env.schema, 'effects')} where scope = ${scheduleScope(NAME)} group by key order by key`.execute(env.db);
  expect(rows.filter((row) => Number(row.n) !== 1)).toEqual([]);
  // A scheduler enqueues a round's ticks before it moves the cursor, so one killed between the
  // two leaves ticks past the last tick the cursor shows; each still runs once. Those ticks
  // must follow on without a gap, as every earlier one.
  const ran = new Set(rows.map((row) => row.key));
  for (let tick = last + 1000; ran.has(tickKey(new Date(tick))); tick += 1000) expected.push(tickKey(new Date(tick)));
  expect(rows.map((row) => row.key)).toEqual(expected);
}, 180_000);
