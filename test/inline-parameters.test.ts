import fc from 'fast-check';
import { CompiledQuery, sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inlineParameters } from '../src/store/inline-parameters.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;

beforeAll(async () => {
  env = await createTestEnv('inline_params');
});
afterAll(async () => {
  await env?.teardown();
});

/** Runs `text` with bind parameters, and again with them inlined; both answers (rows or error codes). */
async function bothWays(text: string, parameters: unknown[]) {
  const run = async (query: string, values: unknown[]) => {
    try {
      return { rows: await rawQuery(query, values) };
    } catch (error) {
      return { error: (error as { code?: string }).code ?? String(error) };
    }
  };
  const inlined = inlineParameters(text, parameters);
  expect(inlined).toBeDefined();
  return { bound: await run(text, parameters), inlined: await run(inlined!, []) };
}

async function rawQuery(text: string, values: unknown[]): Promise<unknown> {
  return (await env.db.executeQuery(CompiledQuery.raw(text, values))).rows;
}

describe('inlineParameters', () => {
  it('1. finds placeholders only in code: not in strings, quoted identifiers, dollar quotes, comments or identifiers', () => {
    const text = `select '$1', E'\\' $1', "a$1", a$1, $$ $1 $$, $tag$ $1 $tag$, /* /* $1 */ $1 */ $1 -- $1\n, $2, $10`;
    const params = Array.from({ length: 10 }, (_, i) => `v${i + 1}`);
    expect(inlineParameters(text, params)).toBe(
      `select '$1', E'\\' $1', "a$1", a$1, $$ $1 $$, $tag$ $1 $tag$, /* /* $1 */ $1 */ 'v1' -- $1\n, 'v2', 'v10'`,
    );
  });

  it('2. refuses what it cannot write as a literal: binary values, a placeholder without a value', () => {
    expect(inlineParameters('select $1', [Buffer.from('x')])).toBeUndefined();
    expect(inlineParameters('select $1', [new Uint8Array([1])])).toBeUndefined();
    expect(inlineParameters('select $2', ['only one'])).toBeUndefined();
    expect(inlineParameters('select 1', [])).toBe('select 1');
  });

  it('3. a statement means the same with its parameters inlined (property, against Postgres)', async () => {
    const text = fc.string({ unit: 'grapheme', maxLength: 30 }).filter((s) => !s.includes('\u0000'));
    const json = fc.jsonValue({ maxDepth: 3 }).filter((v) => !JSON.stringify(v).includes('\\u0000'));
    const cases = fc.oneof(
      fc.record({ cast: fc.constant('text'), value: fc.oneof(text, fc.constant("'; drop table x; --"), fc.constant('\\\\ \\\' $1')) }),
      fc.record({ cast: fc.constant('int8'), value: fc.oneof(fc.integer(), fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n })) }),
      fc.record({ cast: fc.constant('float8'), value: fc.double({ noNaN: false }) }),
      fc.record({ cast: fc.constant('bool'), value: fc.boolean() }),
      fc.record({ cast: fc.constant('jsonb'), value: json.map((v) => ({ wrapped: v })) }),
      fc.record({ cast: fc.constant('text[]'), value: fc.array(fc.oneof(text, fc.constant(null)), { maxLength: 4 }) }),
      fc.record({ cast: fc.constant('timestamptz'), value: fc.date({ min: new Date('1970-01-01'), max: new Date('2200-01-01'), noInvalidDate: true }) }),
      fc.record({ cast: fc.constant('text'), value: fc.constant(null) }),
    );
    await fc.assert(
      fc.asyncProperty(cases, async ({ cast, value }) => {
        const { bound, inlined } = await bothWays(`select $1::${cast} as v, 'literal $1' as l`, [value]);
        expect(inlined).toEqual(bound);
      }),
      { numRuns: 150 },
    );
  });

  it('4. untyped placeholders are inferred from their context the same way', async () => {
    await sql`create table ${sql.id(env.schema, 'typed')} (n int, t timestamptz, j jsonb, a int[])`.execute(env.db);
    const insert = `insert into ${env.schema}.typed (n, t, j, a) values ($1, $2, $3, $4) returning n, t, j, a`;
    const values = [42, new Date('2026-11-29T10:00:00Z'), { a: ["it's", 1] }, [1, 2, 3]];
    const { bound, inlined } = await bothWays(insert, values);
    expect(inlined).toEqual(bound);
    expect(await bothWays(`select n + $1 as s from ${env.schema}.typed where n = any($2)`, [1, [42, 7]])).toMatchObject({
      bound: { rows: [{ s: 43 }, { s: 43 }] },
      inlined: { rows: [{ s: 43 }, { s: 43 }] },
    });
  });
});
