/**
 * Pipelines (src/store/pipeline.ts): several statements in one round trip, each with its own
 * parameters, and exactly what became of each, read from Postgres's answer.
 */
import { CompiledQuery, sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sendStatements } from '../src/store/pipeline.js';
import { runPipeline } from '../src/store/pipeline-protocol.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let client: pg.Client;
const q = (text: string, parameters: unknown[] = []) => CompiledQuery.raw(text, parameters);
let table: string;

beforeAll(async () => {
  env = await createTestEnv('pipeline');
  table = `${pg.escapeIdentifier(env.schema)}.rows`;
  await sql`create table ${sql.id(env.schema, 'rows')} (n int primary key, t text)`.execute(env.db);
  client = new pg.Client({ connectionString: env.databaseUrl });
  await client.connect();
});
afterAll(async () => {
  await client?.end();
  await env?.teardown();
});

async function rowsNow(): Promise<number[]> {
  const { rows } = await client.query<{ n: number }>(`select n from ${table} order by n`);
  return rows.map((row) => row.n);
}

describe('a pipeline', () => {
  it('answers each statement with its own result, parameters and all, in one round trip', async () => {
    const reply = await runPipeline(client, [q('select $1::int + 1 as n', [41]), q(`insert into ${table} values ($1, $2) returning n`, [1, 'one']), q('select $1::bytea as b', [Buffer.from('hi')])]);
    expect(reply.failure).toBeUndefined();
    expect(reply.results.map((r) => r.rows)).toEqual([[{ n: 42 }], [{ n: 1 }], [{ b: Buffer.from('hi') }]]);
    expect(reply.results[1]!.numAffectedRows).toBe(1n);
    await client.query(`delete from ${table}`);
  });

  it.each([0, 1, 2, 3])('a syntax error at position %i: the statements before it ran, it reports its own error, none after it ran', async (position) => {
    const statements = [0, 1, 2, 3].map((i) => (i === position ? q('selec 1') : q(`insert into ${table} values ($1)`, [i])));
    await client.query('begin');
    const reply = await runPipeline(client, [...statements, q(`select count(*)::int as c from ${table}`)]);
    expect(reply.failure).toMatchObject({ index: position, error: { code: '42601' } });
    expect(reply.results).toHaveLength(position);
    await client.query('rollback');
    // Without a BEGIN the statements up to the Sync are one implicit transaction: the failure undoes them all.
    const implicit = await runPipeline(client, statements);
    expect(implicit.failure?.index).toBe(position);
    expect(await rowsNow()).toEqual([]);
  });

  it('a NUL in a parameter is the statement\'s own error (22021), and the connection stays usable', async () => {
    const reply = await runPipeline(client, [q('select 1 as one'), q('select $1::text as t', ['a\u0000b'])]);
    expect(reply.failure).toMatchObject({ index: 1, error: { code: '22021' } });
    expect((await client.query('select 2 as two')).rows).toEqual([{ two: 2 }]);
  });

  it('a value node-postgres cannot convert fails its statement; only the statements before it are sent', async () => {
    const circular: Record<string, unknown> = {};
    circular.self = circular;
    const reply = await runPipeline(client, [q(`insert into ${table} values ($1)`, [7]), q('select $1::jsonb', [circular]), q(`insert into ${table} values ($1)`, [8])]);
    expect(reply.failure?.index).toBe(1);
    expect(reply.results).toHaveLength(1);
    expect(await rowsNow()).toEqual([7]);
    await client.query(`delete from ${table}`);
  });

  it('a COMMIT in the middle ends its transaction: what came before it is kept whatever fails after it', async () => {
    const reply = await runPipeline(client, [q('begin'), q(`insert into ${table} values (9)`), q('commit'), q('begin'), q('selec')]);
    expect(reply.failure?.index).toBe(4);
    await client.query('rollback');
    expect(await rowsNow()).toEqual([9]);
    await client.query(`delete from ${table}`);
  });

  it('rejects when the connection fails: what ran is unknown', async () => {
    const victim = new pg.Client({ connectionString: env.databaseUrl });
    await victim.connect();
    victim.on('error', () => {});
    const pid = (await victim.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0]!.pid;
    // Its outcome is taken at once: the rejection may come while the termination is still awaited.
    const running = runPipeline(victim, [q('select pg_sleep(5)'), q('select 1')]).then(
      (reply) => ({ resolved: reply }),
      (error: unknown) => ({ rejected: error }),
    );
    await new Promise((resolve) => setTimeout(resolve, 200));
    await client.query('select pg_terminate_backend($1)', [pid]);
    // The server says why it ends the session (57P01, the sleeping statement's), then closes it.
    expect(await running).toMatchObject({ rejected: { code: '57P01' } });
    await victim.end().catch(() => {});
  });

  it('rejects when the session ends after every statement completed: a FATAL at the Sync is no statement\'s failure', async () => {
    const victim = new pg.Client({ connectionString: env.databaseUrl });
    await victim.connect();
    victim.on('error', () => {});
    // The backend ends itself once its statement is done: the FATAL answers the Sync.
    const outcome = await runPipeline(victim, [q('select 1'), q('select pg_terminate_backend(pg_backend_pid())')]).then(
      (reply) => ({ resolved: reply }),
      (error: unknown) => ({ rejected: error }),
    );
    expect(outcome).toMatchObject({ rejected: { code: '57P01' } });
    await victim.end().catch(() => {});
  });

  it("a commit failing at the Sync (no BEGIN; a deferred constraint) is the last statement's failure, and nothing is kept", async () => {
    await client.query(`create table ${table}_parent (id int primary key)`);
    await client.query(`create table ${table}_child (id int references ${table}_parent deferrable initially deferred)`);
    const reply = await runPipeline(client, [q(`insert into ${table} values (7)`), q(`insert into ${table}_child values (1)`)]);
    expect(reply.failure).toMatchObject({ index: 1, error: { code: '23503' } });
    expect(reply.results).toHaveLength(1);
    expect(await rowsNow()).toEqual([]);
  });

  it('over a Kysely instance that cannot pipeline, sends the statements one after another with the same answer', async () => {
    const { Kysely, PostgresDialect } = await import('kysely');
    const pool = new pg.Pool({ connectionString: env.databaseUrl, max: 1 });
    const plainDb = new Kysely<any>({ dialect: new PostgresDialect({ pool }) });
    try {
      const reply = await sendStatements(plainDb, [q('select 1 as one'), q('selec'), q('select 3')]);
      expect(reply.failure).toMatchObject({ index: 1, error: { code: '42601' } });
      expect(reply.results.map((r) => r.rows)).toEqual([[{ one: 1 }]]);
      const pipelined = await sendStatements(env.db, [q('select 1 as one'), q('selec'), q('select 3')]);
      expect(pipelined.failure).toMatchObject({ index: 1, error: { code: '42601' } });
      expect(pipelined.results.map((r) => r.rows)).toEqual([[{ one: 1 }]]);
    } finally {
      await plainDb.destroy();
    }
  });
});
