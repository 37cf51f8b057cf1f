/**
 * Per-job retention: a job asks for its own result retention and tombstone window. The result
 * retention sets `expires_at` on every completion path (leased, fast path alone and in a group,
 * a data layer, a failure); the tombstone window is kept on the key and the janitor uses it
 * before its own `tombstoneMs`. A job asking for more than the bounds gets the bounds (with a
 * warning in its log and an event); a malformed value is invalid job data, and nothing runs.
 */
import { execFile } from 'node:child_process';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { sql } from 'kysely';
import pg from 'pg';
import { pino } from 'pino';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import {
  IdempotencyKeys,
  KeyedJobRunner,
  ValidationError,
  identityFromWireContract,
  isHeld,
  resolveWorkerTiming,
  toWireJobData,
  type JobIdentity,
  type WorkerEvent,
} from '../src/index.js';
import { pgDataLayer } from '../src/pg/index.js';
import { Janitor } from '../src/process/index.js';
import { PostgresOperatorStore } from '../src/store/operator-store.js';
import { createEffectsTable, insertEffect } from './support/protocol-fixtures.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const silent = pino({ level: 'silent' });
const HOUR = 3_600_000;
const DAY = 24 * HOUR;
let env: TestEnv;

beforeAll(async () => {
  env = await createTestEnv('per_job_retention');
  await createEffectsTable(env.db, env.schema);
});
afterAll(async () => {
  await env?.teardown();
});
beforeEach(async () => {
  await sql`truncate ${sql.id(env.schema, 'idempotency_keys')}, ${sql.id(env.schema, 'key_tombstones')}, ${sql.id(env.schema, 'effects')} cascade`.execute(env.db);
});

const keysWith = (options: Partial<ConstructorParameters<typeof IdempotencyKeys>[0]> = {}) =>
  new IdempotencyKeys({ db: env.db, schema: env.schema, retentionMs: DAY, ...options });

/** The key's row as the janitor sees it: its retention (expires_at − completed_at) and its own tombstone window. */
async function retentionOf(scope: string, key: string): Promise<{ status: string; retentionMs: number; tombstoneMs: number | null }> {
  const { rows } = await sql<{ status: string; retention_ms: string; tombstone_ms: string | null }>`
    select status, (extract(epoch from expires_at - completed_at) * 1000)::bigint::text as retention_ms, tombstone_ms::text
      from ${sql.id(env.schema, 'idempotency_keys')} where scope = ${scope} and key = ${key}`.execute(env.db);
  const row = rows[0];
  if (!row) throw new Error(`no row for ${scope}/${key}`);
  return { status: row.status, retentionMs: Number(row.retention_ms), tombstoneMs: row.tombstone_ms === null ? null : Number(row.tombstone_ms) };
}

const BIN = fileURLToPath(new URL('../bin/idempotent-jobs.js', import.meta.url));

/** Runs the `idempotent-jobs` command against this file's schema; its output. */
async function cli(args: string[]): Promise<{ stdout: string }> {
  const { stdout } = await promisify(execFile)(process.execPath, [BIN, ...args], {
    env: { ...process.env, DATABASE_URL: env.databaseUrl, SCHEMA: env.schema, LOG_LEVEL: 'silent' },
    timeout: 30_000,
  });
  return { stdout };
}

async function keyRowCount(scope: string): Promise<number> {
  const { rows } = await sql<{ n: number }>`select count(*)::int as n from ${sql.id(env.schema, 'idempotency_keys')} where scope = ${scope}`.execute(env.db);
  return rows[0]!.n;
}

/** Moves a finished key's end back by `ms`, as if it had finished that long ago, its retention already run out. */
async function finishedAgo(scope: string, key: string, ms: number): Promise<void> {
  await sql`
    update ${sql.id(env.schema, 'idempotency_keys')}
       set completed_at = now() - ${ms}::bigint * interval '1 millisecond', expires_at = now() - interval '1 millisecond'
     where scope = ${scope} and key = ${key}`.execute(env.db);
}

