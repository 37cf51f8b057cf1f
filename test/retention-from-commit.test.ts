/**
 * A key's retention window is counted from its completion's commit, not from the start of the
 * transaction that completed it. Postgres's `now()` is the transaction's start: a key whose
 * effect's transaction ran longer than its window was already expired when it committed, and a
 * redelivery right after ran the effect a second time. Each path that completes a key is run
 * here with a transaction longer than the window (1 s); the duplicate that follows at once must
 * replay after a janitor pass, and the row's window must start no earlier than the effect's end.
 */
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pino } from 'pino';
import { IdempotencyKeys, isHeld } from '../src/index.js';
import { pgDataLayer } from '../src/pg/index.js';
import { Janitor } from '../src/process/index.js';
import { PostgresKeyStore } from '../src/store/postgres-key-store.js';
import { createEffectsTable, effectsOf, insertEffect } from './support/protocol-fixtures.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const WINDOW_MS = 1_000;
/** Longer than the window: a transaction this long outlived a window counted from its start. */
const EFFECT_MS = 1_400;
const scope = 'retention-from-commit';

let env: TestEnv;
let keys: IdempotencyKeys;

beforeAll(async () => {
  env = await createTestEnv('retention_from_commit');
  await createEffectsTable(env.db, env.schema);
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000, retentionMs: WINDOW_MS, groupCommit: false });
});
afterAll(async () => {
  await env?.teardown();
});

const fp = (key: string) => keys.fingerprint({ key });

/** The effect of these tests: one row, then a wait inside the transaction; returns the database clock at its end. */
async function slowEffect(tx: Kysely<any>, key: string, fence: number): Promise<Date> {
  await insertEffect(tx, env.schema, { scope, key, fence, worker: 'w' });
  await new Promise((resolve) => setTimeout(resolve, EFFECT_MS));
  const { rows } = await sql<{ at: Date }>`select clock_timestamp() as at`.execute(tx);
  return rows[0]!.at;
}

/** The key's window as stored: when it started and how long it is. */
async function windowOf(key: string): Promise<{ completedAt: Date; lengthMs: number }> {
  const { rows } = await sql<{ completed_at: Date; length_ms: string }>`
    select completed_at, (extract(epoch from expires_at - completed_at) * 1000)::bigint as length_ms
      from ${sql.id(env.schema, 'idempotency_keys')} where scope = ${scope} and key = ${key}`.execute(env.db);
  return { completedAt: rows[0]!.completed_at, lengthMs: Number(rows[0]!.length_ms) };
}

/**
 * After a janitor pass, the duplicate that follows at once replays, the effect ran once, and
 * the window starts after the effect's end.
 */
async function expectWindowFromCommit(key: string, effectEnd: Date): Promise<void> {
  await new Janitor({ db: env.db, schema: env.schema, retentionMs: WINDOW_MS, logger: pino({ level: 'silent' }) }).runOnce();
  const again = await keys.executeOnce(scope, key, fp(key), async (tx, claim) => {
    await insertEffect(tx, env.schema, { scope, key, fence: claim.fence, worker: 'duplicate' });
    return 'ran again';
  });
  expect(again.kind).toBe('completed');
  expect(await effectsOf(env.db, env.schema, scope, key)).toHaveLength(1);
  const window = await windowOf(key);
  expect(window.lengthMs).toBe(WINDOW_MS);
  expect(window.completedAt.getTime()).toBeGreaterThanOrEqual(effectEnd.getTime());
}

describe('a transaction longer than its key\'s retention window', () => {
  it('the fast path with a result: the window starts at the commit', async () => {
    const key = 'fast-with-result';
    let effectEnd!: Date;
    const outcome = await keys.executeOnce(scope, key, fp(key), async (tx, claim) => {
      effectEnd = await slowEffect(tx, key, claim.fence);
      return { charged: true };
    });
    expect(outcome.kind).toBe('executed');
    await expectWindowFromCommit(key, effectEnd);
  });

  it('the fast path without a result: the window starts at the commit', async () => {
    const key = 'fast-without-result';
    let effectEnd!: Date;
    const outcome = await keys.executeOnce(scope, key, fp(key), async (tx, claim) => {
      effectEnd = await slowEffect(tx, key, claim.fence);
    });
    expect(outcome.kind).toBe('executed');
    await expectWindowFromCommit(key, effectEnd);
  });

  it('the fast path, its window moved across a daylight-saving change in the session\'s time zone: the same length', async () => {
    // Berlin's changes (the last Sundays of March and of October) are at most 218 days apart:
    // 220 days from any day cross one.
    const windowMs = 220 * 86_400_000;
    const berlin = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000, retentionMs: windowMs, maxJobRetentionMs: windowMs, groupCommit: false });
    const key = 'fast-across-dst';
    const outcome = await berlin.executeOnce(scope, key, fp(key), async (tx, claim) => {
      await sql`set local timezone = 'Europe/Berlin'`.execute(tx);
      await slowEffect(tx, key, claim.fence);
      return 'done';
    });
    expect(outcome.kind).toBe('executed');
    expect((await windowOf(key)).lengthMs).toBe(windowMs);
  });

  it('the fast path in a data layer\'s transaction (node-postgres): the window starts at the commit', async () => {
    const pool = new pg.Pool({ connectionString: env.databaseUrl, max: 2 });
    try {
      const key = 'data-layer';
      let effectEnd!: Date;
      const outcome = await keys.executeOnceIn(scope, key, fp(key), pgDataLayer(pool), async (client, claim) => {
        await client.query(`insert into ${pg.escapeIdentifier(env.schema)}.effects (scope, key, fence, worker) values ($1, $2, $3, 'w')`, [scope, key, claim.fence]);
        await new Promise((resolve) => setTimeout(resolve, EFFECT_MS));
        effectEnd = (await client.query<{ at: Date }>('select clock_timestamp() as at')).rows[0]!.at;
        return 'done';
      });
      expect(outcome.kind).toBe('executed');
      await expectWindowFromCommit(key, effectEnd);
    } finally {
      await pool.end();
    }
  });

  it('the leased path: the fenced completion starts the window at the commit', async () => {
    const key = 'leased';
    const claim = await keys.claim(scope, key, fp(key));
    if (!isHeld(claim)) throw new Error(`expected a held claim, got ${claim.kind}`);
    let effectEnd!: Date;
    await keys.runEffect(claim, async (tx) => {
      effectEnd = await slowEffect(tx, key, claim.fence);
      return 'done';
    });
    await expectWindowFromCommit(key, effectEnd);
  });

  it('a group\'s fast-path keys, written at the group\'s end: the window starts at the commit', async () => {
    const store = new PostgresKeyStore(env.db, env.schema, { probeSettledKeys: false });
    const grouped = new IdempotencyKeys(
      { db: env.db, schema: env.schema, leaseMs: 30_000, retentionMs: WINDOW_MS, groupCommit: { maxGroups: 1, slowJobMs: 60_000 } },
      store,
    );
    const groupKeys = ['group-a', 'group-b'];
    const ends = new Map<string, Date>();
    const outcomes = await Promise.all(
      groupKeys.map((key) =>
        grouped.executeOnce(scope, key, fp(key), async (tx, claim) => {
          ends.set(key, await slowEffect(tx, key, claim.fence));
          return key;
        }),
      ),
    );
    expect(outcomes.map((outcome) => outcome.kind)).toEqual(['executed', 'executed']);
    for (const key of groupKeys) await expectWindowFromCommit(key, ends.get(key)!);
  });
});
