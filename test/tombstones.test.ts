/**
 * Deduplication past retention: a finished key the janitor deletes leaves a tombstone, and a
 * duplicate inside the tombstone's window is answered "completed, result expired" (or "failed,
 * error expired") and never runs again, on every claim path; another payload is KEY_REUSED.
 */
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { IdempotencyKeys, isHeld } from '../src/index.js';
import { Janitor } from '../src/process/index.js';
import { PostgresOperatorStore } from '../src/store/operator-store.js';
import { deleteExpiredKeys } from '../src/store/sql/delete-expired-keys.js';
import { createEffectsTable, effectsOf, insertEffect } from './support/protocol-fixtures.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const silent = pino({ level: 'silent' });
const HOUR = 3_600_000;
let env: TestEnv;
let keys: IdempotencyKeys;
let grouped: IdempotencyKeys;

beforeAll(async () => {
  env = await createTestEnv('tombstones');
  await createEffectsTable(env.db, env.schema);
  // Results kept 1 ms: each finished key is expired by the time the janitor runs.
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema, retentionMs: 1 });
  grouped = new IdempotencyKeys({ db: env.db, schema: env.schema, retentionMs: 1, groupCommit: true });
});
afterAll(async () => {
  await env?.teardown();
});
beforeEach(async () => {
  await sql`truncate ${sql.id(env.schema, 'idempotency_keys')}, ${sql.id(env.schema, 'key_tombstones')}, ${sql.id(env.schema, 'effects')} cascade`.execute(env.db);
});

const janitor = (tombstoneMs: number) => new Janitor({ db: env.db, schema: env.schema, tombstoneMs, logger: silent });
const operator = () => new PostgresOperatorStore(env.db, env.schema);

/** Runs `key`'s effect once under a leased claim: one effect row, the key completed with `{ n: 1 }`. */
async function completeOnce(scope: string, key: string, payload: unknown): Promise<void> {
  const outcome = await keys.claim(scope, key, keys.fingerprint(payload));
  if (!isHeld(outcome)) throw new Error(`expected to hold ${key}, got ${outcome.kind}`);
  await keys.runEffect(outcome, async (tx) => {
    await insertEffect(tx, env.schema, { scope, key, fence: outcome.fence, worker: 'first' });
    return { n: 1 };
  });
}

async function keyRowCount(scope: string, key: string): Promise<number> {
  const { rows } = await sql<{ n: number }>`select count(*)::int as n from ${sql.id(env.schema, 'idempotency_keys')} where scope = ${scope} and key = ${key}`.execute(env.db);
  return rows[0]!.n;
}

