// @module-tag redis
/**
 * Per-key concurrency limits: at most N jobs of one concurrency key run at once, across workers;
 * a job over the limit is deferred without using an attempt; a crashed run's slot frees with its
 * lease; a job that has waited long enough goes before newcomers.
 */
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { register } from 'prom-client';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { IdempotencyKeys, createIdempotentWorker, isHeld, type ConcurrencySlot, type IdempotentWorker, type WorkerEvent } from '../src/index.js';
import { identityFromWireContract } from '../src/consumer/wire-contract.js';
import { instrumentWorker } from '../src/process/index.js';
import { concurrencyGroupCounts } from '../src/store/sql/concurrency-slots.js';
import { createEffectsTable, effectsOf, expireLease } from './support/protocol-fixtures.js';
import { waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let keys: IdempotencyKeys;
const workers: IdempotentWorker<any, any>[] = [];
const queues: Queue[] = [];
const acme = { key: 'tenant:acme', limit: 2 };
const slotOptions = { leaseMs: 30_000, starvationMs: 60_000 };

beforeAll(async () => {
  env = await createTestEnv('concurrency-limits');
  await createEffectsTable(env.db, env.schema);
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.close({ force: true })));
  await Promise.all(queues.splice(0).map((q) => q.close()));
});
afterAll(async () => {
  await env?.teardown();
});
beforeEach(async () => {
  await sql`truncate ${sql.id(env.schema, 'concurrency_slots')}, ${sql.id(env.schema, 'concurrency_waiters')}`.execute(env.db);
});

function held(answer: Awaited<ReturnType<IdempotencyKeys['acquireConcurrencySlot']>>): ConcurrencySlot {
  if (!answer.acquired) throw new Error('expected a slot');
  return answer;
}

describe('concurrency slots', () => {
  it('gives at most `limit` slots of a key at once, even to acquisitions racing, and one again once a run ends', async () => {
    const answers = await Promise.all(Array.from({ length: 8 }, (_, n) => keys.acquireConcurrencySlot('s', `job-${n}`, acme, slotOptions)));
    const acquired = answers.filter((a) => a.acquired) as ConcurrencySlot[];
    expect(acquired.map((a) => a.slot).sort()).toEqual([0, 1]);
    for (const refused of answers.filter((a) => !a.acquired)) expect(refused).toMatchObject({ acquired: false, retryAfterMs: expect.any(Number) });
    // Another key has slots of its own.
    expect((await keys.acquireConcurrencySlot('s', 'other', { key: 'tenant:globex', limit: 1 }, slotOptions)).acquired).toBe(true);
    expect(await concurrencyGroupCounts(env.db, env.schema, 'tenant:acme')).toEqual({ running: 2, waiting: 6 });

    expect(await keys.releaseConcurrencySlot('s', 'job-x', acquired[0]!)).toBe(true);
    expect(await keys.releaseConcurrencySlot('s', 'job-x', acquired[0]!)).toBe(false);
    const waiter = answers.findIndex((a) => !a.acquired);
    expect(held(await keys.acquireConcurrencySlot('s', `job-${waiter}`, acme, slotOptions)).slot).toBe(acquired[0]!.slot);
  });

  it("a crashed run's slot is held while its key's lease lives, and frees when the lease ends", async () => {
    const slot = held(await keys.acquireConcurrencySlot('s', 'crashing', { key: 'tenant:solo', limit: 1 }, slotOptions));
    const claim = await keys.claim('s', 'crashing', keys.fingerprint(1));
    expect(isHeld(claim)).toBe(true);
    // The worker dies: nothing frees the slot. Its own time is up, but the key's lease is live.
    await sql`update ${sql.id(env.schema, 'concurrency_slots')} set acquired_until = now() - interval '1 second'`.execute(env.db);
    expect((await keys.acquireConcurrencySlot('s', 'next', { key: 'tenant:solo', limit: 1 }, slotOptions)).acquired).toBe(false);
    await expireLease(env.db, env.schema, 's', 'crashing');
    expect(held(await keys.acquireConcurrencySlot('s', 'next', { key: 'tenant:solo', limit: 1 }, slotOptions)).slot).toBe(slot.slot);
  });

  it('a waiter deferred longer than the starvation bound goes before newcomers', async () => {
    const solo = { key: 'tenant:busy', limit: 1 };
    const first = held(await keys.acquireConcurrencySlot('s', 'running', solo, slotOptions));
    expect((await keys.acquireConcurrencySlot('s', 'patient', solo, slotOptions)).acquired).toBe(false);
    await sql`update ${sql.id(env.schema, 'concurrency_waiters')} set since = now() - interval '2 minutes' where key = 'patient'`.execute(env.db);
    await keys.releaseConcurrencySlot('s', 'running', first);
    // The slot is free, but a newcomer must let the starving waiter go first.
    expect((await keys.acquireConcurrencySlot('s', 'newcomer', solo, slotOptions)).acquired).toBe(false);
    expect((await keys.acquireConcurrencySlot('s', 'patient', solo, slotOptions)).acquired).toBe(true);
  });

  it('a starving waiter that has not come back within the bound holds no slot back (a backlog would otherwise stop the key)', async () => {
    const solo = { key: 'tenant:backlog', limit: 1 };
    expect((await keys.acquireConcurrencySlot('s', 'absent', solo, slotOptions)).acquired).toBe(true);
    await sql`truncate ${sql.id(env.schema, 'concurrency_slots')}`.execute(env.db);
    // A waiter deferred 2 minutes ago and last seen 61 s ago (past the 60 s bound, short of the
    // 120 s after which it is forgotten): its job is queued behind others, or gone.
    await sql`insert into ${sql.id(env.schema, 'concurrency_waiters')} (group_key, scope, key, since, seen_at)
              values ('tenant:backlog', 's', 'absent', now() - interval '2 minutes', now() - interval '61 seconds')`.execute(env.db);
    expect((await keys.acquireConcurrencySlot('s', 'present', solo, slotOptions)).acquired).toBe(true);
  });

  it('the wire contract reads a concurrency key and limit, and refuses half of one or a bad limit', () => {
    const job = (data: object) => ({ name: 'sync', data: { idempotencyKey: 'k', payload: 1, ...data } });
    expect(identityFromWireContract(job({ concurrencyKey: 'tenant:acme', concurrencyLimit: 3 })).concurrency).toEqual({ key: 'tenant:acme', limit: 3 });
    expect(identityFromWireContract(job({})).concurrency).toBeUndefined();
    expect(() => identityFromWireContract(job({ concurrencyKey: 'tenant:acme' }))).toThrow(/concurrencyLimit/);
    expect(() => identityFromWireContract(job({ concurrencyKey: 'tenant:acme', concurrencyLimit: 0 }))).toThrow(/concurrencyLimit/);
    expect(() => identityFromWireContract(job({ concurrencyLimit: 2 }))).toThrow(/concurrencyKey/);
    // A coalescing job's key leaves room for its generation suffix.
    expect(identityFromWireContract({ name: 'sync', data: { idempotencyKey: 'k'.repeat(235), payload: 1, coalesce: true } }).coalesce).toBe(true);
    expect(() => identityFromWireContract({ name: 'sync', data: { idempotencyKey: 'k'.repeat(236), payload: 1, coalesce: true } })).toThrow(/at most 235/);
    expect(() => identityFromWireContract({ name: 'sync', data: { idempotencyKey: 'k', payload: 1, coalesce: 'yes' } })).toThrow(/"coalesce"/);
  });
});