describe('the result retention and tombstone window a claim asks for', () => {
  it('are written by the leased completion, the fast path alone, a group, a data layer, and a failure', async () => {
    const keys = keysWith();
    const grouped = keysWith({ groupCommit: true });
    const retention = { resultMs: 2 * HOUR, tombstoneMs: 30 * DAY };

    const leased = await keys.claim('r', 'leased', keys.fingerprint(1), { retention });
    if (!isHeld(leased)) throw new Error(leased.kind);
    await keys.runEffect(leased, async (tx) => {
      await insertEffect(tx, env.schema, { scope: 'r', key: 'leased', fence: leased.fence, worker: 'w' });
      return { ok: true };
    });

    const fast = await keys.executeOnce('r', 'fast', keys.fingerprint(2), async () => ({ ok: true }), { retention });
    // No result: the row still gets its tombstone window.
    const fastNoResult = await keys.executeOnce('r', 'fast-void', keys.fingerprint(3), async () => undefined, { retention });
    const inGroup = await Promise.all(
      [1, 2, 3].map((n) => grouped.executeOnce('r', `group-${n}`, grouped.fingerprint(n), async () => n, { databaseOnly: true, retention })),
    );

    // Leased claims whose effects share a group's transaction: the fenced completions at the group's end.
    const leasedInGroup = await Promise.all([1, 2].map((n) => grouped.claim('r', `leased-group-${n}`, grouped.fingerprint(n), { retention })));
    await Promise.all(
      leasedInGroup.map((claim) => {
        if (!isHeld(claim)) throw new Error(claim.kind);
        return grouped.runEffect(claim, async () => claim.key, { databaseOnly: true });
      }),
    );

    // A data layer of the user's: the leased completion and the fast path in its transaction.
    const pool = new pg.Pool({ connectionString: env.databaseUrl, max: 2 });
    try {
      const layer = pgDataLayer(pool);
      const inLayer = await keys.claim('r', 'layer-leased', keys.fingerprint(6), { retention });
      if (!isHeld(inLayer)) throw new Error(inLayer.kind);
      await keys.commitEffectIn(inLayer, layer, async (client) => (await client.query('select 1 as one')).rows[0]);
      const layerFast = await keys.executeOnceIn('r', 'layer-fast', keys.fingerprint(7), layer, async () => 7, { retention });
      expect(layerFast.kind).toBe('executed');
    } finally {
      await pool.end();
    }

    const failing = await keys.claim('r', 'failed', keys.fingerprint(4), { retention: { resultMs: 3 * HOUR, tombstoneMs: 0 } });
    if (!isHeld(failing)) throw new Error(failing.kind);
    expect(await keys.fail(failing, new Error('no'))).toBe(true);

    expect([fast.kind, fastNoResult.kind, ...inGroup.map((o) => o.kind)]).toEqual(Array(5).fill('executed'));
    for (const key of ['leased', 'fast', 'fast-void', 'group-1', 'group-2', 'group-3', 'leased-group-1', 'leased-group-2', 'layer-leased', 'layer-fast']) {
      expect(await retentionOf('r', key), key).toEqual({ status: 'completed', retentionMs: 2 * HOUR, tombstoneMs: 30 * DAY });
    }
    expect(await retentionOf('r', 'failed')).toEqual({ status: 'failed', retentionMs: 3 * HOUR, tombstoneMs: 0 });

    // Without one: the instance's retention, and no window of the key's own.
    await keys.executeOnce('r', 'plain', keys.fingerprint(5), async () => 1);
    expect(await retentionOf('r', 'plain')).toEqual({ status: 'completed', retentionMs: DAY, tombstoneMs: null });
    expect((await keys.get('r', 'leased'))?.tombstoneMs).toBe(30 * DAY);
    expect((await keys.get('r', 'plain'))?.tombstoneMs).toBeNull();

    // `keys get` shows the key's own window, as a table and as JSON.
    const text = await cli(['keys', 'get', 'r', 'leased']);
    expect(text.stdout).toMatch(new RegExp(`^tombstone\\s+${30 * DAY} ms after it finished \\(its job's own\\)$`, 'm'));
    expect(text.stdout).toMatch(/^expires\s+\d{4}-/m);
    expect(JSON.parse((await cli(['keys', 'get', 'r', 'leased', '--json'])).stdout)).toMatchObject({ tombstoneMs: 30 * DAY });
    expect((await cli(['keys', 'get', 'r', 'plain'])).stdout).toMatch(/^tombstone\s+- \(the janitor's TOMBSTONE_MS\)$/m);
  });

  it('are held to maxJobRetentionMs and maxJobTombstoneMs; a malformed one is refused before anything is sent', async () => {
    const keys = keysWith({ maxJobRetentionMs: 5 * HOUR, maxJobTombstoneMs: 10 * DAY });
    await keys.executeOnce('b', 'big', keys.fingerprint(1), async () => 1, { retention: { resultMs: 50 * DAY, tombstoneMs: 1000 * DAY } });
    expect(await retentionOf('b', 'big')).toEqual({ status: 'completed', retentionMs: 5 * HOUR, tombstoneMs: 10 * DAY });

    for (const retention of [{ resultMs: 0 }, { resultMs: -1 }, { resultMs: 1.5 }, { tombstoneMs: -5 }, { resultMs: '60000' }, { resultMs: 1e300 }, { ttl: 5 }, []]) {
      await expect(keys.claim('b', 'bad', keys.fingerprint(2), { retention: retention as never }), JSON.stringify(retention)).rejects.toMatchObject({
        code: 'INVALID_OPTIONS',
      });
    }
    expect(await keyRowCount('b')).toBe(1);
  });
});

describe('the janitor and a key\'s own tombstone window', () => {
  it('keeps the key\'s window without a TOMBSTONE_MS of its own, and leaves none for a key that asked for 0', async () => {
    const keys = keysWith();
    await keys.executeOnce('j', 'own', keys.fingerprint(1), async () => 1, { retention: { tombstoneMs: 7 * DAY } });
    await keys.executeOnce('j', 'none', keys.fingerprint(2), async () => 2, { retention: { tombstoneMs: 0 } });
    await keys.executeOnce('j', 'default', keys.fingerprint(3), async () => 3);
    for (const key of ['own', 'none', 'default']) await finishedAgo('j', key, 2 * HOUR);

    const lines: string[] = [];
    const logger = pino({ level: 'warn' }, new Writable({ write: (chunk, _encoding, done) => (lines.push(String(chunk)), done()) }));
    const report = await new Janitor({ db: env.db, schema: env.schema, tombstoneMs: 0, logger }).runOnce();
    expect(report.keysDeleted).toBe(3);
    const operator = new PostgresOperatorStore(env.db, env.schema);
    const tombstone = await operator.getTombstone('j', 'own');
    expect(tombstone!.expiresAt.getTime() - tombstone!.finishedAt.getTime()).toBe(7 * DAY);
    expect(await operator.getTombstone('j', 'none')).toBeUndefined();
    expect(await operator.getTombstone('j', 'default')).toBeUndefined();
    // The key's own tombstone is not taken for another janitor's TOMBSTONE_MS.
    expect(lines.join('')).not.toMatch(/another janitor has TOMBSTONE_MS/);

    // A duplicate inside the window is answered from the tombstone, never run.
    const duplicate = await keys.claim('j', 'own', keys.fingerprint(1));
    expect(duplicate).toMatchObject({ kind: 'completed', resultExpired: { tombstoneExpiresAt: tombstone!.expiresAt } });
    expect((await keys.claim('j', 'default', keys.fingerprint(3))).kind).toBe('claimed');
  });

  it('uses the key\'s window before the janitor\'s TOMBSTONE_MS, and TOMBSTONE_MS for a key without one', async () => {
    const keys = keysWith();
    await keys.executeOnce('k', 'short', keys.fingerprint(1), async () => 1, { retention: { tombstoneMs: 3 * HOUR } });
    await keys.executeOnce('k', 'none', keys.fingerprint(2), async () => 2, { retention: { tombstoneMs: 0 } });
    await keys.executeOnce('k', 'default', keys.fingerprint(3), async () => 3);
    for (const key of ['short', 'none', 'default']) await finishedAgo('k', key, HOUR);

    await new Janitor({ db: env.db, schema: env.schema, tombstoneMs: 30 * DAY, logger: silent }).runOnce();
    const operator = new PostgresOperatorStore(env.db, env.schema);
    const windowOf = async (key: string) => {
      const tombstone = await operator.getTombstone('k', key);
      return tombstone && tombstone.expiresAt.getTime() - tombstone.finishedAt.getTime();
    };
    expect(await windowOf('short')).toBe(3 * HOUR);
    expect(await windowOf('none')).toBeUndefined();
    expect(await windowOf('default')).toBe(30 * DAY);
  });
});

describe('a job\'s retention under the wire contract', () => {
  interface Message {
    readonly id: string;
    readonly data: unknown;
  }

  function runner(keys: IdempotencyKeys, lines: string[], events: WorkerEvent[], ran: string[]) {
    const logger = pino({ level: 'warn' }, new Writable({ write: (chunk, _encoding, done) => (lines.push(String(chunk)), done()) }));
    return new KeyedJobRunner<unknown, unknown, Message>({
      keys,
      timing: resolveWorkerTiming({}, keys.options.leaseMs),
      identityOf: (message) => identityFromWireContract({ id: message.id, name: 'charge', data: message.data }) as JobIdentity<unknown>,
      handler: async (ctx) => {
        ran.push(ctx.key);
        return ctx.transaction(async () => ({ ok: true }));
      },
      logger,
      events: { wanted: () => true, emit: (event) => events.push(event) },
    });
  }
  const deliver = (id: string, data: unknown) => ({ message: { id, data }, id, label: `Job ${id}`, queue: 'q', name: 'charge', lastAttempt: false, deferrals: 0 });

  it('runs with the retention it asked for, held to the bounds with a warning in its log and an event', async () => {
    const keys = keysWith({ maxJobRetentionMs: 6 * HOUR, maxJobTombstoneMs: 60 * DAY });
    const lines: string[] = [];
    const events: WorkerEvent[] = [];
    const ran: string[] = [];
    const jobs = runner(keys, lines, events, ran);

    const asked = await jobs.run(deliver('1', toWireJobData('w', 'within', { n: 1 }, { retention: { resultMs: 2 * HOUR, tombstoneMs: 20 * DAY } })));
    expect(asked.kind).toBe('completed');
    expect(await retentionOf('w', 'within')).toEqual({ status: 'completed', retentionMs: 2 * HOUR, tombstoneMs: 20 * DAY });
    expect(lines).toEqual([]);

    const over = await jobs.run(deliver('2', toWireJobData('w', 'over', { n: 2 }, { retention: { resultMs: 90 * DAY, tombstoneMs: 400 * DAY } })));
    expect(over.kind).toBe('completed');
    expect(await retentionOf('w', 'over')).toEqual({ status: 'completed', retentionMs: 6 * HOUR, tombstoneMs: 60 * DAY });
    const warnings = lines.map((line) => JSON.parse(line) as { msg: string; key: string; retentionPart: string; askedMs: number; boundMs: number });
    expect(warnings.map(({ key, retentionPart, askedMs, boundMs }) => ({ key, retentionPart, askedMs, boundMs }))).toEqual([
      { key: 'over', retentionPart: 'resultMs', askedMs: 90 * DAY, boundMs: 6 * HOUR },
      { key: 'over', retentionPart: 'tombstoneMs', askedMs: 400 * DAY, boundMs: 60 * DAY },
    ]);
    expect(warnings[0]!.msg).toMatch(/more than the bound maxJobRetentionMs \(MAX_JOB_RETENTION_MS\)/);
    expect(events.filter((event) => event.kind === 'retention-clamped').map((event) => [event.key, event.retentionPart])).toEqual([
      ['over', 'resultMs'],
      ['over', 'tombstoneMs'],
    ]);
    expect(ran).toEqual(['within', 'over']);
  });

  it('is invalid job data when malformed: the job fails as invalid, no key is written, nothing runs', async () => {
    const keys = keysWith();
    const lines: string[] = [];
    const ran: string[] = [];
    const jobs = runner(keys, lines, [], ran);
    const malformed = [{ resultMs: -1 }, { resultMs: 1.5 }, { resultMs: 'forever' }, { tombstoneMs: -1 }, { resultMs: 1e300 }, { resultMs: 0 }, { days: 3 }, 'a week', null];
    for (const [i, retention] of malformed.entries()) {
      const outcome = await jobs.run(deliver(`bad-${i}`, { idempotencyKey: `bad-${i}`, scope: 'm', payload: { i }, retention }));
      expect(outcome.kind, JSON.stringify(retention)).toBe('invalid-message');
      const error = (outcome as { error: unknown }).error;
      expect(error).toBeInstanceOf(ValidationError);
      expect(error).toMatchObject({ code: 'INVALID_JOB_DATA', field: expect.stringMatching(/^job\.data\.retention/) });
      expect((error as Error).message).toMatch(/"retention"/);
    }
    expect(ran).toEqual([]);
    expect(await keyRowCount('m')).toBe(0);
    // The producer's side refuses the same before anything is enqueued.
    expect(() => toWireJobData('m', 'k', {}, { retention: { resultMs: -1 } })).toThrow(/retention/);
  });
});

describe('migration 023', () => {
  it('keeps the earlier signatures callable (workers of an earlier version during a rolling upgrade)', async () => {
    const keys = keysWith();
    const outcome = await keys.claim('u', 'old-worker', keys.fingerprint(1));
    if (!isHeld(outcome)) throw new Error(outcome.kind);
    const fn = (name: string) => sql.raw(`${env.schema}.${name}`);
    await sql`select ${fn('complete_key')}(${'u'}::text, ${'old-worker'}::text, ${outcome.owner}::uuid, ${outcome.fence}::bigint, '{"old":true}'::jsonb, ${HOUR}::bigint, 'channel'::text)`.execute(env.db);
    expect(await retentionOf('u', 'old-worker')).toEqual({ status: 'completed', retentionMs: HOUR, tombstoneMs: null });
    await sql`select ${fn('insert_completed_keys')}(
      array['u'], array['old-group'], array['fp'], array[gen_random_uuid()], array[${HOUR}::bigint], 1000,
      array[null::text], array[null::text], array[null::text], array[null::jsonb], array['1'::jsonb])`.execute(env.db);
    expect(await retentionOf('u', 'old-group')).toEqual({ status: 'completed', retentionMs: HOUR, tombstoneMs: null });
    await env.db.transaction().execute(async (tx) => {
      const fast = await keys.executeOnce('u', 'old-fast', keys.fingerprint(2), async () => undefined);
      if (fast.kind !== 'executed') throw new Error(fast.kind);
      await sql`select ${fn('store_fast_path_result')}(${'u'}::text, ${'old-fast'}::text, ${fast.claim.owner}::uuid, '2'::jsonb)`.execute(tx);
    });
    expect((await keys.get('u', 'old-fast'))?.result).toBe(2);
  });
});
