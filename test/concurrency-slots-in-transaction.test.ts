// @module-tag redis
/**
 * Concurrency slots held by a run's own transaction (the fast path, alone): no slot row and no
 * commit of their own, counted against the same limit as slot rows, freed when the transaction
 * ends however it ends (its connection killed too), and the waiters they hold back woken then.
 *
 * Invariants attacked: at most `limit` runs of a key at once, whichever kind of holder (a
 * transaction's lock, a row of the leased path); a refused job uses no attempt and runs once,
 * later; a slot never outlives its transaction; a waiter seen by the run is woken when it ends,
 * and one that came after asks again within a second.
 */
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, KeySettledListener, createIdempotentWorker, type IdempotentWorker, type IdempotentWorkerOptions, type WorkerEvent } from '../src/index.js';
import { concurrencyGroupCounts } from '../src/store/sql/concurrency-slots.js';
import { createEffectsTable, createGate, effectsOf } from './support/protocol-fixtures.js';
import { sleep, waitFor, waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let listener: KeySettledListener;
let keys: IdempotencyKeys;
const workers: IdempotentWorker<any, any>[] = [];
const queues: Queue[] = [];
/** A refused job comes back on its own only after this: a run within it was woken. */
const DEFERRAL_MS = 20_000;

beforeAll(async () => {
  env = await createTestEnv('concurrency-slots-in-transaction');
  await createEffectsTable(env.db, env.schema);
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000 });
  listener = new KeySettledListener({ connectionString: env.databaseDirectUrl, schema: env.schema });
  await listener.connect();
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.close({ force: true })));
  await Promise.all(queues.splice(0).map((q) => q.close()));
});
afterAll(async () => {
  await listener?.close();
  await env?.teardown();
});

function startWorker<P>(queue: string, options: Partial<IdempotentWorkerOptions<P, unknown>> & Pick<IdempotentWorkerOptions<P, unknown>, 'handler'>) {
  const worker = createIdempotentWorker<P>({
    queue,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    keys,
    concurrency: 8,
    listener,
    deferMinMs: DEFERRAL_MS,
    deferMaxMs: DEFERRAL_MS,
    deferJitterRatio: 0,
    logger: pino({ level: 'silent' }),
    ...options,
  });
  workers.push(worker);
  return worker;
}

