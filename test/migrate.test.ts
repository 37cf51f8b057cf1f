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
