/**
 * Group commit checks the shared transaction's state after each job only where code stored in
 * the database could leave state behind the statement screen's back (`codeCanLeaveState`,
 * `sql/group-settings.ts`). Read here on a database of its own, which holds only what each case
 * creates: the shared test database holds other files' functions.
 */
import { sql, type Kysely } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresDb, migrate } from '../src/index.js';
import { PostgresKeyStore } from '../src/store/postgres-key-store.js';
import { LIBRARY_FUNCTIONS, codeCanLeaveState } from '../src/store/sql/group-settings.js';
import { withAnotherDatabase } from './support/another-database.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;

beforeAll(async () => {
  env = await createTestEnv('group_state_code');
});
afterAll(async () => {
  await env?.teardown();
});

/** Runs `body` on a new database holding the library's schema (`idempotent_jobs`) and a schema `app`. */
async function onOwnDatabase(body: (db: Kysely<any>) => Promise<void>): Promise<void> {
  await withAnotherDatabase(env, async (databaseUrl) => {
    const db = createPostgresDb({ connectionString: databaseUrl, maxConnections: 2 }, () => {});
    try {
      await migrate(db, { schema: 'idempotent_jobs' });
      await sql`create schema app`.execute(db);
      await sql`create table app.orders (id int primary key, status text, tenant text)`.execute(db);
      await body(db);
    } finally {
      await db.destroy();
    }
  });
}

