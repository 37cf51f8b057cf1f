import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createPostgresDb, migrate } from '../src/index.js';
import { kyselyOverPool } from '../src/store/pipelining-pool.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
const schema = `t_migrate_race_${randomBytes(4).toString('hex')}`;

beforeAll(async () => {
  env = await createTestEnv('migrate');
});
afterAll(async () => {
  await sql`drop schema if exists ${sql.id(schema)} cascade`.execute(env.db);
  await env?.teardown();
});

it('many processes migrating one fresh schema at once all succeed, and it is applied once', async () => {
  const pools = Array.from({ length: 8 }, () => createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 1 }));
  try {
    const results = await Promise.allSettled(pools.map((db) => migrate(db, { schema })));
    expect(results.filter((r) => r.status === 'rejected')).toEqual([]);
    const applied = results.flatMap((r) => (r.status === 'fulfilled' ? (r.value.results ?? []) : [])).filter((m) => m.status === 'Success');
    expect(applied.map((m) => m.migrationName).sort()).toEqual(
      [...new Set(applied.map((m) => m.migrationName))].sort(),
    );
    const { rows } = await sql<{ n: string }>`select count(*) as n from ${sql.id(schema, 'idempotent_jobs_migration')}`.execute(env.db);
    expect(Number(rows[0]!.n)).toBe(applied.length);
    // And again: nothing left to apply.
    const again = await migrate(pools[0]!, { schema });
    expect(again.results).toEqual([]);
  } finally {
    await Promise.all(pools.map((db) => db.destroy()));
  }
});

/**
 * A Kysely instance whose connections fail the table listing Kysely's Migrator runs (it names
 * `has_schema_privilege`) with `error`, as many times as `failures` says.
 */
function failingListings(failures: { left: number }, error: () => Error) {
  const pool = new pg.Pool({ connectionString: env.databaseUrl, max: 1 });
  pool.on('connect', (client) => {
    const query = client.query.bind(client) as (...args: unknown[]) => unknown;
    (client as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
      if (typeof args[0] === 'string' && args[0].includes('has_schema_privilege') && failures.left-- > 0) return Promise.reject(error());
      return query(...args);
    };
  });
  return kyselyOverPool(pool);
}

it('a migration that meets another schema being dropped (Kysely lists every table) looks again instead of failing', async () => {
  // The race itself is rare and timing-bound; this makes it certain: the first table listing
  // fails exactly as Postgres fails it when another schema vanishes under the listing.
  const fresh = `${schema}_vanishing`;
  const otherVanished = { left: 1 };
  const db = failingListings(otherVanished, () => Object.assign(new Error('schema "someone_elses_schema" does not exist'), { code: '3F000' }));
  const oursVanished = { left: 100 };
  const dbOurs = failingListings(oursVanished, () => Object.assign(new Error(`schema "${fresh}" does not exist`), { code: '3F000' }));
  try {
    const result = await migrate(db, { schema: fresh });
    expect(otherVanished.left).toBeLessThan(0);
    expect(result.results?.length).toBeGreaterThan(0);
    expect(result.results?.every((r) => r.status === 'Success')).toBe(true);
    // An error about our own schema is not retried.
    await expect(migrate(dbOurs, { schema: fresh })).rejects.toThrow(fresh);
    expect(oursVanished.left).toBe(99);
  } finally {
    await sql`drop schema if exists ${sql.id(fresh)} cascade`.execute(env.db);
    await Promise.all([db.destroy(), dbOurs.destroy()]);
  }
});

