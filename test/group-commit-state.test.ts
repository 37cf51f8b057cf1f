/**
 * Group commit: no state a job leaves in the shared transaction reaches a group-mate, however it
 * was made. The state is checked after each job's statements (see `sql/group-settings.ts`; this
 * file's functions are code that can leave state, so every store here checks after each job), so
 * a function that changes it where the statement screen cannot look, and a later job that puts
 * it back (A-B-A), are found; a job found leaving state runs alone, and so does its kind.
 */
import { sql, type Kysely } from 'kysely';
import { register } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, createPostgresDb } from '../src/index.js';
import { PostgresKeyStore } from '../src/store/postgres-key-store.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let plain: IdempotencyKeys;
const scope = 'state';
const t = (name: string) => sql.id(env.schema, name);

beforeAll(async () => {
  env = await createTestEnv('group_state');
  plain = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000, groupCommit: false });
  await sql`create table ${t('seen')} (key text primary key, txid bigint not null default txid_current(), seen jsonb not null)`.execute(env.db);
  // What a job sees of the state it runs under.
  await sql`create function ${t('state_seen')}() returns jsonb language sql as $$
    select jsonb_build_object(
      'tenant', current_setting('app.tenant', true),
      'scratch', to_regclass('pg_temp.scratch') is not null,
      'cursor', exists (select from pg_cursors where name = 'left_open'),
      'prepared', exists (select from pg_prepared_statements where name like 'left\\_prepared\\_%'))
  $$`.execute(env.db);
  // State made where the statement screen cannot see it: inside functions.
  await sql`create function ${t('set_tenant')}(p_value text) returns void language plpgsql as $$
    begin perform set_config('app.tenant', p_value, true); end $$`.execute(env.db);
  await sql`create function ${t('make_scratch')}() returns void language plpgsql as $$
    begin create temp table if not exists scratch (n int) on commit drop; end $$`.execute(env.db);
  await sql`create function ${t('open_cursor')}() returns void language plpgsql as $$
    declare c refcursor := 'left_open'; begin open c for select 1; end $$`.execute(env.db);
  // A new prepared statement at each call, so that every run of the job makes one.
  await sql`create function ${t('prepare_quietly')}() returns void language plpgsql as $$
    begin execute format('prepare left_prepared_%s as select 1', replace(gen_random_uuid()::text, '-', '')); end $$`.execute(env.db);
});
afterAll(async () => {
  await env?.teardown();
});

/**
 * A pool of its own whose sessions start with `app.tenant` = 'none' (a session-level state a
 * job may leave, such as a prepared statement, dies with it), and an `IdempotencyKeys` with one
 * group at a time over it.
 */
function ownPool(watchSettings: readonly string[] = []) {
  const url = new URL(env.databaseUrl);
  url.searchParams.set('options', '-c app.tenant=none');
  const db = createPostgresDb({ connectionString: url.toString(), maxConnections: 3, preparedStatements: env.preparedStatements });
  const store = new PostgresKeyStore(db, env.schema, { probeSettledKeys: false });
  const keys = new IdempotencyKeys({ db, schema: env.schema, leaseMs: 30_000, groupCommit: { maxGroups: 1, watchSettings } }, store);
  return { keys, db };
}

/**
 * Runs 8 fast-path jobs submitted together (one group); job `i` first does `change[i]` (if any),
 * then records what it sees. Returns each job's outcome and the rows.
 */
async function groupOfEight(keys: IdempotencyKeys, prefix: string, change: Record<number, (tx: Kysely<any>) => Promise<unknown>>, jobName?: (i: number) => string) {
  const settled = await Promise.allSettled(
    Array.from({ length: 8 }, (_, i) =>
      keys.executeOnce(
        scope,
        `${prefix}${i}`,
        plain.fingerprint({ key: `${prefix}${i}` }),
        async (tx) => {
          await change[i]?.(tx);
          await sql`insert into ${t('seen')} (key, seen) values (${`${prefix}${i}`}, ${t('state_seen')}())`.execute(tx);
          return i;
        },
        jobName ? { jobName: jobName(i) } : {},
      ),
    ),
  );
  const { rows } = await sql<{ key: string; txid: string; seen: { tenant: string; scratch: boolean; cursor: boolean; prepared: boolean } }>`
    select key, txid, seen from ${t('seen')} where key like ${`${prefix}%`} order by key`.execute(keys.db);
  return { settled, rows };
}

const call = (fn: string, ...args: string[]) => (tx: Kysely<any>) => sql`select ${t(fn)}(${sql.join(args)})`.execute(tx);