describe('workers with a concurrency limit', () => {
  it('two workers of five slots each run at most two jobs of one tenant at once; the rest wait without using an attempt, each runs once', { timeout: 60_000 }, async () => {
    const queue = new Queue('limited', { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
    queues.push(queue);
    let running = 0;
    let most = 0;
    const events: WorkerEvent[] = [];
    const stops: Array<() => void> = [];
    for (const name of ['w1', 'w2']) {
      const worker = createIdempotentWorker<{ n: number }>({
        queue: 'limited',
        connection: { url: env.redisUrl },
        prefix: env.redisPrefix,
        keys,
        concurrency: 5,
        deferMaxMs: 200,
        deferMinMs: 20,
        logger: pino({ level: 'silent' }),
        handler: async (ctx) => {
          running++;
          most = Math.max(most, running);
          try {
            await new Promise((resolve) => setTimeout(resolve, 100));
            return await ctx.transaction(async (tx) => {
              await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${name})`.execute(tx);
              return ctx.data.n;
            });
          } finally {
            running--;
          }
        },
      });
      worker.on('event', (event: WorkerEvent) => events.push(event));
      stops.push(instrumentWorker(worker, 'limited'));
      workers.push(worker);
    }
    const ids = Array.from({ length: 10 }, (_, n) => `limited-${n}`);
    await queue.addBulk(
      ids.map((id, n) => ({ name: 'sync', data: { idempotencyKey: id, scope: 'l', payload: { n }, concurrencyKey: 'tenant:acme', concurrencyLimit: 2 }, opts: { jobId: id, attempts: 1 } })),
    );
    for (const id of ids) await waitForJobState(queue, id, ['completed'], 50_000);
    expect(most).toBeLessThanOrEqual(2);
    for (const id of ids) expect(await effectsOf(env.db, env.schema, 'l', id)).toHaveLength(1);
    const limited = events.filter((e) => e.kind === 'concurrency-limited');
    expect(limited.length).toBeGreaterThan(0);
    expect(limited[0]).toMatchObject({ concurrencyKey: 'tenant:acme' });
    expect(await concurrencyGroupCounts(env.db, env.schema, 'tenant:acme')).toEqual({ running: 0, waiting: 0 });
    // Counted per group (the key's part before ":"), not per tenant: bounded labels.
    const metric = await register.getSingleMetric('idempotent_jobs_concurrency_limited_total')!.get();
    const series = metric.values.filter((v) => v.labels.queue === 'limited');
    expect(series.map((v) => v.labels.group)).toEqual(['tenant']);
    expect(series[0]!.value).toBe(limited.length);
    for (const stop of stops) stop();
  });
});
