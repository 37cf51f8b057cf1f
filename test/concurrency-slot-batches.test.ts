/**
 * Slot rows taken and freed by several runs at once share one statement and one commit (the
 * leased path's concurrency keys): the batched statements answer each request as it would have
 * been answered alone (distinct slots, refusals recorded as waiters, the key's records), free only
 * what each owner holds and wake one waiter per slot freed; concurrent requests through the store
 * go out in fewer statements than requests; a batch that fails as a whole is sent again one request
 * at a time, so one bad request fails alone. Takes never wait for another transaction's rows, so
 * batches of takes, releases and renewals cannot wait on each other in a cycle.
 */
import { randomUUID } from 'node:crypto';
import { Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { IdempotencyKeys, type ConcurrencySlot } from '../src/index.js';
import { concurrencySlotFreedChannel } from '../src/store/channels.js';
import { releaseConcurrencySlots } from '../src/store/sql/concurrency-slot-wakes.js';
import { acquireConcurrencySlots, concurrencyGroupCounts, type SlotRequest } from '../src/store/sql/concurrency-slots.js';
import { PostgresKeyStore } from '../src/store/index.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
const slotOptions = { leaseMs: 30_000, starvationMs: 60_000 };

beforeAll(async () => {
  env = await createTestEnv('concurrency-slot-batches');
});
afterAll(async () => {
  await env?.teardown();
});
beforeEach(async () => {
  await sql`truncate ${sql.id(env.schema, 'concurrency_slots')}, ${sql.id(env.schema, 'concurrency_waiters')}, ${sql.id(env.schema, 'key_concurrency_limits')}`.execute(env.db);
});

function request(group: string, limit: number, key: string, extra: Partial<SlotRequest> = {}): SlotRequest {
  return { group, limit, scope: 's', key, owner: randomUUID(), leaseMs: 30_000, starvationMs: 60_000, ...extra };
}

/** A Kysely whose statements are counted by what they call. */
function countingDb() {
  const statements: string[] = [];
  const db = new Kysely<any>({
    dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: env.databaseUrl, max: 8 }) }),
    log: (event) => void statements.push(event.query.sql),
  });
  return { db, count: (text: string) => statements.filter((s) => s.includes(text)).length };
}

