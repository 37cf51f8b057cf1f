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
  ])('%j is plain', (text) => {
    expect(screenStatement(text).effect).toBe('plain');
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
        expect(screened).toEqual({ effect: 'plain', statements: 1 });
      }),
    );
  });
});