it('a migration whose table listing meets another schema\'s table being dropped (42P01) looks again too', async () => {
  // Seen in CI: the listing's pg_get_serial_sequence on a table another test file was dropping.
  const fresh = `${schema}_relation_vanishing`;
  const otherVanished = { left: 1 };
  const db = failingListings(otherVanished, () => Object.assign(new Error('relation "someone_elses_schema.idempotency_keys" does not exist'), { code: '42P01' }));
  const oursVanished = { left: 100 };
  const dbOurs = failingListings(oursVanished, () => Object.assign(new Error(`relation "${fresh}.idempotency_keys" does not exist`), { code: '42P01' }));
  try {
    const result = await migrate(db, { schema: fresh });
    expect(otherVanished.left).toBeLessThan(0);
    expect(result.results?.every((r) => r.status === 'Success')).toBe(true);
    await expect(migrate(dbOurs, { schema: fresh })).rejects.toThrow(fresh);
    expect(oursVanished.left).toBe(99);
  } finally {
    await sql`drop schema if exists ${sql.id(fresh)} cascade`.execute(env.db);
    await Promise.all([db.destroy(), dbOurs.destroy()]);
  }
});

it("a migration whose table listing meets another schema's table losing a column (42703, no schema named) looks again too", async () => {
  // Seen in CI: Kysely's listing of every table while another test file's migration dropped
  // key_tombstones.scope in its own schema.
  const fresh = `${schema}_column_vanishing`;
  const otherChanged = { left: 1 };
  const db = failingListings(otherChanged, () => Object.assign(new Error('column "scope" of relation "key_tombstones" does not exist'), { code: '42703' }));
  try {
    const result = await migrate(db, { schema: fresh });
    expect(otherChanged.left).toBeLessThan(0);
    expect(result.results?.every((r) => r.status === 'Success')).toBe(true);
  } finally {
    await sql`drop schema if exists ${sql.id(fresh)} cascade`.execute(env.db);
    await db.destroy();
  }
});

it('024 upgrades a schema of one concurrency record per key: its records are kept, and the old slot function of seven arguments is gone', async () => {
  const upgraded = `${schema}_limit_sets`;
  const t = (name: string) => sql.id(upgraded, name);
  try {
    await migrate(env.db, { schema: upgraded });
    // Back to what 023 left: one record per key, and the seven-argument function a worker of
    // that version calls (its body does not matter here, only that it would make calls ambiguous).
    await sql`alter table ${t('key_concurrency_limits')} drop constraint key_concurrency_limits_pkey`.execute(env.db);
    await sql`alter table ${t('key_concurrency_limits')} add primary key (scope, key)`.execute(env.db);
    await sql`drop function ${t('acquire_concurrency_slot')}(text, int, text, text, uuid, int, int, text[], text, text)`.execute(env.db);
    await sql`create function ${t('acquire_concurrency_slot')}(text, int, text, text, uuid, int, int)
              returns table (slot int, retry_after_ms bigint) language sql as 'select 0, null::bigint'`.execute(env.db);
    await sql`insert into ${t('key_concurrency_limits')} (scope, key, group_key, concurrency_limit) values ('s', 'old', 'tenant:acme', 2)`.execute(env.db);
    // Migrations after 024 run again with it (they are idempotent): Kysely refuses a gap.
    await sql`delete from ${t('idempotent_jobs_migration')} where name >= '024_concurrency_limit_sets'`.execute(env.db);

    const result = await migrate(env.db, { schema: upgraded });
    expect(result.results?.map((r) => [r.migrationName, r.status])[0]).toEqual(['024_concurrency_limit_sets', 'Success']);
    expect(result.results?.every((r) => r.status === 'Success')).toBe(true);
    const { rows } = await sql<{ group_key: string }>`select group_key from ${t('key_concurrency_limits')} where key = 'old'`.execute(env.db);
    expect(rows).toEqual([{ group_key: 'tenant:acme' }]);
    // A call of seven arguments (an earlier worker) resolves to the one function, and a key records two concurrency keys.
    const uuid = '00000000-0000-4000-8000-000000000000';
    await sql`select * from ${t('acquire_concurrency_slot')}('all', 1, 's', 'old', ${uuid}::uuid, 1000, 1000)`.execute(env.db);
    await sql`select * from ${t('acquire_concurrency_slot')}('tenant:acme', 2, 's', 'old', ${uuid}::uuid, 1000, 1000, array['all', 'tenant:acme'])`.execute(env.db);
    const after = await sql<{ group_key: string }>`select group_key from ${t('key_concurrency_limits')} where key = 'old' order by group_key`.execute(env.db);
    expect(after.rows).toEqual([{ group_key: 'all' }, { group_key: 'tenant:acme' }]);
  } finally {
    await sql`drop schema if exists ${sql.id(upgraded)} cascade`.execute(env.db);
  }
});

