// @module-tag redis
/**
 * Concurrency slots kept between fast-path runs of a key (`ConcurrencySlotPool`,
 * `concurrencySlotReuseMs`), on real Postgres and Redis.
 *
 * Invariants attacked: a kept slot is lent to one run at a time, so at most `limit` runs of a
 * key at once across workers that keep slots and workers that do not; a slot is lent only within
 * `reuseMs` of its take and while its time was confirmed within half a heartbeat, and is freed
 * when its run ends past that, when it sits idle, when its key's take was refused on this worker,
 * when it was lost, and when the consumer closes; a job deferred or delivered before (maybe a
 * waiter) takes its slot from the database, which forgets it as a waiter; a lent slot is told
 * under the run in it; a run's listener on the slot's shared signal is removed when it ends.
 */
import { getEventListeners } from 'node:events';
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it, vi } from 'vitest';
import { IdempotencyKeys, KeyedJobRunner, createIdempotentWorker, resolveWorkerTiming, type ConcurrencySlot, type IdempotentWorker, type JobIdentity } from '../src/index.js';
import { ConcurrencySlotPool, HeldSlot } from '../src/consumer/concurrency-slot-pool.js';
import { JobLogger } from '../src/consumer/job-logger.js';
import { identityFromWireContract } from '../src/consumer/wire-contract.js';
import { PostgresKeyStore, type KeyStore } from '../src/store/index.js';
import { findLostKeyCandidates } from '../src/store/sql/find-lost-keys.js';
import { createEffectsTable, effectsOf } from './support/protocol-fixtures.js';
import { sleep, waitFor } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const SCOPE = 'slot-pool';
const silent = pino({ level: 'silent' });
const holder = (key: string) => ({ scope: SCOPE, key, log: new JobLogger(silent, {}) });

let env: TestEnv;
let keys: IdempotencyKeys;
const workers: IdempotentWorker<any, any>[] = [];
const queues: Queue[] = [];

beforeAll(async () => {
  env = await createTestEnv('concurrency-slot-pool');
  await createEffectsTable(env.db, env.schema);
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000 });
});
beforeEach(async () => {
  await sql`truncate ${sql.id(env.schema, 'concurrency_slots')}, ${sql.id(env.schema, 'concurrency_waiters')}, ${sql.id(env.schema, 'key_concurrency_limits')}`.execute(env.db);
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.close({ force: true })));
  await Promise.all(queues.splice(0).map((q) => q.close()));
});
afterAll(async () => {
  await env?.teardown();
});

const slotRows = async (group: string) =>
  (
    await sql<{ slot: number; owner: string }>`select slot, owner::text from ${sql.id(env.schema, 'concurrency_slots')}
      where group_key = ${group} and acquired_until > now() order by slot`.execute(env.db)
  ).rows;

/** Keys whose run took its slot from the database (each take records its key for the sweeper). */
const takers = async (group: string) =>
  (await sql<{ key: string }>`select key from ${sql.id(env.schema, 'key_concurrency_limits')} where group_key = ${group} order by key`.execute(env.db)).rows.map((r) => r.key);

/** A slot of `limit` taken from the database for `key`, with its heartbeat. */
async function take(limit: { key: string; limit: number }, key: string, timing = { leaseMs: 30_000, heartbeatMs: 10_000 }, from = keys): Promise<HeldSlot> {
  const sentAt = performance.now();
  const answer = await from.acquireConcurrencySlot(SCOPE, key, limit, { leaseMs: timing.leaseMs, starvationMs: 60_000 });
  if (!answer.acquired) throw new Error('expected a slot');
  return new HeldSlot(from, answer as ConcurrencySlot, limit.limit, holder(key), sentAt, timing);
}

const pools: ConcurrencySlotPool[] = [];
afterEach(async () => {
  await Promise.all(pools.splice(0).map((pool) => pool.close()));
});
function pool(options: { reuseMs?: number; idleMs?: number; heartbeatMs?: number; from?: IdempotencyKeys; log?: JobLogger } = {}) {
  const made = new ConcurrencySlotPool({
    keys: options.from ?? keys,
    reuseMs: options.reuseMs ?? 60_000,
    idleMs: options.idleMs ?? 60_000,
    heartbeatMs: options.heartbeatMs ?? 10_000,
    log: options.log ?? new JobLogger(silent, {}),
  });
  pools.push(made);
  return made;
}

