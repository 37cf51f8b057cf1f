// @module-tag redis
/**
 * Concurrency slots held by a run's transaction (the fast path with `concurrencySlotReuseMs: 0`,
 * alone or in a group's shared transaction): no slot row and no commit of their own, counted against the same limit as slot rows, freed when the transaction
 * ends however it ends (its connection killed too), and the waiters they hold back woken then.
 *
 * Invariants attacked: at most `limit` runs of a key at once, whichever kind of holder (a
 * transaction's lock, a row of the leased path), and in one group's transaction, whose session's
 * locks are re-entrant; a refused job uses no attempt and runs once,
 * later; a slot never outlives its transaction; the keys' waiters are woken when it ends; a job
 * that waited is no longer a waiter once it runs; keys whose 32-bit hashes collide do not share
 * slots; a late renewal of a slot row cannot take back a slot a transaction holds; a schema not
 * yet migrated costs the jobs nothing but the rows.
 */
import { sql } from 'kysely';
import { afterAll, afterEach, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { IdempotencyKeys, KeySettledListener, createPostgresDb, type IdempotentWorkerOptions, type WorkerEvent } from '../src/index.js';
import { concurrencyGroupCounts } from '../src/store/sql/concurrency-slots.js';
import { concurrencySlotsInTransactionDdl } from '../src/store/sql/concurrency-slots-in-transaction.js';
import { createEffectsTable, createGate, effectsOf } from './support/protocol-fixtures.js';
import { sleep, waitFor, waitForJobState } from './support/queue-helpers.js';
import { LimitedJobs } from './support/limited-jobs.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let listener: KeySettledListener;
let keys: IdempotencyKeys;
let jobs: LimitedJobs;
/** A refused job comes back on its own only after this: a run within it was woken. */
const DEFERRAL_MS = 20_000;

beforeAll(async () => {
  env = await createTestEnv('concurrency-slots-in-transaction');
  jobs = new LimitedJobs(env);
  await createEffectsTable(env.db, env.schema);
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000 });
  listener = new KeySettledListener({ connectionString: env.databaseDirectUrl, schema: env.schema });
  await listener.connect();
});
afterEach(() => jobs.closeAll());
afterAll(async () => {
  await listener?.close();
  await env?.teardown();
});

/** Slots held by a transaction are the fast path's with `concurrencySlotReuseMs: 0` (kept slot rows otherwise: concurrency-slot-pool.test.ts). */
function startWorker<P>(queue: string, options: Partial<IdempotentWorkerOptions<P, unknown>> & Pick<IdempotentWorkerOptions<P, unknown>, 'handler'>) {
  return jobs.startWorker<P>(queue, { keys, listener, deferMinMs: DEFERRAL_MS, deferMaxMs: DEFERRAL_MS, deferJitterRatio: 0, concurrencySlotReuseMs: 0, ...options });
}

const addJobs = (queueName: string, scope: string, count: number, limit: { key: string; limit: number }) => jobs.addJobs(queueName, scope, count, limit);
const insertEffect = (tx: any, scope: string, key: string, fence: number) => jobs.insertEffect(tx, scope, key, fence);

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

/** Holds slots of `limits` by an open transaction of the test's own until `release()`; `taken` says whether it got them. */
async function holdByTransaction(scope: string, key: string, limits: Array<{ key: string; limit: number }>) {
  const gate = createGate();
  let answered!: (refused: string | undefined) => void;
  const taken = new Promise<string | undefined>((resolve) => (answered = resolve));
  const done = env.db.transaction().execute(async (tx) => {
    const answer = await keys.takeConcurrencySlotsInTransaction(tx, scope, key, limits, { starvationMs: 30_000 });
    answered(answer.refusedGroup);
    await gate.wait;
  });
  return { refusedGroup: await taken, release: async () => (gate.open(), await done) };
}

