/**
 * The statement-fault tool (test/support/statement-faults.ts) against real Postgres: each fault
 * leaves the database as the real event would (a cut before a statement: it never ran; after an
 * autocommit statement or a COMMIT: it committed, the reply lost; after a statement inside a
 * transaction or in the middle of a pipeline: rolled back), and each error is the driver's own,
 * classified as the store classifies it.
 */
import { sql, type Kysely } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sendStatements } from '../src/store/pipeline.js';
import { transientStoreFault } from '../src/store/pg-errors.js';
import { BEGIN, COMMIT } from '../src/store/transaction-control.js';
import { StatementFaults } from './support/statement-faults.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let faults: StatementFaults;

beforeAll(async () => {
  env = await createTestEnv('statement_faults');
  await sql`create table ${sql.id(env.schema, 'rows')} (n int not null)`.execute(env.db);
  faults = StatementFaults.open({ connectionString: env.databaseUrl, maxConnections: 2, preparedStatements: env.preparedStatements });
});
afterAll(async () => {
  await faults?.close();
  await env?.teardown();
});

const insert = (db: Kysely<any>, n: number) => sql`insert into ${sql.id(env.schema, 'rows')} (n) values (${n})`.execute(db);
const rowsWith = async (n: number) => Number((await sql<{ c: string }>`select count(*) as c from ${sql.id(env.schema, 'rows')} where n = ${n}`.execute(env.db)).rows[0]!.c);
const compiled = (n: number) => sql`insert into ${sql.id(env.schema, 'rows')} (n) values (${n})`.compile(env.db);

describe('a cut connection', () => {
  it('before an autocommit statement: it never ran; the error is a connection fault', async () => {
    faults.arm({ nth: 1, fault: { kind: 'cut', when: 'before' } });
    const error = await insert(faults.db, 1).catch((e: unknown) => e);
    expect(transientStoreFault(error)).toBe('connection');
    expect(await rowsWith(1)).toBe(0);
    expect(faults.fired.at(-1)!.statement.text).toMatch(/^insert into/);
  });

  it('after an autocommit statement: it committed, the reply was lost', async () => {
    faults.arm({ nth: 1, fault: { kind: 'cut', when: 'after' } });
    const error = await insert(faults.db, 2).catch((e: unknown) => e);
    expect(transientStoreFault(error)).toBe('connection');
    expect(await rowsWith(2)).toBe(1);
  });

  it('after a statement inside a transaction: the transaction rolled back', async () => {
    // begin, insert (cut after it), …
    faults.arm({ nth: 2, fault: { kind: 'cut', when: 'after' } });
    const error = await faults.db
      .transaction()
      .execute((tx) => insert(tx, 3))
      .catch((e: unknown) => e);
    expect(transientStoreFault(error)).toBe('connection');
    expect(await rowsWith(3)).toBe(0);
  });

  it('in a pipeline: after its middle statement nothing of it commits; after its last (COMMIT) all of it did', async () => {
    faults.arm({ nth: 2, fault: { kind: 'cut', when: 'after' } });
    const middle = await sendStatements(faults.db, [BEGIN, compiled(4), COMMIT]).catch((e: unknown) => e);
    expect(transientStoreFault(middle)).toBe('connection');
    expect(await rowsWith(4)).toBe(0);

    faults.arm({ nth: 3, fault: { kind: 'cut', when: 'after' } });
    const last = await sendStatements(faults.db, [BEGIN, compiled(5), COMMIT]).catch((e: unknown) => e);
    expect(transientStoreFault(last)).toBe('connection');
    expect(await rowsWith(5)).toBe(1);

    faults.arm({ nth: 3, fault: { kind: 'cut', when: 'before' } });
    const beforeCommit = await sendStatements(faults.db, [BEGIN, compiled(6), COMMIT]).catch((e: unknown) => e);
    expect(transientStoreFault(beforeCommit)).toBe('connection');
    expect(await rowsWith(6)).toBe(0);
  });
});

describe('an error raised in place of a statement', () => {
  it('is the SQLSTATE asked for, on an intact connection; the statements after it in the pipeline are skipped', async () => {
    faults.arm({ nth: 2, fault: { kind: 'error', sqlState: '53100', message: 'could not extend file: No space left on device' } });
    const reply = await sendStatements(faults.db, [compiled(7), compiled(8), compiled(9)]);
    expect(reply.failure?.index).toBe(1);
    expect(reply.failure?.error).toMatchObject({ code: '53100', message: 'could not extend file: No space left on device' });
    expect(transientStoreFault(reply.failure?.error)).toBe('connection');
    // One implicit transaction: the statement before the failed one was undone with it.
    expect([await rowsWith(7), await rowsWith(8), await rowsWith(9)]).toEqual([0, 0, 0]);

    faults.arm({ nth: 1, fault: { kind: 'error', sqlState: '40001' } });
    const alone = await insert(faults.db, 10).catch((e: unknown) => e);
    expect(alone).toMatchObject({ code: '40001' });
    expect(transientStoreFault(alone)).toBe('conflict');
    expect(await rowsWith(10)).toBe(0);
  });
});

describe('counting', () => {
  it('lists the statements of a run, counts only matching ones, and repeats a fault `times`', async () => {
    faults.disarm();
    const { statements } = await faults.statementsOf(() => faults.db.transaction().execute((tx) => insert(tx, 11)));
    expect(statements.map((s) => s.text.split(' ')[0])).toEqual(['begin', 'insert', 'commit']);

    faults.arm({ nth: 2, match: /^insert/, fault: { kind: 'error', sqlState: '53100' }, times: Infinity });
    await insert(faults.db, 12);
    expect(await insert(faults.db, 13).catch((e: unknown) => e)).toMatchObject({ code: '53100' });
    expect(await insert(faults.db, 14).catch((e: unknown) => e)).toMatchObject({ code: '53100' });
    expect(faults.armed).toBe(true);
    faults.disarm();
    await insert(faults.db, 15);
    expect([await rowsWith(12), await rowsWith(13), await rowsWith(14), await rowsWith(15)]).toEqual([1, 0, 0, 1]);
  });
});
