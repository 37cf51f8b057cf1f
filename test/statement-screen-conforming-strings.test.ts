/**
 * The statement screen under `standard_conforming_strings = off` (a role's, a database's or a
 * connection's setting): there a backslash escapes in every quoted string, so `'\''` is one
 * string, and a text the standard reading takes for strings only may hold a COMMIT, or a call of
 * set_config. On real Postgres: that reading is Postgres's, and a job whose statement hides a
 * call that leaves state runs alone, so no group-mate runs under what it set.
 */
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, createPostgresDb } from '../src/index.js';
import { PostgresKeyStore } from '../src/store/postgres-key-store.js';
import { withGroupStatements } from './support/protocol-fixtures.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

/** Under standard_conforming_strings = off: a string, then COMMIT, then an empty string. On: a string, then a string up to the end. */
const HIDDEN_COMMIT = "select '\\''; commit; select ''";
/** One statement. Off: a string, a call of set_config, an empty string. On: three strings, no call. */
const HIDDEN_SET_CONFIG = "select '\\'', set_config('app.tenant', 'tenant-A', true), ''";

let env: TestEnv;
let nonConforming: Kysely<any>;

/** This file's database URL with `standard_conforming_strings` off on every connection. */
function nonConformingUrl(): string {
  const url = new URL(env.databaseUrl);
  url.searchParams.set('options', '-c standard_conforming_strings=off -c escape_string_warning=off');
  return url.toString();
}

beforeAll(async () => {
  env = await createTestEnv('conforming');
  // Unnamed statements, as through PgBouncer: a text without parameters then goes by the simple
  // protocol, which runs every statement it holds (a named one refuses a text of several).
  nonConforming = createPostgresDb({ connectionString: nonConformingUrl(), maxConnections: 2, preparedStatements: false });
  await sql`create table ${sql.id(env.schema, 'effects')} (key text primary key, seen text, txid bigint not null default txid_current())`.execute(env.db);
});

afterAll(async () => {
  await nonConforming?.destroy();
  await env?.teardown();
});

describe('standard_conforming_strings = off', () => {
  it("is how Postgres reads the text: '\\'' is one string, and the COMMIT after it runs", async () => {
    const client = new pg.Client({ connectionString: nonConformingUrl() });
    await client.connect();
    try {
      const table = `${env.schema}.committed_by_the_text`;
      await client.query('begin');
      await client.query(`create table ${table} (n int)`);
      await client.query(HIDDEN_COMMIT);
      await client.query('rollback'); // nothing left to roll back: the text's COMMIT ended the transaction
      const { rows } = await client.query<{ exists: boolean }>(`select to_regclass('${table}') is not null as exists`);
      expect(rows[0]!.exists).toBe(true);
    } finally {
      await client.end();
    }
  });

  it("a set_config hidden from the standard reading ('\\'', set_config(…)) makes its job run alone: no group-mate runs under the setting", async () => {
    // A group whose state is checked at its end only, and watches no setting: what a database
    // without code that leaves state gets (see group-commit.test.ts, 6b). The screen's reading
    // is all that keeps the setting from the group-mates.
    const store = new PostgresKeyStore(nonConforming, env.schema, { probeSettledKeys: false });
    const state = store.groupStatements.state!;
    const clean = withGroupStatements(store, { ...store.groupStatements, state: { ...state, watched: async () => ({ ...(await state.watched()), codeCanLeaveState: false }) } });
    const keys = new IdempotencyKeys({ db: nonConforming, schema: env.schema, leaseMs: 30_000, groupCommit: { maxGroups: 1, watchSettings: [] } }, clean);
    const effects = sql.id(env.schema, 'effects');
    const outcomes = await Promise.all(
      Array.from({ length: 6 }, (_, i) =>
        keys.executeOnce('conforming', `hidden-${i}`, keys.fingerprint({ i }), async (tx) => {
          if (i === 0) await sql.raw(HIDDEN_SET_CONFIG).execute(tx);
          await sql`insert into ${effects} (key, seen) values (${`hidden-${i}`}, current_setting('app.tenant', true))`.execute(tx);
          return i;
        }, { databaseOnly: true }),
      ),
    );
    expect(outcomes.map((outcome) => outcome.kind)).toEqual(Array(6).fill('executed'));
    const { rows } = await sql<{ key: string; seen: string | null; txid: string }>`select key, seen, txid::text from ${effects} where key like 'hidden-%' order by key`.execute(env.db);
    expect(rows.map((row) => [row.key, row.seen === 'tenant-A'])).toEqual(rows.map((row) => [row.key, row.key === 'hidden-0']));
    // The job that set it committed in a transaction of its own.
    expect(rows.filter((row) => row.txid === rows[0]!.txid)).toHaveLength(1);
  });
});