describe('batched slot statements', () => {
  it('one statement takes distinct slots for its requests, refuses those past the limit as waiters, and records each key', async () => {
    const answers = await acquireConcurrencySlots(env.db, env.schema, [
      request('tenant:a', 2, 'job-1'),
      request('tenant:a', 2, 'job-2', { groups: ['tenant:a', 'tenant:b'] }),
      request('tenant:a', 2, 'job-3', { jobId: '7', queue: 'q' }),
      request('tenant:b', 1, 'job-2', { groups: ['tenant:a', 'tenant:b'] }),
    ]);
    expect(answers[0]).toMatchObject({ acquired: true });
    expect(answers[1]).toMatchObject({ acquired: true });
    expect(new Set(answers.slice(0, 2).map((a) => (a.acquired ? a.slot : -1)))).toEqual(new Set([0, 1]));
    expect(answers[2]).toMatchObject({ acquired: false, retryAfterMs: expect.any(Number) });
    expect(answers[3]).toEqual({ acquired: true, slot: 0, othersWaiting: false });
    expect(await concurrencyGroupCounts(env.db, env.schema, 'tenant:a')).toEqual({ running: 2, waiting: 1 });
    const { rows: waiters } = await sql`select key, job_id, queue from ${sql.id(env.schema, 'concurrency_waiters')}`.execute(env.db);
    expect(waiters).toEqual([{ key: 'job-3', job_id: '7', queue: 'q' }]);
    const { rows: records } = await sql`select key, group_key from ${sql.id(env.schema, 'key_concurrency_limits')} order by key, group_key`.execute(env.db);
    expect(records).toEqual([
      { key: 'job-1', group_key: 'tenant:a' },
      { key: 'job-2', group_key: 'tenant:a' },
      { key: 'job-2', group_key: 'tenant:b' },
    ]);
  });

  it('one statement frees the slots their owners hold, says which, and wakes one waiter per slot freed', async () => {
    const [first, second] = await acquireConcurrencySlots(env.db, env.schema, [request('tenant:w', 2, 'run-1'), request('tenant:w', 2, 'run-2')]);
    const owners = [randomUUID(), randomUUID()];
    await acquireConcurrencySlots(env.db, env.schema, [
      request('tenant:w', 2, 'wait-1', { jobId: '1', queue: 'q' }),
      request('tenant:w', 2, 'wait-2', { jobId: '2', queue: 'q' }),
      request('tenant:w', 2, 'wait-3', { jobId: '3', queue: 'q' }),
    ]);
    const { rows } = await sql<{ slot: number; owner: string }>`select slot, owner::text from ${sql.id(env.schema, 'concurrency_slots')} order by slot`.execute(env.db);
    expect(first!.acquired && second!.acquired).toBe(true);
    const listener = new pg.Client({ connectionString: env.databaseDirectUrl });
    await listener.connect();
    const woken: string[] = [];
    listener.on('notification', (message) => woken.push(JSON.parse(message.payload!).jobId));
    await listener.query(`listen "${concurrencySlotFreedChannel(env.schema)}"`);
    try {
      const held = rows.map((row) => ({ group: 'tenant:w', slot: row.slot, owner: row.owner }));
      const freed = await releaseConcurrencySlots(env.db, env.schema, [...held, { group: 'tenant:w', slot: 0, owner: owners[0]! }, { group: 'tenant:x', slot: 0, owner: owners[1]! }], 30_000);
      expect(freed).toEqual([true, true, false, false]);
      expect(await releaseConcurrencySlots(env.db, env.schema, held, 30_000)).toEqual([false, false]);
      await expect.poll(() => woken.length).toBe(2);
      expect(woken.sort()).toEqual(['1', '2']);
    } finally {
      await listener.end();
    }
    expect(await concurrencyGroupCounts(env.db, env.schema, 'tenant:w')).toEqual({ running: 0, waiting: 3 });
  });

  it('acquisitions and releases made at once through the store share statements, and each gets its own answer', async () => {
    const { db, count } = countingDb();
    try {
      const keys = new IdempotencyKeys({ db, schema: env.schema });
      const group = { key: 'tenant:many', limit: 24 };
      const answers = await Promise.all(Array.from({ length: 32 }, (_, n) => keys.acquireConcurrencySlot('s', `job-${n}`, group, slotOptions)));
      const taken = answers.filter((a): a is ConcurrencySlot => a.acquired);
      expect(taken).toHaveLength(24);
      expect(new Set(taken.map((slot) => slot.slot)).size).toBe(24);
      expect(count('acquire_concurrency_slot')).toBeLessThan(32);
      const freed = await Promise.all(taken.map((slot) => keys.releaseConcurrencySlot('s', 'job', slot)));
      expect(freed.every(Boolean)).toBe(true);
      expect(count(`delete from "${env.schema}"."concurrency_slots"`)).toBeLessThan(24);
      expect(await concurrencyGroupCounts(env.db, env.schema, 'tenant:many')).toEqual({ running: 0, waiting: 8 });
    } finally {
      await db.destroy();
    }
  });

  it('a batch that fails as a whole is sent again one request at a time: the bad request fails alone, the others get their slots', async () => {
    const { db } = countingDb();
    try {
      const store = new PostgresKeyStore(db, env.schema);
      // An owner that is not a UUID fails the statement it is in.
      const requests = [request('tenant:bad', 8, 'a'), request('tenant:bad', 8, 'b'), request('tenant:bad', 8, 'c', { owner: 'not-a-uuid' }), request('tenant:bad', 8, 'd')];
      const settled = await Promise.allSettled(requests.map((r) => store.acquireSlot(r)));
      expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'fulfilled', 'rejected', 'fulfilled']);
      expect(await concurrencyGroupCounts(env.db, env.schema, 'tenant:bad')).toEqual({ running: 3, waiting: 0 });
    } finally {
      await db.destroy();
    }
  });

  it('answers each release by its position: a slot named twice in one batch is freed once, owners compare as UUIDs', async () => {
    const [x, y] = await acquireConcurrencySlots(env.db, env.schema, [request('tenant:twice', 4, 'x', { owner: '0b5d9bd5-4c53-4d6a-9d0a-6a1f3a4c2e11' }), request('tenant:twice', 4, 'y')]);
    if (!x!.acquired || !y!.acquired) throw new Error('expected slots');
    const { rows } = await sql<{ owner: string }>`select owner::text from ${sql.id(env.schema, 'concurrency_slots')} where key = 'y'`.execute(env.db);
    const yHeld = { group: 'tenant:twice', slot: y!.slot, owner: rows[0]!.owner };
    const xUpperCase = { group: 'tenant:twice', slot: x!.slot, owner: '0B5D9BD5-4C53-4D6A-9D0A-6A1F3A4C2E11' };
    expect(await releaseConcurrencySlots(env.db, env.schema, [yHeld, xUpperCase, yHeld], 30_000)).toEqual([true, true, false]);
  });

  it('a key\'s `groups` with any text (a lone surrogate, quotes, commas, braces, an empty list) is recorded as one take alone records it', async () => {
    const odd = ['tenant:\uD800x', 'a,b', '{c}', '"d"', 'e\\f', ''];
    const answers = await acquireConcurrencySlots(env.db, env.schema, [request(odd[0]!, 2, 'odd', { groups: odd }), request('tenant:none', 2, 'none', { groups: [] }), request('tenant:null', 2, 'null')]);
    expect(answers.map((a) => a.acquired)).toEqual([true, true, true]);
    const { rows } = await sql<{ key: string; group_key: string }>`select key, group_key from ${sql.id(env.schema, 'key_concurrency_limits')} order by key`.execute(env.db);
    // The driver stores a lone surrogate as U+FFFD, alone or batched.
    expect(rows).toEqual([
      { key: 'none', group_key: 'tenant:none' },
      { key: 'null', group_key: 'tenant:null' },
      { key: 'odd', group_key: 'tenant:\uFFFDx' },
    ]);
  });

  it("a take's sweep of stale waiters skips the waiter rows another take's transaction holds, instead of closing a cycle with it", async () => {
    const table = (name: string) => `"${env.schema}".${name}`;
    const [setup, first, second] = [new pg.Client(env.databaseDirectUrl), new pg.Client(env.databaseDirectUrl), new pg.Client(env.databaseDirectUrl)];
    await Promise.all([setup.connect(), first.connect(), second.connect()]);
    try {
      await setup.query(`insert into ${table('concurrency_slots')} values ('g', 0, gen_random_uuid(), 's', 'holder', now() + interval '1 minute')`);
      // Two waiters last seen 1.5 s ago: stale to a take 2 s (twice its starvation bound) after.
      await setup.query(`insert into ${table('concurrency_waiters')} (group_key, scope, key, since, seen_at)
                         values ('g', 's', 'k2', now() - interval '1.5 s', now() - interval '1.5 s'), ('g', 's', 'k1', now() - interval '1.5 s', now() - interval '1.5 s')`);
      const take = (key: string) => `select * from ${table('acquire_concurrency_slot')}('g', 1, 's', '${key}', gen_random_uuid(), 30000, 1000)`;
      // A batch's first take holds k1's waiter row until its commit.
      await first.query('begin');
      await first.query(take('k1'));
      await new Promise((resolve) => setTimeout(resolve, 700));
      // Another take, 0.7 s later, finds k1 and k2 stale: it deletes k2 and must not wait for k1.
      await second.query('begin');
      await second.query(`set local lock_timeout = '3s'`);
      const secondTake = second.query(take('k0')).then(() => 'ok', (error: Error) => error.message);
      // The batch's second take waits for k2's row, which the other take deleted.
      await new Promise((resolve) => setTimeout(resolve, 200));
      const firstTake = first.query(take('k2')).then(() => 'ok', (error: Error) => error.message);
      expect(await secondTake).toBe('ok');
      await second.query('commit');
      expect(await firstTake).toBe('ok');
      await first.query('commit');
    } finally {
      await Promise.all([setup.end(), first.end(), second.end()]);
    }
  });

  it("a take passes over a slot row whose time ran out and that its old owner's release holds, instead of closing a cycle with it", async () => {
    const table = (name: string) => `"${env.schema}".${name}`;
    const [setup, taker, releaser] = [new pg.Client(env.databaseDirectUrl), new pg.Client(env.databaseDirectUrl), new pg.Client(env.databaseDirectUrl)];
    await Promise.all([setup.connect(), taker.connect(), releaser.connect()]);
    try {
      // Both slots of the key are rows whose time ran out, their runs' releases under way.
      const { rows: old } = await setup.query<{ slot: number; owner: string }>(`
        insert into ${table('concurrency_slots')} (group_key, slot, owner, scope, key, acquired_until)
        select 'tenant:expired', n, gen_random_uuid(), 's', 'old-' || n, now() - interval '1 second' from generate_series(0, 1) as n
        returning slot, owner::text`);
      const take = (key: string) => `select * from ${table('acquire_concurrency_slot')}('tenant:expired', 2, 's', '${key}', gen_random_uuid(), 30000, 60000)`;
      const release = (slot: number) => `delete from ${table('concurrency_slots')} where group_key = 'tenant:expired' and slot = ${slot} and owner = '${old.find((o) => o.slot === slot)!.owner}'`;
      // A batch of takes takes one of the two slots (its row locked until the batch commits) ...
      await taker.query('begin');
      await taker.query(`set local lock_timeout = '3s'`);
      const firstSlot = (await taker.query<{ slot: number }>(take('new-1'))).rows[0]!.slot;
      const otherSlot = 1 - firstSlot;
      // ... while a batch of releases frees the other, then waits for the row of the first.
      await releaser.query('begin');
      await releaser.query(release(otherSlot));
      const releasing = releaser.query(release(firstSlot));
      // The batch's next take finds the other slot's row held by the release: it passes it over
      // (refused: the key's two slots are taken or being freed), where it used to wait for it.
      const next = await taker.query<{ slot: number | null }>(take('new-2')).then(
        (result) => result.rows[0]!.slot,
        (error: Error) => error.message,
      );
      expect(next).toBeNull();
      await taker.query('commit');
      // The first slot has its new owner: the old owner's release of it frees nothing.
      expect((await releasing).rowCount).toBe(0);
      await releaser.query('commit');
    } finally {
      await Promise.all([setup.end(), taker.end(), releaser.end()]);
    }
  });
});