describe('its edges', () => {
  it('a job that waited and now runs is no longer a waiter while it runs (its row is not held back uncommitted in its transaction)', { timeout: 60_000 }, async () => {
    const waiters = sql.id(env.schema, 'concurrency_waiters');
    const countWaiters = async () => (await sql<{ n: number }>`select count(*)::int as n from ${waiters} where group_key = 'tenant:was-waiting'`.execute(env.db)).rows[0]!.n;
    // Recorded as a waiter an hour ago, seen just now: a starving waiter while its row stands.
    await sql`insert into ${waiters} (group_key, scope, key, since, seen_at) values ('tenant:was-waiting', 'waited', 'waited-0', now() - interval '1 hour', now())`.execute(env.db);
    const gate = createGate();
    let running = false;
    startWorker<{ n: number }>('in-tx-waited', {
      handler: {
        transaction: async (tx, ctx) => {
          running = true;
          await gate.wait;
          await insertEffect(tx, ctx.scope, ctx.key, ctx.fence);
          return ctx.data.n;
        },
      },
    });
    const { queue, ids } = await addJobs('in-tx-waited', 'waited', 1, { key: 'tenant:was-waiting', limit: 2 });
    try {
      await waitFor('the job to run', async () => (running ? true : undefined));
      await waitFor('its waiter row to be gone while it runs', async () => ((await countWaiters()) === 0 ? true : undefined), 5_000);
      // So another job of the key takes the second slot, not refused by a starving waiter that is running.
      const other = await keys.acquireConcurrencySlot('w', 'other', { key: 'tenant:was-waiting', limit: 2 }, { starvationMs: 30_000, leaseMs: 30_000 });
      expect(other.acquired).toBe(true);
      if (other.acquired) await keys.releaseConcurrencySlot('w', 'other', other);
    } finally {
      gate.open();
    }
    await waitForJobState(queue, ids[0]!, ['completed'], 30_000);
    expect(await effectsOf(env.db, env.schema, 'waited', ids[0]!)).toHaveLength(1);
  });

  it('jobs that waited, as many as the pool has connections, all run: forgetting them as waiters does not wait for a connection inside their transactions', { timeout: 60_000 }, async () => {
    // A pool of 2 and 4 jobs at once, each a waiter of its key: had each transaction waited for a
    // second connection to forget its waiter row, the two holding the pool would wait for ever.
    const smallDb = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 2, applicationName: 'in-tx-small-pool' });
    onTestFinished(() => smallDb.destroy());
    const smallKeys = new IdempotencyKeys({ db: smallDb, schema: env.schema, leaseMs: 30_000 });
    const waiters = sql.id(env.schema, 'concurrency_waiters');
    for (let n = 0; n < 4; n++) {
      await sql`insert into ${waiters} (group_key, scope, key, since, seen_at) values ('tenant:small-pool', 'small', ${`small-${n}`}, now() - interval '1 second', now())`.execute(env.db);
    }
    startWorker<{ n: number }>('in-tx-small-pool', {
      keys: smallKeys,
      concurrency: 4,
      handler: { transaction: (tx, ctx) => sleep(100).then(() => insertEffect(tx, ctx.scope, ctx.key, ctx.fence)).then(() => ctx.data.n) },
    });
    const { queue, ids } = await addJobs('in-tx-small-pool', 'small', 4, { key: 'tenant:small-pool', limit: 10 });
    for (const id of ids) {
      await waitForJobState(queue, id, ['completed'], 20_000);
      expect(await effectsOf(env.db, env.schema, 'small', id)).toHaveLength(1);
    }
    const left = await sql<{ n: number }>`select count(*)::int as n from ${waiters} where group_key = 'tenant:small-pool'`.execute(env.db);
    expect(left.rows[0]!.n).toBe(0);
  });

  it('jobs of one key in one group share its transaction and take distinct slots: never more than the limit at once; those refused leave the group, deferred, and run once', { timeout: 60_000 }, async () => {
    let running = 0;
    let most = 0;
    const txids = new Map<string, string>();
    startWorker<{ n: number }>('in-group', {
      handler: {
        transaction: async (tx, ctx) => {
          most = Math.max(most, ++running);
          try {
            await sleep(300);
            const { rows } = await sql<{ t: string }>`
              insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, 'w')
              returning txid_current()::text as t`.execute(tx);
            txids.set(ctx.key, rows[0]!.t);
            return ctx.data.n;
          } finally {
            running--;
          }
        },
      },
    });
    const { queue, ids } = await addJobs('in-group', 'grouped', 6, { key: 'tenant:grouped', limit: 3 });
    for (const id of ids) {
      const { job } = await waitForJobState(queue, id, ['completed'], 40_000);
      expect(job.attemptsMade).toBeLessThanOrEqual(1);
      expect(await effectsOf(env.db, env.schema, 'grouped', id)).toHaveLength(1);
    }
    expect(most).toBeLessThanOrEqual(3);
    // Some of them committed together: they held their slots by one transaction.
    const perTransaction = [...txids.values()].reduce((counts, t) => counts.set(t, (counts.get(t) ?? 0) + 1), new Map<string, number>());
    expect(Math.max(...perTransaction.values())).toBeGreaterThan(1);
    expect(await concurrencyGroupCounts(env.db, env.schema, 'tenant:grouped')).toEqual({ running: 0, waiting: 0 });
  });

  it('the wakes of runs that end together go as one statement and wake as many waiters of a key as runs freed its slots', async () => {
    const waiters = sql.id(env.schema, 'concurrency_waiters');
    for (let n = 0; n < 4; n++) {
      await sql`insert into ${waiters} (group_key, scope, key, since, seen_at, job_id, queue)
        values ('tenant:woken-together', 'woken', ${`woken-${n}`}, now() - (${4 - n} * interval '1 second'), now(), ${`job-${n}`}, 'in-tx-woken')`.execute(env.db);
    }
    const woken = await Promise.all([0, 1, 2].map(() => keys.wakeConcurrencyWaiters('woken', 'any', ['tenant:woken-together'])));
    // One statement for the three, its count told to each.
    expect(woken).toEqual([3, 3, 3]);
    const { rows } = await sql<{ key: string }>`select key from ${waiters} where group_key = 'tenant:woken-together' and woken_at is not null order by key`.execute(env.db);
    expect(rows.map((row) => row.key)).toEqual(['woken-0', 'woken-1', 'woken-2']);
  });

  it('a take refused by a later key gives back the slots of the keys before it: the transaction it shares (a group\'s) goes on without them', async () => {
    const holder = await holdByTransaction('m', 'holder', [{ key: 'tenant:multi-b', limit: 1 }]);
    try {
      expect(holder.refusedGroup).toBeUndefined();
      await env.db.transaction().execute(async (tx) => {
        const answer = await keys.takeConcurrencySlotsInTransaction(tx, 'm', 'refused', [{ key: 'tenant:multi-a', limit: 1 }, { key: 'tenant:multi-b', limit: 1 }], { starvationMs: 30_000 });
        expect(answer.refusedGroup).toBe('tenant:multi-b');
        // Still in that transaction: the first key's slot is free for another taker, and for a later take of this one.
        const other = await keys.acquireConcurrencySlot('m', 'other', { key: 'tenant:multi-a', limit: 1 }, { starvationMs: 30_000, leaseMs: 30_000 });
        expect(other.acquired).toBe(true);
        if (other.acquired) await keys.releaseConcurrencySlot('m', 'other', other);
        const held = await sql<{ held: string | null }>`select nullif(current_setting('idempotent_jobs.concurrency_slots_held', true), '') as held`.execute(tx);
        expect(held.rows[0]!.held).toBeNull();
      });
    } finally {
      await holder.release();
    }
  });

  it('a take walks the slots from one drawn at random, not from slot 0 up through the locks of the slots in use', async () => {
    const taken = new Set<number>();
    for (let i = 0; i < 12; i++) {
      const slot = await keys.acquireConcurrencySlot('r', `random-${i}`, { key: 'tenant:random-walk', limit: 64 }, { starvationMs: 30_000, leaseMs: 30_000 });
      if (!slot.acquired) throw new Error('a key with every slot free refused a take');
      taken.add(slot.slot);
      await keys.releaseConcurrencySlot('r', `random-${i}`, slot);
    }
    // From slot 0 up, each take, its slot freed before the next, took slot 0.
    expect(taken.size).toBeGreaterThan(1);
  });

  it('the walk from a random slot passes the held slots in order, wrapping round: it never takes a held slot, and finds every free one', async () => {
    const group = { key: 'tenant:walk-wrap', limit: 8 };
    const options = { starvationMs: 30_000, leaseMs: 30_000 };
    const all = [];
    for (let i = 0; i < group.limit; i++) {
      const slot = await keys.acquireConcurrencySlot('w', `hold-${i}`, group, options);
      if (!slot.acquired) throw new Error('a key with free slots refused a take');
      all.push({ key: `hold-${i}`, slot });
    }
    const free = new Set([0, 3, 4, 7]);
    const held = all.filter(({ slot }) => !free.has(slot.slot));
    for (const { key, slot } of all.filter(({ slot }) => free.has(slot.slot))) await keys.releaseConcurrencySlot('w', key, slot);
    try {
      const taken = new Set<number>();
      for (let i = 0; i < 60; i++) {
        const slot = await keys.acquireConcurrencySlot('w', `walker-${i}`, group, options);
        if (!slot.acquired) throw new Error('refused with four slots free');
        taken.add(slot.slot);
        await keys.releaseConcurrencySlot('w', `walker-${i}`, slot);
      }
      expect([...taken].sort()).toEqual([0, 3, 4, 7]);
    } finally {
      for (const { key, slot } of held) await keys.releaseConcurrencySlot('w', key, slot);
    }
  });

  it('two concurrency keys whose 32-bit hashes collide do not hold each other\'s slots', async () => {
    // hashtext('idempotent_jobs.concurrency:tenant:114062') = hashtext('…:tenant:294826'): found
    // by grouping hashtext over 400,000 such keys. A slot's lock key is 64 bits, of the key and the slot.
    const holder = await holdByTransaction('c', 'first', [{ key: 'tenant:114062', limit: 1 }]);
    try {
      expect(holder.refusedGroup).toBeUndefined();
      const other = await holdByTransaction('c', 'second', [{ key: 'tenant:294826', limit: 1 }]);
      expect(other.refusedGroup).toBeUndefined();
      await other.release();
      const row = await keys.acquireConcurrencySlot('c', 'third', { key: 'tenant:294826', limit: 1 }, { starvationMs: 30_000, leaseMs: 30_000 });
      expect(row.acquired).toBe(true);
      if (row.acquired) await keys.releaseConcurrencySlot('c', 'third', row);
    } finally {
      await holder.release();
    }
  });

  it('a refusal by a slot a transaction holds asks again within a second, even beside a slot row whose time ran out', async () => {
    const slots = sql.id(env.schema, 'concurrency_slots');
    // A dead run's row in slot 0 (its time ran out): the transaction takes slot 0 over, leaving the row.
    await sql`insert into ${slots} (group_key, slot, owner, scope, key, acquired_until) values ('tenant:expired', 0, gen_random_uuid(), 'e', 'dead', now() - interval '1 minute')`.execute(env.db);
    const holder = await holdByTransaction('e', 'holder', [{ key: 'tenant:expired', limit: 1 }]);
    try {
      expect(holder.refusedGroup).toBeUndefined();
      const refused = await keys.acquireConcurrencySlot('e', 'refused', { key: 'tenant:expired', limit: 1 }, { starvationMs: 30_000, leaseMs: 30_000 });
      expect(refused.acquired).toBe(false);
      if (refused.acquired) throw new Error('unreachable');
      // Not 1 ms (the dead row's time, long past), which would have the waiter ask again at once, over and over.
      expect(refused.retryAfterMs).toBeGreaterThanOrEqual(500);
      expect(refused.retryAfterMs).toBeLessThanOrEqual(1_000);
    } finally {
      await holder.release();
    }
  });

  it('a late renewal of a slot row whose time ran out is refused while a transaction holds that slot', async () => {
    const slots = sql.id(env.schema, 'concurrency_slots');
    const owner = '00000000-0000-4000-8000-00000000abcd';
    await sql`insert into ${slots} (group_key, slot, owner, scope, key, acquired_until) values ('tenant:late', 0, ${owner}::uuid, 'l', 'paused', now() - interval '1 second')`.execute(env.db);
    const holder = await holdByTransaction('l', 'holder', [{ key: 'tenant:late', limit: 1 }]);
    try {
      expect(holder.refusedGroup).toBeUndefined();
      // The paused run wakes and renews: the slot is another run's now.
      expect(await keys.renewConcurrencySlots('l', 'paused', [{ acquired: true, group: 'tenant:late', slot: 0, owner }], 30_000)).toBe(0);
    } finally {
      await holder.release();
    }
    // Nobody in it: the late renewal is taken, as before.
    expect(await keys.renewConcurrencySlots('l', 'paused', [{ acquired: true, group: 'tenant:late', slot: 0, owner }], 30_000)).toBe(1);
  });

  it('on a schema without migration 034 (a worker started with MIGRATE=false), jobs take slot rows: each commits once, no attempt used', { timeout: 60_000 }, async () => {
    await sql`drop function ${sql.id(env.schema, 'take_concurrency_slots_in_shared_transaction')}(text[], int[], text, text, int)`.execute(env.db);
    onTestFinished(() => concurrencySlotsInTransactionDdl(env.schema, { sharedTransaction: true }).execute(env.db).then(() => undefined));
    const worker = startWorker<{ n: number }>('in-tx-unmigrated', {
      handler: { transaction: (tx, ctx) => insertEffect(tx, ctx.scope, ctx.key, ctx.fence).then(() => ctx.data.n) },
    });
    const { queue, ids } = await addJobs('in-tx-unmigrated', 'unmigrated', 3, { key: 'tenant:unmigrated', limit: 1 });
    for (const id of ids) {
      const { job } = await waitForJobState(queue, id, ['completed'], 30_000);
      expect(job.attemptsMade).toBeLessThanOrEqual(1);
      expect(await effectsOf(env.db, env.schema, 'unmigrated', id)).toHaveLength(1);
    }
    await worker.close();
  });
});