it('025 upgrades coalescing keys: a key taken before it keeps its state, and a five-argument call (an earlier worker) still resolves', async () => {
  const upgraded = `${schema}_send_order`;
  const t = (name: string) => sql.id(upgraded, name);
  try {
    await migrate(env.db, { schema: upgraded });
    // Back to what 024 left: no send times, and the five-argument function.
    await sql`alter table ${t('coalescing_keys')} drop column newest_sent_at`.execute(env.db);
    await sql`drop function ${t('coalesce_arrive')}(text, text, text, jsonb, int, timestamptz)`.execute(env.db);
    await sql`create function ${t('coalesce_arrive')}(text, text, text, jsonb, int)
              returns table (action text, generation bigint, payload jsonb) language sql as 'select null::text, null::bigint, null::jsonb'`.execute(env.db);
    await sql`insert into ${t('coalescing_keys')} (scope, key, generation) values ('s', 'taken', 3)`.execute(env.db);
    // 025 and the migrations after it (each installs functions only, again as it did).
    await sql`delete from ${t('idempotent_jobs_migration')} where name >= '025_coalescing_send_order'`.execute(env.db);

    const result = await migrate(env.db, { schema: upgraded });
    expect(result.results?.[0]).toMatchObject({ migrationName: '025_coalescing_send_order', status: 'Success' });
    expect(result.results?.every((r) => r.status === 'Success')).toBe(true);
    const { rows } = await sql<{ action: string; generation: string }>`select * from ${t('coalesce_arrive')}('s', 'taken', 'j', '{}'::jsonb, 1000)`.execute(env.db);
    expect(rows[0]).toMatchObject({ action: 'run', generation: '4' });
  } finally {
    await sql`drop schema if exists ${sql.id(upgraded)} cascade`.execute(env.db);
  }
});

it('027 upgrades coalescing keys: a key taken before it keeps its state, and a send time stored ahead of the database clock is brought back to it', async () => {
  const upgraded = `${schema}_ends`;
  const t = (name: string) => sql.id(upgraded, name);
  try {
    await migrate(env.db, { schema: upgraded });
    // Back to what 025 left: no recorded ends, no remembered arrivals, no generation floor.
    await sql`drop table ${t('coalescing_generation_floor')}`.execute(env.db);
    await sql`drop table ${t('coalescing_arrivals')}`.execute(env.db);
    await sql`drop index ${t('coalescing_keys_assigned_at')}`.execute(env.db);
    for (const column of ['finished_generation', 'previous_job', 'previous_generation', 'newest_job']) {
      await sql`alter table ${t('coalescing_keys')} drop column ${sql.id(column)}`.execute(env.db);
    }
    await sql`insert into ${t('coalescing_keys')} (scope, key, generation, running_job, assigned_at, newest_sent_at)
              values ('s', 'ahead', 3, 'j3', now(), now() + interval '10 minutes')`.execute(env.db);
    await sql`insert into ${t('idempotency_keys')} (scope, key, fingerprint, status) values ('s', 'ahead#3', 'fp', 'completed')`.execute(env.db);
    await sql`delete from ${t('idempotent_jobs_migration')} where name >= '027_coalescing_ends'`.execute(env.db);

    const result = await migrate(env.db, { schema: upgraded });
    expect(result.results?.map((r) => [r.migrationName, r.status])[0]).toEqual(['027_coalescing_ends', 'Success']);
    expect(result.results?.every((r) => r.status === 'Success')).toBe(true);
    // Sent by a right clock now: newer than the send time brought back to the clock, and generation 3 has ended: it runs.
    const { rows } = await sql<{ action: string; generation: string }>`
      select * from ${t('coalesce_arrive')}('s', 'ahead', 'j4', '{}'::jsonb, 1000, now() + interval '1 millisecond')`.execute(env.db);
    expect(rows[0]).toMatchObject({ action: 'run', generation: '4' });
    const floor = await sql<{ generation: string }>`select generation from ${t('coalescing_generation_floor')}`.execute(env.db);
    expect(floor.rows).toEqual([{ generation: '0' }]);
  } finally {
    await sql`drop schema if exists ${sql.id(upgraded)} cascade`.execute(env.db);
  }
});

