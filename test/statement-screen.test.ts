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

  it('reads nothing inside a string literal as code, whatever the string holds', () => {
    fc.assert(
      fc.property(fc.string(), (content) => {
        const literal = `'${content.replaceAll("'", "''")}'`;
        const screened = screenStatement(`select ${literal} as s`);
        expect(screened).toEqual({ effect: 'plain', statements: 1, savepoints: [] });
      }),
    );
  });
});