describe('code that can leave state in a transaction', () => {
  it("the library's own functions are the list it does not read, and with them alone nothing can", async () => {
    await onOwnDatabase(async (db) => {
      const { rows } = await sql<{ proname: string }>`
        select p.proname from pg_proc as p join pg_namespace as n on n.oid = p.pronamespace
         where n.nspname = 'idempotent_jobs' order by 1`.execute(db);
      // Names, each once: a function may have forms of several signatures (wake_concurrency_waiters).
      expect([...new Set(rows.map((row) => row.proname))]).toEqual([...LIBRARY_FUNCTIONS].sort());
      expect(await codeCanLeaveState(db)).toBe(false);
    });
  });

  it('functions that read, triggers that compute and views cannot', async () => {
    await onOwnDatabase(async (db) => {
      await sql`create function app.count_orders() returns bigint language sql as $$ select count(*) from app.orders $$`.execute(db);
      await sql`create function app.paid_count() returns bigint language sql return (select count(*) from app.orders where status = 'paid')`.execute(db);
      await sql`create function app.stamp() returns trigger language plpgsql as $$
        begin new.status := coalesce(new.status, 'new'); return new; end $$`.execute(db);
      await sql`create trigger stamp before insert on app.orders for each row execute function app.stamp()`.execute(db);
      await sql`create view app.paid as select * from app.orders where status = 'paid'`.execute(db);
      // The library's schema under another name, as a second store would have it.
      await migrate(db, { schema: 'jobs_eu' });
      expect(await codeCanLeaveState(db)).toBe(false);
    });
  });

  it('a store reads it again once its read is watchedStateMaxAgeMs old: code a migration adds while it runs is known', async () => {
    await onOwnDatabase(async (db) => {
      const watched = () => new PostgresKeyStore(db, 'idempotent_jobs', { watchedStateMaxAgeMs: 0 }).groupStatements.state!.watched;
      const read = watched();
      expect((await read()).codeCanLeaveState).toBe(false);
      await sql`create function app.as_tenant(p text) returns void language plpgsql as $$ begin perform set_config('app.tenant', p, true); end $$`.execute(db);
      // The old answer serves while the new read runs; the next call has it.
      expect((await read()).codeCanLeaveState).toBe(false);
      expect(await read()).toMatchObject({ codeCanLeaveState: true, names: expect.arrayContaining(['app.tenant']) });
      // A read that does not age is the first one for good.
      const kept = new PostgresKeyStore(db, 'idempotent_jobs').groupStatements.state!.watched;
      await sql`drop function app.as_tenant(text)`.execute(db);
      expect((await kept()).codeCanLeaveState).toBe(false);
      await sql`create function app.as_tenant(p text) returns void language plpgsql as $$ begin perform set_config('app.tenant', p, true); end $$`.execute(db);
      expect((await kept()).codeCanLeaveState).toBe(false);
    });
  });

  it('refuses a watchedStateMaxAgeMs that is not a number of milliseconds', () => {
    expect(() => new PostgresKeyStore(env.db, env.schema, { watchedStateMaxAgeMs: -1 })).toThrow(/watchedStateMaxAgeMs/);
    expect(() => new PostgresKeyStore(env.db, env.schema, { watchedStateMaxAgeMs: Number.NaN })).toThrow(/watchedStateMaxAgeMs/);
  });

  const leaving: Array<[string, string]> = [
    ['a set_config in a function', `create function app.as_tenant(p text) returns void language plpgsql as $$ begin perform set_config('app.tenant', p, true); end $$`],
    ['a SET in a function', `create function app.slow() returns void language plpgsql as $$ begin set local statement_timeout = '1min'; end $$`],
    ['a SET in a SQL function', `create function app.slow_sql() returns void language sql as $$ set local statement_timeout = '1min' $$`],
    ['a temporary table made in a function', `create function app.scratch() returns void language plpgsql as $$ begin create temp table scratch (id int) on commit drop; end $$`],
    ['a cursor a function opens', `create function app.orders_cursor() returns refcursor language plpgsql as $$ declare c refcursor := 'c'; begin open c for select * from app.orders; return c; end $$`],
    ['dynamic SQL', `create function app.run(p text) returns void language plpgsql as $$ begin execute p; end $$`],
    ['a trigger that sets a setting', `create function app.tag() returns trigger language plpgsql as $$ begin perform set_config('app.last_order', new.id::text, true); return new; end $$`],
    ['a view that calls set_config', `create view app.tenant_orders as select o.*, set_config('app.seen', '1', true) as seen from app.orders as o`],
    ['a column default that calls set_config', `alter table app.orders add column noted text default set_config('app.noted', 'yes', true)`],
    ["a function in a library schema that is not the library's", `create function idempotent_jobs.my_helper() returns void language plpgsql as $$ begin perform set_config('app.x', '1', true); end $$`],
    // The read errs on the side of checking: a SET after a comment, or an UPDATE's SET, counts.
    ['a SET after a comment', `create function app.quick() returns void language plpgsql as $$ begin -- safe to replay
 set local synchronous_commit = off; end $$`],
    ["an UPDATE's SET", `create function app.mark_paid(p_id int) returns void language plpgsql as $$ begin update app.orders set status = 'paid' where id = p_id; end $$`],
    ["a body in the SQL standard's form", `create function app.as_tenant_std(t text) returns text language sql return set_config('app.tenant', t, true)`],
    ['an update of pg_settings in a function', `create function app.async() returns void language sql as $$ update pg_settings set setting = 'off' where name = 'synchronous_commit' $$`],
    ['a rule that updates pg_settings', `create rule async_orders as on insert to app.orders do also update pg_settings set setting = 'off' where name = 'synchronous_commit'`],
    ['a query run from a string', `create view app.tenant_xml as select query_to_xml('select set_config(''app.tenant'', ''x'', true)', true, false, '') as x`],
    ["a domain's check", `create domain app.tenant_id as text check (set_config('app.tenant', value, true) is not null)`],
    ["a trigger's condition", `create function app.noop() returns trigger language plpgsql as $$ begin return new; end $$; create trigger tenant_of before insert on app.orders for each row when (set_config('app.tenant', new.tenant, true) is not null) execute function app.noop()`],
    ['a function in language internal', `create function app.set_setting(text, text, boolean) returns text language internal as 'set_config_by_name'`],
  ];

  it.each(leaving)('%s can', async (_name, ddl) => {
    await onOwnDatabase(async (db) => {
      await sql.raw(ddl).execute(db);
      expect(await codeCanLeaveState(db)).toBe(true);
    });
  });
});
