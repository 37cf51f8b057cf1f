/**
 * The store's pool starts every session at read committed, whatever the server, database or
 * role default: under a serializable default, the leased path's single-statement claims of one
 * key by concurrent duplicates would otherwise fail with serialization errors (40001). The
 * serializable default comes from a role of this file's own (ALTER ROLE … SET), dropped after:
 * the shared server's settings are never touched.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresDb, IdempotencyKeys } from '../src/index.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
const role = `ij_serializable_${randomBytes(4).toString('hex')}`;
const dbs: Kysely<any>[] = [];

beforeAll(async () => {
  env = await createTestEnv('read_committed_session');
  await sql`create role ${sql.id(role)} login`.execute(env.db);
  await sql`alter role ${sql.id(role)} set default_transaction_isolation = 'serializable'`.execute(env.db);
  await sql`grant usage on schema ${sql.id(env.schema)} to ${sql.id(role)}`.execute(env.db);
  await sql`grant all on all tables in schema ${sql.id(env.schema)} to ${sql.id(role)}`.execute(env.db);
});
afterAll(async () => {
  await Promise.all(dbs.map((db) => db.destroy()));
  await sql`drop owned by ${sql.id(role)}`.execute(env.db);
  await sql`drop role if exists ${sql.id(role)}`.execute(env.db);
  await env?.teardown();
});

/** The shared server's URL as the serializable role, with `query` parameters added. */
function roleUrl(query: Record<string, string> = {}): string {
  const url = new URL(env.databaseUrl);
  url.username = role;
  url.password = '';
  for (const [name, value] of Object.entries(query)) url.searchParams.set(name, value);
  return url.toString();
}

function storeDb(connectionString: string): Kysely<any> {
  const db = createPostgresDb({ connectionString, maxConnections: 12, applicationName: 'test:read-committed' });
  dbs.push(db);
  return db;
}

async function settingsOf(db: Kysely<any>): Promise<{ isolation: string; timeout: string }> {
  const { rows } = await sql<{ isolation: string; timeout: string }>`select current_setting('transaction_isolation') as isolation, current_setting('statement_timeout') as timeout`.execute(db);
  return rows[0]!;
}

describe('createPostgresDb under a role whose default isolation is serializable', () => {
  it("the role's own sessions are serializable (the test's premise)", async () => {
    const client = new pg.Client({ connectionString: roleUrl() });
    await client.connect();
    try {
      expect((await client.query('show transaction_isolation')).rows[0].transaction_isolation).toBe('serializable');
    } finally {
      await client.end();
    }
  });

  it("starts the store's sessions at read committed", async () => {
    expect((await settingsOf(storeDb(roleUrl()))).isolation).toBe('read committed');
  });

  it("keeps the connection string's own startup options, and still pins read committed", async () => {
    const settings = await settingsOf(storeDb(roleUrl({ options: '-c statement_timeout=4321 -c default_transaction_isolation=serializable' })));
    expect(settings).toEqual({ isolation: 'read committed', timeout: '4321ms' });
  });

  it('concurrent duplicate claims of one key (leased path, autocommit) meet no serialization failure', async () => {
    const keys = new IdempotencyKeys({ db: storeDb(roleUrl()), schema: env.schema, leaseMs: 30_000 });
    for (let round = 0; round < 5; round++) {
      const key = `dup-${round}-${randomUUID()}`;
      const fingerprint = keys.fingerprint({ key });
      const outcomes = await Promise.allSettled(Array.from({ length: 8 }, () => keys.claim('s', key, fingerprint)));
      const rejected = outcomes.filter((o) => o.status === 'rejected').map((o) => String((o as PromiseRejectedResult).reason));
      expect(rejected).toEqual([]);
      const kinds = outcomes.map((o) => (o as PromiseFulfilledResult<{ kind: string }>).value.kind);
      expect(kinds.filter((kind) => kind === 'claimed')).toHaveLength(1);
    }
  });
});
