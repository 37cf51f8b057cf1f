import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createPostgresDb, migrate } from '../src/index.js';
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
