// @module-tag redis
/**
 * Per-key concurrency limits: at most N jobs of one concurrency key run at once, across workers;
 * a job over the limit is deferred without using an attempt; a crashed run's slot frees with its
 * lease; a job that has waited long enough goes before newcomers.
 */
import { Queue } from 'bullmq';
import { Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import { pino } from 'pino';
import { register } from 'prom-client';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { IdempotencyKeys, ValidationError, createIdempotentWorker, isHeld, type ConcurrencySlot, type IdempotentWorker, type WorkerEvent } from '../src/index.js';
import { identityFromWireContract, toWireJobData } from '../src/consumer/wire-contract.js';
import { instrumentWorker } from '../src/process/index.js';
import { concurrencyGroupCounts } from '../src/store/sql/concurrency-slots.js';
import { createEffectsTable, effectsOf } from './support/protocol-fixtures.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
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

  it("acquisitions of one key take different slots at once: none waits on another's commit, and a slot being taken is never taken twice", async () => {
    const group = { key: 'tenant:parallel', limit: 2 };
    const call = (key: string, limit: number) =>
      sql<{ slot: number | null }>`select * from ${sql.id(env.schema, 'acquire_concurrency_slot')}(
        ${group.key}::text, ${limit}::int, 's'::text, ${key}::text, gen_random_uuid(), 30000, 60000, null, null, null)`;
    // One acquisition whose commit has not come yet (a slow WAL flush, say): it holds one slot.
    const slow = env.openDb(1);
    const other = env.openDb(1);
    let commitSlow!: () => void;
    const slowCommitted = new Promise<void>((resolve) => (commitSlow = resolve));
    let tookSlot!: (slot: number | null) => void;
    const slowTook = new Promise<number | null>((resolve) => (tookSlot = resolve));
    const slowRun = slow.transaction().execute(async (tx) => {
      tookSlot((await call('slow', group.limit).execute(tx)).rows[0]!.slot);
      await slowCommitted;
    });
    const slowSlot = await slowTook;
    try {
      expect([0, 1]).toContain(slowSlot);
      // Another acquisition of the key does not wait for that commit (a wait would end in a lock
      // timeout): it takes the other slot; a third is refused, not given the slow run's.
      await other.transaction().execute(async (tx) => {
        await sql`set local lock_timeout = '2s'`.execute(tx);
        expect((await call('quick', group.limit).execute(tx)).rows[0]!.slot).toBe(1 - slowSlot!);
        expect((await call('refused', group.limit).execute(tx)).rows[0]!.slot).toBeNull();
      });
    } finally {
      commitSlow();
      await slowRun;
    }
    // Committed, both slots are held: still refused.
    expect((await keys.acquireConcurrencySlot('s', 'after', group, slotOptions)).acquired).toBe(false);
  });

  it("a release's commit does not wait for the WAL flush, and leaves its connection's synchronous_commit as it was", async () => {
    // One connection, so the statement after the release runs in the release's session.
    const statements: string[] = [];
    const oneConnection = new Kysely<any>({
      dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: env.databaseUrl, max: 1 }) }),
      log: (event) => {
        statements.push(event.query.sql);
      },
    });
    try {
      const slotKeys = new IdempotencyKeys({ db: oneConnection, schema: env.schema });
      const slot = held(await slotKeys.acquireConcurrencySlot('s', 'async-release', { key: 'tenant:async', limit: 1 }, slotOptions));
      expect(await slotKeys.releaseConcurrencySlot('s', 'async-release', slot)).toBe(true);
      // Which commit waits for the flush cannot be seen from a client; the statement is what decides it.
      const release = statements.find((text) => text.includes('concurrency_slots') && text.includes('delete from'));
      expect(release).toMatch(/set_config\('synchronous_commit', 'off', true\)/);
      const { rows } = await sql<{ synchronous_commit: string }>`select current_setting('synchronous_commit') as synchronous_commit`.execute(oneConnection);
      expect(rows[0]!.synchronous_commit).toBe('on');
      // The slot is free: a release lost to a crash would leave it held only until its time is up.
      expect((await slotKeys.acquireConcurrencySlot('s', 'after-async-release', { key: 'tenant:async', limit: 1 }, slotOptions)).acquired).toBe(true);
    } finally {
      await oneConnection.destroy();
    }
  });

  it("a crashed run's slot is held until its time is up, and frees then though its key's lease lives", async () => {
    const slot = held(await keys.acquireConcurrencySlot('s', 'crashing', { key: 'tenant:solo', limit: 1 }, slotOptions));
    const claim = await keys.claim('s', 'crashing', keys.fingerprint(1));
    expect(isHeld(claim)).toBe(true);
    // The worker dies: nothing frees or renews the slot. While its time lasts, it is held.
    expect((await keys.acquireConcurrencySlot('s', 'next', { key: 'tenant:solo', limit: 1 }, slotOptions)).acquired).toBe(false);
    await sql`update ${sql.id(env.schema, 'concurrency_slots')} set acquired_until = now() - interval '1 second' where key = 'crashing'`.execute(env.db);
    expect(held(await keys.acquireConcurrencySlot('s', 'next', { key: 'tenant:solo', limit: 1 }, slotOptions)).slot).toBe(slot.slot);
  });

  it("a crashed run's slots of two keys are both held until their time is up, and the key records each", async () => {
    const tenant = { key: 'tenant:crashy', limit: 1 };
    const inAll = { key: 'all-crashy', limit: 1 };
    const groups = [inAll.key, tenant.key];
    const slots = [
      held(await keys.acquireConcurrencySlot('s', 'crashing-2', inAll, { ...slotOptions, groups })),
      held(await keys.acquireConcurrencySlot('s', 'crashing-2', tenant, { ...slotOptions, groups })),
    ];
    expect(isHeld(await keys.claim('s', 'crashing-2', keys.fingerprint(1)))).toBe(true);
    const { rows } = await sql<{ group_key: string; concurrency_limit: number }>`
      select group_key, concurrency_limit from ${sql.id(env.schema, 'key_concurrency_limits')}
       where scope = 's' and key = 'crashing-2' order by group_key`.execute(env.db);
    expect(rows).toEqual([
      { group_key: 'all-crashy', concurrency_limit: 1 },
      { group_key: 'tenant:crashy', concurrency_limit: 1 },
    ]);
    for (const limit of [inAll, tenant]) expect((await keys.acquireConcurrencySlot('s', `next-${limit.key}`, limit, slotOptions)).acquired).toBe(false);
    await sql`update ${sql.id(env.schema, 'concurrency_slots')} set acquired_until = now() - interval '1 second' where key = 'crashing-2'`.execute(env.db);
    expect(held(await keys.acquireConcurrencySlot('s', 'next-all-crashy', inAll, slotOptions)).slot).toBe(slots[0]!.slot);
    expect(held(await keys.acquireConcurrencySlot('s', 'next-tenant:crashy', tenant, slotOptions)).slot).toBe(slots[1]!.slot);
  });

  it("a slot an earlier attempt left behind (its release lost) is not held through the same key's next run", async () => {
    const group = { key: 'tenant:left-behind', limit: 2 };
    // The first attempt's slot, whose release was lost; the retry takes a slot of its own and claims the key.
    const leftBehind = held(await keys.acquireConcurrencySlot('s', 'retried', group, slotOptions));
    held(await keys.acquireConcurrencySlot('s', 'retried', group, slotOptions));
    expect(isHeld(await keys.claim('s', 'retried', keys.fingerprint(1)))).toBe(true);
    // The left-behind slot's time runs out while the retry goes on (its heartbeat renews only its own).
    await sql`update ${sql.id(env.schema, 'concurrency_slots')} set acquired_until = now() - interval '1 second'
               where group_key = ${group.key} and slot = ${leftBehind.slot}`.execute(env.db);
    // One run of the group is going on, under a limit of 2: another job gets the freed slot.
    expect(held(await keys.acquireConcurrencySlot('s', 'other', group, slotOptions)).slot).toBe(leftBehind.slot);
  });

  it('a key whose job now names other concurrency keys keeps records of those only', async () => {
    const records = async () =>
      (await sql<{ group_key: string }>`select group_key from ${sql.id(env.schema, 'key_concurrency_limits')} where scope = 's' and key = 'moving' order by group_key`.execute(env.db)).rows.map(
        (r) => r.group_key,
      );
    await keys.acquireConcurrencySlot('s', 'moving', { key: 'all-moving', limit: 5 }, { ...slotOptions, groups: ['all-moving', 'tenant:old'] });
    await keys.acquireConcurrencySlot('s', 'moving', { key: 'tenant:old', limit: 5 }, { ...slotOptions, groups: ['all-moving', 'tenant:old'] });
    expect(await records()).toEqual(['all-moving', 'tenant:old']);
    await keys.acquireConcurrencySlot('s', 'moving', { key: 'tenant:new', limit: 5 }, slotOptions);
    expect(await records()).toEqual(['tenant:new']);
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

  it('the wire contract reads a list of concurrency limits, and refuses too many, a duplicate key, a bad entry or both forms at once', () => {
    const job = (data: object) => ({ name: 'sync', data: { idempotencyKey: 'k', payload: 1, ...data } });
    const both = [
      { key: 'tenant:acme', limit: 2 },
      { key: 'all-syncs', limit: 10 },
    ];
    expect(identityFromWireContract(job({ concurrencyLimits: both })).concurrency).toEqual(both);
    const entries = (n: number) => Array.from({ length: n }, (_, i) => ({ key: `k${i}`, limit: 1 }));
    expect(identityFromWireContract(job({ concurrencyLimits: entries(4) })).concurrency).toHaveLength(4);
    expect(() => identityFromWireContract(job({ concurrencyLimits: entries(5) }))).toThrow(/1 to 4/);
    expect(() => identityFromWireContract(job({ concurrencyLimits: [] }))).toThrow(/1 to 4/);
    expect(() => identityFromWireContract(job({ concurrencyLimits: { key: 'a', limit: 1 } }))).toThrow(/concurrencyLimits/);
    expect(() => identityFromWireContract(job({ concurrencyLimits: [both[0], { key: 'tenant:acme', limit: 3 }] }))).toThrow(/twice/);
    expect(() => identityFromWireContract(job({ concurrencyLimits: [both[0], { key: 'all-syncs', limit: 0 }] }))).toThrow(/concurrencyLimits\/1\/limit/);
    expect(() => identityFromWireContract(job({ concurrencyLimits: [both[0], { key: '', limit: 1 }] }))).toThrow(/concurrencyLimits\/1\/key/);
    expect(() => identityFromWireContract(job({ concurrencyLimits: [both[0], 'all-syncs'] }))).toThrow(/entry/);
    expect(() => identityFromWireContract(job({ concurrencyLimits: both, concurrencyKey: 'tenant:acme', concurrencyLimit: 2 }))).toThrow(/not both/);
    const refusal = (() => {
      try {
        return identityFromWireContract(job({ concurrencyLimits: entries(5) }));
      } catch (error) {
        return error;
      }
    })();
    expect(refusal).toBeInstanceOf(ValidationError);
    expect(refusal).toMatchObject({ code: 'INVALID_JOB_DATA', field: 'job.data.concurrencyLimits' });

    // The producer side: one limit keeps the pair of fields; several, the list; bad ones are refused before enqueueing.
    expect(toWireJobData('s', 'k', 1, { concurrency: both[0]! })).toMatchObject({ concurrencyKey: 'tenant:acme', concurrencyLimit: 2 });
    expect(toWireJobData('s', 'k', 1, { concurrency: [both[0]!] })).toMatchObject({ concurrencyKey: 'tenant:acme', concurrencyLimit: 2 });
    expect(toWireJobData('s', 'k', 1, { concurrency: both })).toEqual({ idempotencyKey: 'k', scope: 's', payload: 1, concurrencyLimits: both });
    expect(() => toWireJobData('s', 'k', 1, { concurrency: [both[0]!, both[0]!] })).toThrow(/twice/);
    expect(() => toWireJobData('s', 'k', 1, { concurrency: entries(5) })).toThrow(/1 to 4/);
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

  it('a tenant limit and an in-all limit both hold: three tenants of two slots each, at most three jobs in all, each runs once', { timeout: 60_000 }, async () => {
    const queue = new Queue('limited-two', { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
    queues.push(queue);
    const stops: Array<() => void> = [];
    const runningByTenant = new Map<string, number>();
    const mostByTenant = new Map<string, number>();
    let running = 0;
    let most = 0;
    const events: WorkerEvent[] = [];
    for (const name of ['w1', 'w2']) {
      const worker = createIdempotentWorker<{ tenant: string }>({
        queue: 'limited-two',
        connection: { url: env.redisUrl },
        prefix: env.redisPrefix,
        keys,
        concurrency: 6,
        deferMaxMs: 200,
        deferMinMs: 20,
        logger: pino({ level: 'silent' }),
        handler: async (ctx) => {
          const { tenant } = ctx.data;
          running++;
          most = Math.max(most, running);
          runningByTenant.set(tenant, (runningByTenant.get(tenant) ?? 0) + 1);
          mostByTenant.set(tenant, Math.max(mostByTenant.get(tenant) ?? 0, runningByTenant.get(tenant)!));
          try {
            await new Promise((resolve) => setTimeout(resolve, 100));
            return await ctx.transaction(async (tx) => {
              await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${name})`.execute(tx);
              return tenant;
            });
          } finally {
            running--;
            runningByTenant.set(tenant, runningByTenant.get(tenant)! - 1);
          }
        },
      });
      worker.on('event', (event: WorkerEvent) => events.push(event));
      stops.push(instrumentWorker(worker, 'limited-two'));
      workers.push(worker);
    }
    const tenants = ['acme', 'globex', 'initech'];
    const ids = Array.from({ length: 18 }, (_, n) => `two-${n}`);
    await queue.addBulk(
      ids.map((id, n) => {
        const tenant = tenants[n % 3]!;
        const concurrencyLimits = [
          { key: `tenant:${tenant}`, limit: 2 },
          { key: 'all-syncs', limit: 3 },
        ];
        return { name: 'sync', data: { idempotencyKey: id, scope: 'l2', payload: { tenant }, concurrencyLimits }, opts: { jobId: id, attempts: 1 } };
      }),
    );
    for (const id of ids) await waitForJobState(queue, id, ['completed'], 50_000);
    expect(most).toBeLessThanOrEqual(3);
    // Three in all at most, but more than one tenant's two: the in-all limit is the one that bound.
    expect(most).toBe(3);
    for (const tenant of tenants) expect(mostByTenant.get(tenant)).toBeLessThanOrEqual(2);
    for (const id of ids) expect(await effectsOf(env.db, env.schema, 'l2', id)).toHaveLength(1);
    const refusedBy = new Set(events.filter((e) => e.kind === 'concurrency-limited').map((e) => e.concurrencyKey));
    expect(refusedBy.has('all-syncs')).toBe(true);
    // Nothing held once the drain is over: a slot a worker kept for its next job is freed within about 50 ms.
    for (const group of ['all-syncs', ...tenants.map((t) => `tenant:${t}`)]) {
      await waitFor(`no slot of ${group} held`, async () => (await concurrencyGroupCounts(env.db, env.schema, group)).running === 0, 2_000);
    }
    // Each deferral is counted under the group of the key that refused it.
    const metric = await register.getSingleMetric('idempotent_jobs_concurrency_limited_total')!.get();
    const series = metric.values.filter((v) => v.labels.queue === 'limited-two');
    expect(series.map((v) => v.labels.group)).toContain('all-syncs');
    for (const group of series.map((v) => v.labels.group)) expect(['all-syncs', 'tenant']).toContain(group);
    expect(series.reduce((sum, v) => sum + v.value, 0)).toBe(events.filter((e) => e.kind === 'concurrency-limited').length);
    for (const stop of stops) stop();
  });

  it('a job that gets its first slot but not the second frees the first before it is deferred, and runs once the second frees', { timeout: 60_000 }, async () => {
    const queue = new Queue('limited-partial', { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
    queues.push(queue);
    const events: WorkerEvent[] = [];
    const worker = createIdempotentWorker<{ n: number }>({
      queue: 'limited-partial',
      connection: { url: env.redisUrl },
      prefix: env.redisPrefix,
      keys,
      concurrency: 2,
      // Deferred for a while, so the slots can be looked at before the job asks again.
      deferMinMs: 1_500,
      deferMaxMs: 1_500,
      logger: pino({ level: 'silent' }),
      handler: async (ctx) => ctx.data.n,
    });
    worker.on('event', (event: WorkerEvent) => events.push(event));
    workers.push(worker);
    // Another job holds the one slot of the later key ("z-all" sorts after "a-tenant").
    const holder = held(await keys.acquireConcurrencySlot('s', 'holder', { key: 'z-all', limit: 1 }, slotOptions));
    const concurrencyLimits = [
      { key: 'z-all', limit: 1 },
      { key: 'a-tenant', limit: 1 },
    ];
    await queue.add('sync', { idempotencyKey: 'partial', scope: 'p', payload: { n: 7 }, concurrencyLimits }, { jobId: 'partial', attempts: 1 });
    await waitFor('the job to be deferred by the limit', async () => events.some((e) => e.kind === 'concurrency-limited'));
    expect(events.find((e) => e.kind === 'concurrency-limited')).toMatchObject({ key: 'partial', concurrencyKey: 'z-all' });
    // The first key's slot was taken and given back: nothing held, nobody waiting there.
    expect(await concurrencyGroupCounts(env.db, env.schema, 'a-tenant')).toEqual({ running: 0, waiting: 0 });
    expect(await concurrencyGroupCounts(env.db, env.schema, 'z-all')).toEqual({ running: 1, waiting: 1 });
    expect(await keys.get('p', 'partial')).toBeUndefined();
    await keys.releaseConcurrencySlot('s', 'holder', holder);
    const { job } = await waitForJobState(queue, 'partial', ['completed'], 30_000);
    expect(job.returnvalue).toBe(7);
    expect(job.attemptsMade).toBeLessThanOrEqual(1);
  });
});