describe('no state a job leaves reaches a group-mate, however it was made', () => {
  it('a setting changed inside a function and put back by a later job (A-B-A) is seen by no group-mate', async () => {
    const { keys, db } = ownPool(['app.tenant']);
    try {
      const { settled, rows } = await groupOfEight(keys, 'aba-', { 2: call('set_tenant', 'tenant-A'), 5: call('set_tenant', 'none') });
      expect(settled.every((s) => s.status === 'fulfilled')).toBe(true);
      expect(rows).toHaveLength(8);
      expect(rows.filter((row) => row.seen.tenant === 'tenant-A').map((row) => row.key)).toEqual(['aba-2']);
      // The job that left it ran alone, in a transaction of its own.
      const own = rows.find((row) => row.key === 'aba-2')!;
      expect(rows.filter((row) => row.txid === own.txid)).toHaveLength(1);
    } finally {
      await db.destroy();
    }
  });

  it('a custom setting that only a function of the database names (no declaration, no watchSettings) is watched', async () => {
    const { keys, db } = ownPool();
    try {
      const { rows } = await groupOfEight(keys, 'found-', { 1: call('set_tenant', 'tenant-B') });
      expect(rows.filter((row) => row.seen.tenant === 'tenant-B').map((row) => row.key)).toEqual(['found-1']);
    } finally {
      await db.destroy();
    }
  });

  it('a prepared statement a function made: the group rolls back at its end, deallocating it, and every job runs alone', async () => {
    const { keys, db } = ownPool();
    try {
      const { settled, rows } = await groupOfEight(keys, 'prepared-', { 3: call('prepare_quietly') });
      expect(settled.every((s) => s.status === 'fulfilled')).toBe(true);
      expect(rows).toHaveLength(8);
      const own = rows.find((row) => row.key === 'prepared-3')!;
      expect(own.seen.prepared).toBe(true);
      // No group committed with it: the job that made it shares its transaction with no job.
      expect(rows.filter((row) => row.txid === own.txid)).toHaveLength(1);
    } finally {
      await db.destroy();
    }
  });

  it('once a group\'s end found a prepared statement, each job\'s check looks for them: the next job making one is found, and its kind runs alone', async () => {
    const { keys, db } = ownPool();
    const refusals = async () => Number((await register.getSingleMetricAsString('idempotent_jobs_group_commit_refusals_total')).match(/reason="state-left-behind"} (\d+)/)?.[1] ?? 0);
    try {
      const kindOf = (i: number) => (i === 3 ? 'preparing-job' : 'plain-job');
      const change = { 3: call('prepare_quietly') };
      const before = await refusals();
      // Found at the group's end: nobody to blame yet, so every job ran alone.
      await groupOfEight(keys, 'prepared-first-', change, kindOf);
      expect(await refusals()).toBe(before);
      // Found after its job: that job is to blame, and its group-mates share a transaction again.
      const later = await groupOfEight(keys, 'prepared-later-', change, kindOf);
      expect(await refusals()).toBe(before + 1);
      const plain = later.rows.find((row) => row.key === 'prepared-later-0')!;
      expect(later.rows.filter((row) => row.txid === plain.txid).length).toBeGreaterThan(2);
      // Its kind runs alone from the start: no group rolls back for it.
      const third = await groupOfEight(keys, 'prepared-third-', change, kindOf);
      expect(await refusals()).toBe(before + 1);
      const own = third.rows.find((row) => row.key === 'prepared-third-3')!;
      expect(third.rows.filter((row) => row.txid === own.txid)).toHaveLength(1);
      expect(third.settled.every((s) => s.status === 'fulfilled')).toBe(true);
    } finally {
      await db.destroy();
    }
  });

  it.each([
    ['a temporary table made inside a function (on commit drop)', 'make_scratch', 'scratch'],
    ['a cursor a function opened and left open', 'open_cursor', 'cursor'],
  ] as const)('%s is seen by no group-mate; that job runs alone', async (_, fn, part) => {
    const { keys, db } = ownPool();
    try {
      const prefix = `${part}-`;
      const { settled, rows } = await groupOfEight(keys, prefix, { 3: call(fn) });
      expect(settled.every((s) => s.status === 'fulfilled')).toBe(true);
      expect(rows).toHaveLength(8);
      expect(rows.filter((row) => row.seen[part]).map((row) => row.key)).toEqual([`${prefix}3`]);
    } finally {
      await db.destroy();
    }
  });

  it('on a session with temporary objects from before the group, those are no job\'s (the group commits whole) and one made inside is still found', async () => {
    // One connection: the temporary table made here stays in the session every group runs on.
    const url = new URL(env.databaseUrl);
    url.searchParams.set('options', '-c app.tenant=none');
    const db = createPostgresDb({ connectionString: url.toString(), maxConnections: 1, preparedStatements: env.preparedStatements });
    const store = new PostgresKeyStore(db, env.schema, { probeSettledKeys: false });
    const keys = new IdempotencyKeys({ db, schema: env.schema, leaseMs: 30_000, groupCommit: { maxGroups: 1 } }, store);
    try {
      await sql`create temp table kept_before (n int)`.execute(db);
      const before = await groupOfEight(keys, 'temp-before-', {});
      expect(before.settled.every((s) => s.status === 'fulfilled')).toBe(true);
      expect(new Set(before.rows.map((row) => row.txid)).size).toBe(1);
      const made = await groupOfEight(keys, 'temp-made-', { 5: call('make_scratch') });
      expect(made.settled.every((s) => s.status === 'fulfilled')).toBe(true);
      expect(made.rows.filter((row) => row.seen.scratch).map((row) => row.key)).toEqual(['temp-made-5']);
      const own = made.rows.find((row) => row.key === 'temp-made-5')!;
      expect(made.rows.filter((row) => row.txid === own.txid)).toHaveLength(1);
    } finally {
      await db.destroy();
    }
  });

  it('a savepoint a job leaves open, or one of a group-mate\'s that it names, sends that job alone; balanced savepoints share the group', async () => {
    const { keys, db } = ownPool();
    try {
      const { settled, rows } = await groupOfEight(keys, 'sp-', {
        1: async (tx) => {
          await sql`savepoint mine`.execute(tx);
          await sql`insert into ${t('seen')} (key, seen) values ('sp-1-inner', '{}')`.execute(tx);
          await sql`release savepoint mine`.execute(tx);
        },
        4: (tx) => sql`savepoint left_open`.execute(tx),
        6: (tx) => sql`rollback to savepoint left_open`.execute(tx),
      });
      // Job 6 names a savepoint it never opened: alone, Postgres refuses it as its own error.
      expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled', 'fulfilled', 'fulfilled', 'fulfilled', 'rejected', 'fulfilled']);
      expect((settled[6] as PromiseRejectedResult).reason).toMatchObject({ code: '3B001' });
      expect(rows.map((row) => row.key)).toEqual(['sp-0', 'sp-1', 'sp-1-inner', 'sp-2', 'sp-3', 'sp-4', 'sp-5', 'sp-7']);
      const own = rows.find((row) => row.key === 'sp-4')!;
      expect(rows.filter((row) => row.txid === own.txid)).toHaveLength(1);
      const grouped = rows.find((row) => row.key === 'sp-1')!;
      expect(rows.filter((row) => row.txid === grouped.txid).length).toBeGreaterThan(2);
    } finally {
      await db.destroy();
    }
  });

  it('a job found leaving state is counted by reason, and later jobs of its kind run alone from the start (no group rolled back for them)', async () => {
    const { keys, db } = ownPool();
    const refusals = async () => (await register.getSingleMetricAsString('idempotent_jobs_group_commit_refusals_total')).match(/reason="state-left-behind"} (\d+)/)?.[1];
    try {
      const before = Number((await refusals()) ?? 0);
      const kindOf = (i: number) => (i % 2 === 0 ? 'scratch-job' : 'plain-job');
      const change = { 0: call('make_scratch'), 2: call('make_scratch'), 4: call('make_scratch'), 6: call('make_scratch') };
      await groupOfEight(keys, 'kind-first-', change, kindOf);
      // One rolled-back group found the first; its kind ran alone from then on.
      expect(Number(await refusals())).toBe(before + 1);
      const { rows } = await groupOfEight(keys, 'kind-later-', change, kindOf);
      expect(Number(await refusals())).toBe(before + 1);
      expect(rows.filter((row) => row.seen.scratch).map((row) => row.key)).toEqual(['kind-later-0', 'kind-later-2', 'kind-later-4', 'kind-later-6']);
      const alone = rows.filter((row) => row.key.match(/[0246]$/)).map((row) => row.txid);
      expect(new Set(alone).size).toBe(4);
      for (const txid of alone) expect(rows.filter((row) => row.txid === txid)).toHaveLength(1);
    } finally {
      await db.destroy();
    }
  });
});