describe('the pool', () => {
  it('lends a slot given back to the next run of the same key and limit, once, and its row stays held; another key or limit is not lent it', async () => {
    const group = { key: 'tenant:lend', limit: 3 };
    const kept = pool();
    const slot = await take(group, 'first');
    expect(kept.giveBack(slot)).toBeUndefined();
    expect(kept.lend({ key: group.key, limit: 4 }, holder('other-limit'))).toBeUndefined();
    expect(kept.lend({ key: 'tenant:other', limit: 3 }, holder('other-key'))).toBeUndefined();
    const lent = kept.lend(group, holder('second'));
    expect(lent).toBe(slot);
    expect(lent!.holder.key).toBe('second');
    // Lent once: the next run of the key takes a slot of its own.
    expect(kept.lend(group, holder('third'))).toBeUndefined();
    expect(await slotRows(group.key)).toEqual([{ slot: slot.slot.slot, owner: slot.slot.owner }]);
    await lent!.free(keys);
    expect(await slotRows(group.key)).toEqual([]);
  });

  it('frees a slot given back past reuseMs from its take, and never lends it', async () => {
    const group = { key: 'tenant:reuse-over', limit: 2 };
    const kept = pool({ reuseMs: 100 });
    const slot = await take(group, 'first');
    await sleep(150);
    await kept.giveBack(slot);
    expect(kept.lend(group, holder('second'))).toBeUndefined();
    expect(await slotRows(group.key)).toEqual([]);
  });

  it('frees a slot that sits idle for idleMs, and one whose reuse ends while it is idle', async () => {
    const group = { key: 'tenant:idle', limit: 2 };
    const idle = pool({ idleMs: 50 });
    idle.giveBack(await take(group, 'idle'));
    await waitFor('the slot freed', async () => (await slotRows(group.key)).length === 0, 10_000);
    const other = { key: 'tenant:idle-reuse', limit: 2 };
    const reuse = pool({ reuseMs: 200, idleMs: 150 });
    reuse.giveBack(await take(other, 'reused'));
    await waitFor('the slot freed', async () => (await slotRows(other.key)).length === 0, 10_000);
  });

  it('a key whose take was refused here gets nothing lent: its kept slots are freed at once, and those given back after, for reuseMs', async () => {
    const group = { key: 'tenant:contended', limit: 3 };
    const kept = pool({ reuseMs: 300 });
    const [a, b] = [await take(group, 'a'), await take(group, 'b')];
    kept.giveBack(a);
    kept.contended(group.key);
    await waitFor('the kept slot freed', async () => (await slotRows(group.key)).length === 1, 10_000);
    expect(kept.lend(group, holder('c'))).toBeUndefined();
    await kept.giveBack(b);
    expect(await slotRows(group.key)).toEqual([]);
    // Once reuseMs has passed, its slots are kept again.
    await sleep(350);
    const later = await take(group, 'd');
    expect(kept.giveBack(later)).toBeUndefined();
    expect(kept.lend(group, holder('e'))).toBe(later);
    await later.free(keys);
  });

  it('closing frees every kept slot, and every slot given back after', async () => {
    const group = { key: 'tenant:closing', limit: 3 };
    const kept = pool();
    const [a, b] = [await take(group, 'a'), await take(group, 'b')];
    kept.giveBack(a);
    await kept.close();
    expect(await slotRows(group.key)).toHaveLength(1);
    await kept.giveBack(b);
    expect(await slotRows(group.key)).toEqual([]);
  });

  it('a slot another run took (its time ran out) is lost: its signal aborts, and it is freed, not lent', async () => {
    const group = { key: 'tenant:lost', limit: 1 };
    const kept = pool({ heartbeatMs: 50 });
    const slot = await take(group, 'first', { leaseMs: 150, heartbeatMs: 50 });
    kept.giveBack(slot);
    // Another run takes the slot over (its time ran out in the database): the next renewal finds it gone.
    await sql`update ${sql.id(env.schema, 'concurrency_slots')} set owner = gen_random_uuid() where group_key = ${group.key}`.execute(env.db);
    await waitFor('the slot lost', async () => slot.lost.aborted, 10_000);
    expect((slot.lost.reason as Error).name).toBe('ConcurrencySlotLostError');
    expect(kept.lend(group, holder('second'))).toBeUndefined();
  });

  it('lends a slot only while half a heartbeat has not passed since its time was confirmed (its renewals hang)', async () => {
    const store = new PostgresKeyStore(env.db, env.schema);
    const hanging = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 2_000 }, hangingRenewals(store));
    const group = { key: 'tenant:unconfirmed', limit: 2 };
    const kept = pool({ heartbeatMs: 200, from: hanging });
    const slot = await take(group, 'first', { leaseMs: 2_000, heartbeatMs: 200 }, hanging);
    kept.giveBack(slot);
    expect(kept.lend(group, holder('soon'))).toBe(slot);
    kept.giveBack(slot);
    await sleep(150);
    // 150 ms since the take, and the renewal at 200 ms will hang: past half a heartbeat, not lent.
    expect(kept.lend(group, holder('late'))).toBeUndefined();
    await waitFor('the slot freed', async () => (await slotRows(group.key)).length === 0, 10_000);
  });
});