async function addJobs(queueName: string, scope: string, count: number, limit: { key: string; limit: number }): Promise<{ queue: Queue; ids: string[] }> {
  const queue = new Queue(queueName, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  queues.push(queue);
  const ids = Array.from({ length: count }, (_, n) => `${scope}-${n}`);
  for (const [n, id] of ids.entries()) {
    await queue.add('sync', { idempotencyKey: id, scope, payload: { n }, concurrencyKey: limit.key, concurrencyLimit: limit.limit }, { jobId: id, attempts: 3 });
  }
  return { queue, ids };
}

const insertEffect = (tx: any, scope: string, key: string, fence: number) =>
  sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${scope}, ${key}, ${fence}, 'w')`.execute(tx);

const slotRows = async (group: string) =>
  (await sql<{ n: number }>`select count(*)::int as n from ${sql.id(env.schema, 'concurrency_slots')} where group_key = ${group}`.execute(env.db)).rows[0]!.n;

describe('a fast-path run holds its slot by its transaction', () => {
  it('no slot row while it runs, counted as running; the next job of the key is deferred, then woken when it commits (not at the end of its deferral)', { timeout: 60_000 }, async () => {
    const gate = createGate();
    const started: string[] = [];
    const events: WorkerEvent[] = [];
    const worker = startWorker<{ n: number }>('in-tx-hold', {
      handler: {
        transaction: async (tx, ctx) => {
          started.push(ctx.key);
          if (ctx.data.n === 0) await gate.wait;
          await insertEffect(tx, ctx.scope, ctx.key, ctx.fence);
          return ctx.data.n;
        },
      },
    });
    worker.on('event', (event: WorkerEvent) => events.push(event));
    const { queue, ids } = await addJobs('in-tx-hold', 'hold', 2, { key: 'tenant:hold', limit: 1 });
    await waitFor('the first job to run', async () => (started.includes(ids[0]!) ? true : undefined));
    await waitFor('the second job to be deferred', async () => (events.some((e) => e.kind === 'concurrency-limited' && e.jobId === ids[1]) ? true : undefined));
    expect(started).toEqual([ids[0]]);
    expect(await slotRows('tenant:hold')).toBe(0);
    expect(await concurrencyGroupCounts(env.db, env.schema, 'tenant:hold')).toEqual({ running: 1, waiting: 1 });
    const openedAt = performance.now();
    gate.open();
    const { job } = await waitForJobState(queue, ids[1]!, ['completed'], 30_000);
    expect(performance.now() - openedAt).toBeLessThan(DEFERRAL_MS / 2);
    expect(job.attemptsMade).toBeLessThanOrEqual(1);
    for (const id of ids) expect(await effectsOf(env.db, env.schema, 'hold', id)).toHaveLength(1);
    expect(await concurrencyGroupCounts(env.db, env.schema, 'tenant:hold')).toEqual({ running: 0, waiting: 0 });
  });

  it('a slot row (a leased run) and a transaction\'s slot count against one limit, each way', { timeout: 60_000 }, async () => {
    // A row holds the only slot: the fast-path job is deferred, and runs once the row is freed.
    const row = await keys.acquireConcurrencySlot('rows', 'leased-run', { key: 'tenant:mixed', limit: 1 }, { starvationMs: 30_000, leaseMs: 30_000 });
    expect(row.acquired).toBe(true);
    const gate = createGate();
    const events: WorkerEvent[] = [];
    const worker = startWorker<{ n: number }>('in-tx-mixed', {
      handler: {
        transaction: async (tx, ctx) => {
          if (ctx.data.n === 0) await gate.wait;
          await insertEffect(tx, ctx.scope, ctx.key, ctx.fence);
          return ctx.data.n;
        },
      },
    });
    worker.on('event', (event: WorkerEvent) => events.push(event));
    const { queue, ids } = await addJobs('in-tx-mixed', 'mixed', 1, { key: 'tenant:mixed', limit: 1 });
    await waitFor('the job to be deferred', async () => (events.some((e) => e.kind === 'concurrency-limited') ? true : undefined));
    expect(await effectsOf(env.db, env.schema, 'mixed', ids[0]!)).toHaveLength(0);
    if (!row.acquired) throw new Error('unreachable');
    expect(await keys.releaseConcurrencySlot('rows', 'leased-run', row)).toBe(true);

    // The other way: while the job's transaction holds the slot, a row is refused, told to ask again within a second.
    await waitFor('the job to hold the slot', async () => ((await concurrencyGroupCounts(env.db, env.schema, 'tenant:mixed')).running === 1 ? true : undefined), 30_000);
    const refused = await keys.acquireConcurrencySlot('rows', 'leased-run-2', { key: 'tenant:mixed', limit: 1 }, { starvationMs: 30_000, leaseMs: 30_000 });
    expect(refused.acquired).toBe(false);
    if (refused.acquired) throw new Error('unreachable');
    expect(refused.retryAfterMs).toBeLessThanOrEqual(1_000);
    gate.open();
    await waitForJobState(queue, ids[0]!, ['completed'], 30_000);
    expect(await effectsOf(env.db, env.schema, 'mixed', ids[0]!)).toHaveLength(1);
    const after = await keys.acquireConcurrencySlot('rows', 'leased-run-2', { key: 'tenant:mixed', limit: 1 }, { starvationMs: 30_000, leaseMs: 30_000 });
    expect(after.acquired).toBe(true);
    if (after.acquired) await keys.releaseConcurrencySlot('rows', 'leased-run-2', after);
  });

  it('a run whose connection is killed frees its slot with its transaction; the job runs again without using an attempt and commits once', { timeout: 60_000 }, async () => {
    let runs = 0;
    const killed = createGate();
    startWorker<{ n: number }>('in-tx-killed', {
      handler: {
        transaction: async (tx, ctx) => {
          runs++;
          if (runs === 1) {
            const { rows } = await sql<{ pid: number }>`select pg_backend_pid() as pid`.execute(tx);
            await sql`select pg_terminate_backend(${rows[0]!.pid})`.execute(env.db);
            killed.open();
          }
          await insertEffect(tx, ctx.scope, ctx.key, ctx.fence);
          return ctx.data.n;
        },
      },
    });
    const { queue, ids } = await addJobs('in-tx-killed', 'killed', 1, { key: 'tenant:killed', limit: 1 });
    await killed.wait;
    const { job } = await waitForJobState(queue, ids[0]!, ['completed'], 45_000);
    expect(runs).toBe(2);
    expect(job.attemptsMade).toBeLessThanOrEqual(1);
    expect(await effectsOf(env.db, env.schema, 'killed', ids[0]!)).toHaveLength(1);
    expect(await concurrencyGroupCounts(env.db, env.schema, 'tenant:killed')).toEqual({ running: 0, waiting: 0 });
  });

  it('fast-path and leased workers on one key at limit 3: never more than 3 runs at once, every job committed once', { timeout: 90_000 }, async () => {
    let running = 0;
    let most = 0;
    const during = async <T>(body: () => Promise<T>): Promise<T> => {
      running++;
      most = Math.max(most, running);
      try {
        return await body();
      } finally {
        running--;
      }
    };
    const queueName = 'in-tx-load';
    // Both workers take from one queue: one runs each job as a transaction, the other leased.
    startWorker<{ n: number }>(queueName, {
      deferMinMs: 20,
      deferMaxMs: 200,
      handler: { transaction: (tx, ctx) => during(() => sleep(30).then(() => insertEffect(tx, ctx.scope, ctx.key, ctx.fence)).then(() => ctx.data.n)) },
    });
    startWorker<{ n: number }>(queueName, {
      deferMinMs: 20,
      deferMaxMs: 200,
      handler: (ctx) => during(() => sleep(30).then(() => ctx.transaction((tx) => insertEffect(tx, ctx.scope, ctx.key, ctx.fence).then(() => ctx.data.n)))),
    });
    const { queue, ids } = await addJobs(queueName, 'load', 60, { key: 'tenant:load', limit: 3 });
    for (const id of ids) await waitForJobState(queue, id, ['completed'], 60_000);
    expect(most).toBeLessThanOrEqual(3);
    expect(most).toBeGreaterThanOrEqual(2);
    for (const id of ids) expect(await effectsOf(env.db, env.schema, 'load', id)).toHaveLength(1);
    expect(await concurrencyGroupCounts(env.db, env.schema, 'tenant:load')).toEqual({ running: 0, waiting: 0 });
  });
});
