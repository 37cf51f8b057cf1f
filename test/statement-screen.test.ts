/** The statement screen (src/store/statement-screen.ts): what a job's statement does to its transaction, read from its text. */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { screenStatement } from '../src/store/statement-screen.js';

describe('screenStatement', () => {
  it.each([
    'begin',
    'BEGIN;',
    'start transaction isolation level serializable',
    'commit',
    '  /* a comment */ COMMIT',
    '-- why\ncommit',
    'end',
    'rollback',
    'rollback and chain',
    'abort',
    "prepare transaction 'x'",
    "commit prepared 'x'",
    "rollback prepared 'x'",
    'insert into t values (1); commit',
  ])('%j ends the transaction', (text) => {
    expect(screenStatement(text).effect).toBe('ends-transaction');
  });

  it.each([
    'set local synchronous_commit = off',
    "SET search_path = 'x'",
    'set role app_user',
    'set constraints all immediate',
    'set transaction read only',
    'reset all',
    "select set_config('app.tenant', $1, true)",
    "select pg_catalog.set_config ('app.tenant', 'x', true)",
    'create temp table scratch (n int)',
    'create temporary table scratch (n int)',
    'create global temporary table scratch (n int)',
    'discard all',
    'listen channel',
    'unlisten *',
    'prepare fetch_one as select 1',
    'deallocate fetch_one',
    "load 'auto_explain'",
    'select pg_advisory_lock(42)',
    'select pg_try_advisory_lock_shared(1, 2)',
    'select pg_catalog.pg_advisory_unlock_all()',
    'create function pg_temp.helper() returns int language sql as $$ select 1 $$',
    'create or replace view pg_temp.v as select 1',
    'declare orders_cursor cursor for select * from orders',
    'DECLARE c NO SCROLL CURSOR WITH HOLD FOR select 1',
    'select * into temp scratch from orders',
    'with paid as (select 1 as n) select n into temporary table scratch from paid',
    "do $$ begin perform set_config('app.tenant', 'x', true); end $$",
    'DO LANGUAGE plpgsql $body$ begin create temp table t (n int); end $body$',
    'explain analyze create temp table scratch as select 1',
    'explain (analyze, buffers) select 1',
    'explain (format json, buffers, summary, analyze) create temp table t as select 1',
    'create or replace temp view orders as select 1 as id',
    'create or replace global temporary table t (n int)',
    'select 1 as a into local temp t',
    'select 1 as a into pg_temp.t',
    'create table "pg_temp".t (n int)',
    'create table pg_temp . t (n int)',
    'select "set_config"(\'app.tenant\', \'x\', true)',
    'select pg_catalog."set_config"(\'app.tenant\', \'x\', true)',
    'select "pg_advisory_lock"(4242)',
    "select query_to_xml('select set_config(''app.tenant'', ''x'', true)', true, false, '')",
    "select * from ts_stat('select to_tsvector(set_config(''a.b'', ''c'', true))')",
    "update pg_settings set setting = 'off' where name = 'synchronous_commit'",
    "UPDATE pg_catalog.pg_settings SET setting = 'off' WHERE name = 'search_path'",
    'create function f() returns int language sql as $$ select 1 $$',
    'create or replace procedure p() language sql as $$ select 1 $$',
  ])('%j leaves state behind', (text) => {
    expect(screenStatement(text).effect).toBe('leaves-state');
  });

  it.each([
    'select 1',
    'rollback to savepoint mine',
    'ROLLBACK TO mine',
    'savepoint mine',
    'release savepoint mine',
    "select 'commit; set x = 1; set_config(' as text",
    'select "set_config" from t',
    'update t set n = n + 1 where k = $1',
    'insert into t (commit_at) values (now())',
    'select $$ begin; commit; $$',
    'select $tag$ set local x = 1 $tag$',
    "select E'it\\'s; commit'",
    '/* commit */ select 1',
    'select 1 -- ; commit',
    'create table t (n int)',
    'with x as (select 1) select * from x for update',
    'lock table t in exclusive mode',
    // A transaction-level advisory lock ends with the transaction: a group-mate that takes it gets it, as alone.
    'select pg_advisory_xact_lock(42)',
    'select * from pg_temp.scratch',
    // A table called temp, not a temporary table.
    'insert into temp (n) values (1)',
    // EXPLAIN alone plans, runs nothing.
    'explain select * from orders',
    "select setting from pg_settings where name = 'work_mem'",
    'create or replace view orders_paid as select 1 as id',
    'insert into "pg_temp_orders" values (1)',
    'select * from orders where note = $1 and kind = \'into temp\'',
  ])('%j is plain', (text) => {
    expect(screenStatement(text).effect).toBe('plain');
  });

  it('reads savepoint commands and their names, as Postgres reads them', () => {
    expect(screenStatement('SAVEPOINT Mine').savepoints).toEqual([{ op: 'open', name: 'mine' }]);
    expect(screenStatement('savepoint "Mine ""1"""').savepoints).toEqual([{ op: 'open', name: 'Mine "1"' }]);
    expect(screenStatement('release savepoint a').savepoints).toEqual([{ op: 'release', name: 'a' }]);
    expect(screenStatement('release a').savepoints).toEqual([{ op: 'release', name: 'a' }]);
    expect(screenStatement('rollback to savepoint a').savepoints).toEqual([{ op: 'rollback-to', name: 'a' }]);
    expect(screenStatement('ROLLBACK TO "a"').savepoints).toEqual([{ op: 'rollback-to', name: 'a' }]);
    expect(screenStatement('savepoint a; insert into t values (1); release a').savepoints).toEqual([
      { op: 'open', name: 'a' },
      { op: 'release', name: 'a' },
    ]);
    expect(screenStatement("select 'savepoint a'").savepoints).toEqual([]);
  });

  it('counts the statements of a text, empty ones left out', () => {
    expect(screenStatement('select 1').statements).toBe(1);
    expect(screenStatement('select 1;').statements).toBe(1);
    expect(screenStatement("select 1; select ';'; ; select 3").statements).toBe(3);
    expect(screenStatement('select $$;$$').statements).toBe(1);
  });

  it('reads a text as Postgres does under either standard_conforming_strings: where the readings differ, the stronger effect, and at least leaves-state', () => {
    // Off, a backslash escapes in every string: '\'' is one string, and what follows is code.
    expect(screenStatement("select '\\''; commit; select ''").effect).toBe('ends-transaction');
    expect(screenStatement("select '\\'', set_config('app.tenant', 'a', true), ''").effect).toBe('leaves-state');
    // On, '\' is a whole string, and what follows is code.
    expect(screenStatement("select '\\'; set local work_mem = '1MB'; select '").effect).toBe('leaves-state');
    // Readings that differ only in what is a string run alone, never in a group.
    expect(screenStatement("select '\\', '; select 1; --'")).toMatchObject({ effect: 'leaves-state', statements: 2 });
    // Where both readings agree, nothing changes: a backslash inside a string, E'…' strings.
    expect(screenStatement("select 'C:\\'")).toEqual({ effect: 'plain', statements: 1, savepoints: [] });
    expect(screenStatement("select '\\d+' as pattern, E'it\\'s'")).toEqual({ effect: 'plain', statements: 1, savepoints: [] });
  });

  it('reads nothing inside a string literal as code, whatever the string holds', () => {
    fc.assert(
      fc.property(fc.string(), (content) => {
        // A literal that holds `content` whatever standard_conforming_strings says: with a
        // backslash, an escape string (E'…', backslashes doubled), which reads alike under both.
        const literal = content.includes('\\') ? `E'${content.replaceAll('\\', '\\\\').replaceAll("'", "''")}'` : `'${content.replaceAll("'", "''")}'`;
        const screened = screenStatement(`select ${literal} as s`);
        expect(screened).toEqual({ effect: 'plain', statements: 1, savepoints: [] });
      }),
    );
  });
});