describe('key tombstones', () => {
  it('answers a duplicate past retention "completed, result expired" on the leased and fast paths, and never runs it again', async () => {
    await completeOnce('t', 'order-1', { cents: 5 });
    const report = await janitor(HOUR).runOnce();
    expect(report.keysDeleted).toBe(1);
    expect(await keyRowCount('t', 'order-1')).toBe(0);

    const tombstone = await operator().getTombstone('t', 'order-1');
    expect(tombstone).toMatchObject({ scope: 't', key: 'order-1', outcome: 'completed' });
    expect(tombstone!.expiresAt.getTime() - tombstone!.finishedAt.getTime()).toBe(HOUR);

    const leased = await keys.claim('t', 'order-1', keys.fingerprint({ cents: 5 }));
    expect(leased).toMatchObject({ kind: 'completed', result: null, resultExpired: { finishedAt: tombstone!.finishedAt } });

    let ran = 0;
    const fast = await keys.executeOnce('t', 'order-1', keys.fingerprint({ cents: 5 }), async () => ran++);
    expect(fast).toMatchObject({ kind: 'completed', resultExpired: { tombstoneExpiresAt: tombstone!.expiresAt } });
    const inGroup = await Promise.all(
      [1, 2, 3].map((n) =>
        grouped.executeOnce('t', n === 2 ? 'order-1' : `fresh-${n}`, grouped.fingerprint(n === 2 ? { cents: 5 } : { n }), async (tx, claim) => {
          await insertEffect(tx, env.schema, { scope: 't', key: claim.key, fence: claim.fence, worker: 'group' });
          return n;
        }, { databaseOnly: true }),
      ),
    );
    expect(inGroup.map((o) => o.kind)).toEqual(['executed', 'completed', 'executed']);
    expect(ran).toBe(0);
    expect(await effectsOf(env.db, env.schema, 't', 'order-1')).toEqual([{ fence: 1, worker: 'first' }]);
    expect(await keyRowCount('t', 'order-1')).toBe(0);
  });

  it('refuses another payload under a tombstoned key as key-reused', async () => {
    await completeOnce('t', 'order-2', { cents: 5 });
    await janitor(HOUR).runOnce();
    expect(await keys.claim('t', 'order-2', keys.fingerprint({ cents: 6 }))).toMatchObject({ kind: 'key-reused' });
    expect(await keys.executeOnce('t', 'order-2', keys.fingerprint({ cents: 6 }), async () => 1)).toMatchObject({ kind: 'key-reused' });
  });

  it('answers a duplicate of a failed key "failed, error expired"', async () => {
    const outcome = await keys.claim('t', 'order-3', keys.fingerprint({ cents: 5 }));
    if (!isHeld(outcome)) throw new Error('expected to hold the key');
    await keys.fail(outcome, new Error('card declined'));
    await janitor(HOUR).runOnce();
    const again = await keys.claim('t', 'order-3', keys.fingerprint({ cents: 5 }));
    expect(again).toMatchObject({ kind: 'failed', error: { code: 'RESULT_EXPIRED' }, resultExpired: {} });
    expect((await operator().getTombstone('t', 'order-3'))?.outcome).toBe('failed');
  });

  it('frees the key when the window ends, and leaves no tombstone without one or for a key finished before the window', async () => {
    await completeOnce('t', 'order-4', { cents: 5 });
    await janitor(HOUR).runOnce();
    await sql`update ${sql.id(env.schema, 'key_tombstones')} set expires_at = now() - interval '1 second'`.execute(env.db);
    expect(await operator().getTombstone('t', 'order-4')).toBeUndefined();
    const report = await janitor(HOUR).runOnce();
    expect(report.tombstonesDeleted).toBe(1);
    expect((await keys.claim('t', 'order-4', keys.fingerprint({ cents: 5 }))).kind).toBe('claimed');

    await completeOnce('t', 'order-5', { cents: 5 });
    await janitor(0).runOnce();
    expect(await operator().countTombstones()).toBe(0);
    expect((await keys.claim('t', 'order-5', keys.fingerprint({ cents: 5 }))).kind).toBe('claimed');

    await completeOnce('t', 'order-6', { cents: 5 });
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set completed_at = now() - interval '2 hours' where key = 'order-6'`.execute(env.db);
    await janitor(HOUR).runOnce();
    expect(await operator().countTombstones()).toBe(0);
  });

  it('warns at start when the tombstone window is no longer than the retention (no key would leave one)', () => {
    const lines: Array<{ msg: string; level: number }> = [];
    const logger = pino({ level: 'warn' }, { write: (line: string) => lines.push(JSON.parse(line)) });
    new Janitor({ db: env.db, schema: env.schema, retentionMs: HOUR, tombstoneMs: HOUR, logger });
    new Janitor({ db: env.db, schema: env.schema, retentionMs: HOUR, tombstoneMs: 2 * HOUR, logger });
    expect(lines.map((l) => l.msg)).toEqual([expect.stringContaining('no key will leave a tombstone')]);
  });

  it("warns when a janitor without a window deletes keys while another's tombstones are live (a worker's own janitor without TOMBSTONE_MS)", async () => {
    const lines: Array<{ msg: string; level: number; keysDeleted?: number }> = [];
    const logger = pino({ level: 'warn' }, { write: (line: string) => lines.push(JSON.parse(line)) });
    const windowless = new Janitor({ db: env.db, schema: env.schema, tombstoneMs: 0, logger });
    // No tombstone anywhere: deleting keys without one is what this schema wants; nothing said.
    await completeOnce('w', 'a', { n: 1 });
    expect((await windowless.runOnce()).keysDeleted).toBe(1);
    expect(lines).toEqual([]);
    // The maintenance process's janitor leaves tombstones; a worker's deletes the next key without one.
    await completeOnce('w', 'b', { n: 1 });
    await janitor(HOUR).runOnce();
    await completeOnce('w', 'c', { n: 1 });
    expect((await windowless.runOnce()).keysDeleted).toBe(1);
    expect(lines).toEqual([expect.objectContaining({ level: 40, keysDeleted: 1, msg: expect.stringContaining('Set the same TOMBSTONE_MS on every process that runs a janitor') })]);
    // A run that deletes nothing says nothing.
    await windowless.runOnce();
    expect(lines).toHaveLength(1);
  });

  it('refuses a claim that raced the janitor: the key deleted and its tombstone written while the claim waited', async () => {
    await completeOnce('t', 'order-7', { cents: 5 });
    // Its retention (1 ms) counts from its completion: past it by the janitor's clock.
    await new Promise((resolve) => setTimeout(resolve, 5));
    let claimStarted!: () => void;
    const started = new Promise<void>((resolve) => (claimStarted = resolve));
    let claim: Promise<unknown> | undefined;
    await env.db.transaction().execute(async (tx) => {
      expect(await deleteExpiredKeys(tx, env.schema, 10, 'idempotency_keys', HOUR)).toHaveLength(1);
      // The janitor's delete is uncommitted: the claim's insert waits on the key's index entry.
      claim = keys.claim('t', 'order-7', keys.fingerprint({ cents: 5 }));
      claimStarted();
      await waitForLockWait();
    });
    await started;
    expect(await claim).toMatchObject({ kind: 'completed', resultExpired: {} });
    expect(await keyRowCount('t', 'order-7')).toBe(0);
  });
});

/** Until some session of this database waits on a lock (the racing claim). */
async function waitForLockWait(): Promise<void> {
  for (let i = 0; i < 500; i++) {
    const { rows } = await sql<{ n: number }>`select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`.execute(env.db);
    if (rows[0]!.n > 0) return;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error('the claim never waited on the janitor');
}