/** The store, with every slot renewal never answering: a Postgres that stopped answering them. */
function hangingRenewals(store: KeyStore): KeyStore {
  return new Proxy(store, {
    get(target, property) {
      const value = Reflect.get(target, property, target) as unknown;
      if (property === 'renewSlots') return () => new Promise(() => {});
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
}

interface Message {
  readonly id: string;
  readonly data: unknown;
}

/** A delivery of `key`'s job naming `group`'s concurrency key; a first one unless `more` says otherwise. */
function deliveryOf(group: { key: string; limit: number }, key: string, more: { deferrals?: number; deliveryCount?: number } = {}) {
  return {
    message: { id: key, data: { idempotencyKey: key, scope: SCOPE, payload: { key }, concurrencyKey: group.key, concurrencyLimit: group.limit } },
    id: key,
    label: `Job ${key}`,
    queue: 'q',
    name: 'job',
    lastAttempt: false,
    deferrals: more.deferrals ?? 0,
    ...(more.deliveryCount !== undefined && { deliveryCount: more.deliveryCount }),
  };
}

describe('contended keys', () => {
  it('a take tells whether another key of the group waits (not the taker itself, not one gone for twice the bound)', async () => {
    const group = { key: 'tenant:tells', limit: 3 };
    const waiter = (key: string, seenAgo: string) => sql`insert into ${sql.id(env.schema, 'concurrency_waiters')} (group_key, scope, key, since, seen_at)
      values (${group.key}, ${SCOPE}, ${key}, now() - interval '1 second', now() - ${seenAgo}::interval)`.execute(env.db);
    const options = { leaseMs: 30_000, starvationMs: 60_000 };
    const first = await keys.acquireConcurrencySlot(SCOPE, 'alone', group, options);
    expect(first).toMatchObject({ acquired: true, othersWaiting: false });
    await waiter('itself', '0 seconds');
    expect(await keys.acquireConcurrencySlot(SCOPE, 'itself', group, options)).toMatchObject({ acquired: true, othersWaiting: false });
    await waiter('long-gone', '3 minutes');
    expect(await keys.acquireConcurrencySlot(SCOPE, 'after-gone', group, options)).toMatchObject({ acquired: true, othersWaiting: false });
    await waiter('patient', '1 second');
    expect(await keys.acquireConcurrencySlot(SCOPE, 'newcomer', { ...group, limit: 5 }, options)).toMatchObject({ acquired: true, othersWaiting: true });
  });

  it('a worker whose keys are all contended remembers no more of them than it must (no slot kept, no sweep)', async () => {
    const kept = pool({ reuseMs: 1 });
    for (let n = 0; n < 1_000; n++) {
      kept.contended(`tenant:${n}`);
      if (n % 100 === 0) await sleep(2);
    }
    expect(kept.contendedKeys).toBeLessThanOrEqual(200);
  });

  it("a kept slot's loss while no run is in it is told in the worker's log, not in the last run's", async () => {
    const lines: Array<Record<string, unknown>> = [];
    const capture = (name: string) => pino({ level: 'warn' }, { write: (line: string) => lines.push({ ...JSON.parse(line), logger: name }) });
    const kept = pool({ heartbeatMs: 50, log: new JobLogger(capture('worker'), {}) });
    const group = { key: 'tenant:idle-loss', limit: 1 };
    const slot = await take(group, 'first', { leaseMs: 150, heartbeatMs: 50 });
    kept.giveBack(slot);
    const lent = kept.lend(group, { scope: SCOPE, key: 'second', log: new JobLogger(capture('second'), { key: 'second' }) });
    expect(lent).toBe(slot);
    kept.giveBack(slot);
    await sql`update ${sql.id(env.schema, 'concurrency_slots')} set owner = gen_random_uuid() where group_key = ${group.key}`.execute(env.db);
    await waitFor('the slot lost', async () => slot.lost.aborted, 10_000);
    const lost = lines.filter((line) => line.outcome === 'concurrency-slot-lost');
    expect(lost.map((line) => line.logger)).toEqual(['worker']);
  });
});

describe('a runner that keeps slots', () => {
  // The pool frees a slot no run has held for 50 ms, by a setInterval sweep: on a loaded machine
  // two runs one after the other can be further apart than that, and the second would take a slot
  // of its own. The sweep held off here (closing frees the kept slots without it), so that what
  // these tests count is the lending, not the machine's speed.
  beforeEach(() => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
  });
  afterEach(() => {
    vi.useRealTimers();
  });
  const group = { key: 'tenant:runner', limit: 4 };
  const delivery = (key: string, more: { deferrals?: number; deliveryCount?: number } = {}) => deliveryOf(group, key, more);
  const runner = (reuseMs = 60_000) =>
    new KeyedJobRunner<unknown, unknown, Message>({
      keys,
      timing: resolveWorkerTiming({ concurrencySlotReuseMs: reuseMs }, 30_000),
      identityOf: (message) => identityFromWireContract({ id: message.id, name: 'job', data: message.data }) as JobIdentity<unknown>,
      handler: {
        transaction: async (tx, ctx) => {
          await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, 1, 'w')`.execute(tx);
          return null;
        },
      },
      logger: silent,
    });

  it('runs one job after another in one slot row, taken once; a job deferred or delivered before takes its own, and is no longer a waiter; close frees it', async () => {
    const kept = runner();
    for (const key of ['r1', 'r2', 'r3']) expect((await kept.run(delivery(key))).kind).toBe('completed');
    expect(await takers(group.key)).toEqual(['r1']);
    expect(await slotRows(group.key)).toHaveLength(1);
    // A job that was a waiter: its row would hold newcomers back were it lent a slot.
    await sql`insert into ${sql.id(env.schema, 'concurrency_waiters')} (group_key, scope, key, since, seen_at)
              values (${group.key}, ${SCOPE}, 'deferred', now() - interval '1 hour', now())`.execute(env.db);
    expect((await kept.run(delivery('deferred', { deferrals: 1 }))).kind).toBe('completed');
    expect((await kept.run(delivery('redelivered', { deliveryCount: 2 }))).kind).toBe('completed');
    expect(await takers(group.key)).toEqual(['deferred', 'r1', 'redelivered']);
    expect((await sql<{ n: number }>`select count(*)::int as n from ${sql.id(env.schema, 'concurrency_waiters')}`.execute(env.db)).rows[0]!.n).toBe(0);
    for (const key of ['r1', 'r2', 'r3', 'deferred', 'redelivered']) expect(await effectsOf(env.db, env.schema, SCOPE, key)).toHaveLength(1);
    // Two rows kept (the deferred job's slot went back to the pool too), both freed at close.
    expect((await slotRows(group.key)).length).toBeGreaterThan(0);
    await kept.close();
    expect(await slotRows(group.key)).toEqual([]);
  });

  it('a take that finds another key waiting keeps nothing for reuseMs: its slot is freed as its run ends, and the next run takes its own', async () => {
    const kept = runner();
    await sql`insert into ${sql.id(env.schema, 'concurrency_waiters')} (group_key, scope, key, since, seen_at)
              values (${group.key}, ${SCOPE}, 'elsewhere', now(), now())`.execute(env.db);
    for (const key of ['c1', 'c2']) expect((await kept.run(delivery(key))).kind).toBe('completed');
    expect(await takers(group.key)).toEqual(['c1', 'c2']);
    expect(await slotRows(group.key)).toEqual([]);
    await kept.close();
  });

  it("a job refused by its limit asks again within reuseMs at the latest (a kept slot frees by then, though its row's time runs a lease)", async () => {
    const full = { key: 'tenant:full', limit: 1 };
    const holderSlot = await keys.acquireConcurrencySlot(SCOPE, 'holding', full, { leaseMs: 30_000, starvationMs: 60_000 });
    expect(holderSlot.acquired).toBe(true);
    const kept = new KeyedJobRunner<unknown, unknown, Message>({
      keys,
      timing: resolveWorkerTiming({ concurrencySlotReuseMs: 400, deferMaxMs: 10_000, deferJitterRatio: 0 }, 30_000),
      identityOf: (message) => identityFromWireContract({ id: message.id, name: 'job', data: message.data }) as JobIdentity<unknown>,
      handler: { transaction: async () => null },
      logger: silent,
    });
    const outcome = await kept.run({ ...delivery('refused'), message: { id: 'refused', data: { idempotencyKey: 'refused', scope: SCOPE, payload: {}, concurrencyKey: full.key, concurrencyLimit: 1 } } });
    expect(outcome).toMatchObject({ kind: 'deferred', reason: 'concurrency-limit' });
    expect((outcome as { retryAfterMs: number }).retryAfterMs).toBeLessThanOrEqual(400);
    await kept.close();
  });

  it('with concurrencySlotReuseMs 0, every run takes and frees its own slot (held by its transaction)', async () => {
    const own = runner(0);
    for (const key of ['o1', 'o2']) expect((await own.run(delivery(key))).kind).toBe('completed');
    expect(await slotRows(group.key)).toEqual([]);
    // Held by their transactions: no slot row, and no record (the fast path leaves no key processing).
    expect(await takers(group.key)).toEqual([]);
  });

  it("a run's listener on its kept slot's signal is removed when it ends (a slot lent to every run holds none of theirs)", async () => {
    const kept = runner();
    // Every signal an abort listener is added to while the runs go on.
    const signals = new Set<AbortSignal>();
    const add = EventTarget.prototype.addEventListener;
    const spy = vi.spyOn(EventTarget.prototype, 'addEventListener').mockImplementation(function (this: EventTarget, ...args: Parameters<EventTarget['addEventListener']>) {
      if (args[0] === 'abort' && this instanceof AbortSignal) signals.add(this);
      return add.apply(this, args);
    });
    try {
      for (let n = 0; n < 20; n++) expect((await kept.run(delivery(`l${n}`))).kind).toBe('completed');
    } finally {
      spy.mockRestore();
    }
    expect(await takers(group.key)).toEqual(['l0']);
    // The kept slot's signal was listened to by all 20 runs; none of them is still on it.
    expect(Math.max(...[...signals].map((signal) => getEventListeners(signal, 'abort').length))).toBeLessThanOrEqual(1);
    await kept.close();
  });
});

describe('a leased run lent a slot', () => {
  // The pool frees a slot no run has held for 50 ms, by a setInterval sweep: on a loaded machine
  // two runs one after the other can be further apart than that, and the second would take a slot
  // of its own. The sweep held off here (closing frees the kept slots without it), so that what
  // this file's runner tests count is the lending, not the machine's speed.
  beforeEach(() => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
  });
  afterEach(() => {
    vi.useRealTimers();
  });
  const group = { key: 'tenant:leased', limit: 4 };
  const records = async (key: string) =>
    (
      await sql<{ group_key: string; concurrency_limit: number }>`select group_key, concurrency_limit from ${sql.id(env.schema, 'key_concurrency_limits')}
        where scope = ${SCOPE} and key = ${key} order by group_key`.execute(env.db)
    ).rows;

  it("records its key's concurrency keys with its claim, alone or in a batch, dropping the key's records of others; a fast-path claim records nothing", async () => {
    const fingerprint = keys.fingerprint(1);
    await sql`insert into ${sql.id(env.schema, 'key_concurrency_limits')} (scope, key, group_key, concurrency_limit) values (${SCOPE}, 'alone', 'tenant:old', 9)`.execute(env.db);
    await keys.claim(SCOPE, 'alone', fingerprint, { concurrency: [group, { key: 'all', limit: 10 }] });
    expect(await records('alone')).toEqual([
      { group_key: 'all', concurrency_limit: 10 },
      { group_key: group.key, concurrency_limit: group.limit },
    ]);
    // Claims of one turn go as one statement (claim_keys): each records its own, a key claimed twice once.
    const batch = ['b1', 'b2', 'b3', 'b1'];
    const outcomes = await Promise.all(batch.map((key, n) => keys.claim(SCOPE, key, fingerprint, { concurrency: [{ key: group.key, limit: 4 + n }] })));
    expect(outcomes.map((o) => o.kind)).toEqual(['claimed', 'claimed', 'claimed', 'in-progress']);
    for (const key of ['b1', 'b2', 'b3']) expect(await records(key)).toHaveLength(1);
    expect((await records('b2'))[0]!.concurrency_limit).toBe(5);
    // Beside claims without records, in one batch.
    await Promise.all([keys.claim(SCOPE, 'c1', fingerprint), keys.claim(SCOPE, 'c2', fingerprint, { concurrency: [group] })]);
    expect(await records('c1')).toEqual([]);
    expect(await records('c2')).toHaveLength(1);
    // Malformed, refused before anything is sent.
    for (const concurrency of [[{ key: '', limit: 1 }], [{ key: 'k', limit: 0 }], [{ key: 'k', limit: 1.5 }], [null]]) {
      await expect(keys.claim(SCOPE, 'malformed', fingerprint, { concurrency: concurrency as never })).rejects.toMatchObject({ code: 'INVALID_OPTIONS' });
    }
    expect(await keys.get(SCOPE, 'malformed')).toBeUndefined();
    await keys.executeOnce(SCOPE, 'fast', fingerprint, async () => null, { concurrency: [group] } as never);
    expect(await records('fast')).toEqual([]);
  });

  it('runs in a kept slot with its claim recording its limit: the sweeper finds a lost key under it', async () => {
    const kept = new KeyedJobRunner<unknown, unknown, Message>({
      keys,
      timing: resolveWorkerTiming({ concurrencySlotReuseMs: 60_000 }, 30_000),
      identityOf: (message) => identityFromWireContract({ id: message.id, name: 'job', data: message.data }) as JobIdentity<unknown>,
      handler: async (ctx) => {
        if (ctx.key === 'lost') await new Promise(() => {}); // its worker dies mid-run: nothing ends it
        return null;
      },
      logger: silent,
    });
    const delivery = (key: string) => deliveryOf(group, key);
    expect((await kept.run(delivery('first'))).kind).toBe('completed');
    expect(await slotRows(group.key)).toHaveLength(1);
    void kept.run(delivery('lost'));
    await waitFor('the lost key claimed', async () => (await keys.get(SCOPE, 'lost'))?.status === 'processing');
    // Lent the first run's slot (no second row), and recorded by its claim.
    expect(await slotRows(group.key)).toHaveLength(1);
    expect(await records('lost')).toEqual([{ group_key: group.key, concurrency_limit: group.limit }]);
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 minute' where scope = ${SCOPE} and key = 'lost'`.execute(env.db);
    const [candidate] = (await findLostKeyCandidates(env.db, env.schema, 0, 10)).filter((c) => c.key === 'lost');
    expect(candidate?.concurrency).toEqual(group);
    await kept.abandonActive();
    await kept.close();
  });
});

describe('workers that keep slots', () => {
  it('two workers that keep slots and one that does not, limit 3, 60 jobs: never more than 3 at once, each committed once, fewer takes than jobs, no row left after close', { timeout: 60_000 }, async () => {
    const group = { key: 'tenant:workers', limit: 3 };
    const queueName = 'slot-pool-workers';
    const queue = new Queue(queueName, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
    queues.push(queue);
    const ids = Array.from({ length: 60 }, (_, n) => `w-${n}`);
    await queue.addBulk(ids.map((id, n) => ({ name: 'sync', data: { idempotencyKey: id, scope: SCOPE, payload: { n }, concurrencyKey: group.key, concurrencyLimit: group.limit }, opts: { jobId: id, attempts: 3 } })));
    let running = 0;
    let most = 0;
    const handler = {
      transaction: async (tx: any, ctx: { scope: string; key: string }) => {
        running++;
        most = Math.max(most, running);
        try {
          await sleep(5 + Math.random() * 15);
          await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, 1, 'w')`.execute(tx);
        } finally {
          running--;
        }
      },
    };
    const start = (reuseMs: number) => {
      const worker = createIdempotentWorker({
        queue: queueName,
        connection: { url: env.redisUrl },
        prefix: env.redisPrefix,
        keys,
        handler,
        concurrency: 4,
        deferMinMs: 20,
        deferMaxMs: 50,
        concurrencySlotReuseMs: reuseMs,
        logger: silent,
      });
      workers.push(worker);
      return worker;
    };
    const started = [start(60_000), start(60_000), start(0)];
    await waitFor('every effect', async () => (await sql<{ n: number }>`select count(*)::int as n from ${sql.id(env.schema, 'effects')} where scope = ${SCOPE} and key like 'w-%'`.execute(env.db)).rows[0]!.n === ids.length, 50_000);
    expect(most).toBeLessThanOrEqual(group.limit);
    expect(most).toBeGreaterThan(1);
    for (const id of ids) expect(await effectsOf(env.db, env.schema, SCOPE, id)).toHaveLength(1);
    expect((await takers(group.key)).length).toBeLessThan(ids.length);
    await Promise.all(started.map((worker) => worker.close()));
    expect(await slotRows(group.key)).toEqual([]);
  });
});