it('028 upgrades concurrency waiters: a waiter recorded before it stays, an eight-argument call (an earlier worker) still resolves, and a refused job is recorded with its job and queue', async () => {
  const upgraded = `${schema}_slot_wakes`;
  const t = (name: string) => sql.id(upgraded, name);
  try {
    await migrate(env.db, { schema: upgraded });
    // Back to what 027 left: waiters without their job, and the eight-argument function.
    await sql`alter table ${t('concurrency_waiters')} drop column job_id, drop column queue, drop column woken_at`.execute(env.db);
    await sql`drop function ${t('acquire_concurrency_slot')}(text, int, text, text, uuid, int, int, text[], text, text)`.execute(env.db);
    await sql`create function ${t('acquire_concurrency_slot')}(text, int, text, text, uuid, int, int, text[] default null)
              returns table (slot int, retry_after_ms bigint) language sql as 'select 0, null::bigint'`.execute(env.db);
    await sql`insert into ${t('concurrency_waiters')} (group_key, scope, key) values ('tenant:acme', 's', 'waiting')`.execute(env.db);
    await sql`delete from ${t('idempotent_jobs_migration')} where name >= '028_concurrency_slot_wakes'`.execute(env.db);

    const result = await migrate(env.db, { schema: upgraded });
    expect(result.results?.map((r) => [r.migrationName, r.status])).toEqual([
      ['028_concurrency_slot_wakes', 'Success'],
      ['029_concurrency_slot_locks', 'Success'],
      ['030_concurrency_slot_walk', 'Success'],
      ['031_concurrency_slot_time', 'Success'],
      ['032_retention_from_commit', 'Success'],
      ['033_concurrency_slots_in_transaction', 'Success'],
      ['034_concurrency_slots_in_groups', 'Success'],
      ['035_concurrency_slot_walk_from_random', 'Success'],
      ['036_concurrency_slot_takes_never_wait', 'Success'],
      ['037_concurrency_takes_without_waiters', 'Success'],
      ['038_concurrency_takes_tell_waiters', 'Success'],
    ]);
    const uuid = '00000000-0000-4000-8000-000000000000';
    // An earlier worker's call: takes the one slot.
    const taken = await sql<{ slot: number }>`select * from ${t('acquire_concurrency_slot')}('tenant:acme', 1, 's', 'old', ${uuid}::uuid, 60000, 60000, null)`.execute(env.db);
    expect(taken.rows[0]).toMatchObject({ slot: 0 });
    // This version's: refused, recorded as a waiter with its job and queue.
    await sql`select * from ${t('acquire_concurrency_slot')}('tenant:acme', 1, 's', 'new', ${uuid}::uuid, 60000, 60000, null, 'job-7', 'syncs')`.execute(env.db);
    const { rows } = await sql<{ key: string; job_id: string | null; queue: string | null }>`
      select key, job_id, queue from ${t('concurrency_waiters')} order by key`.execute(env.db);
    expect(rows).toEqual([
      { key: 'new', job_id: 'job-7', queue: 'syncs' },
      { key: 'waiting', job_id: null, queue: null },
    ]);
  } finally {
    await sql`drop schema if exists ${sql.id(upgraded)} cascade`.execute(env.db);
  }
});
