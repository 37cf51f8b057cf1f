/**
 * The Knex data layer (`idempotent-jobs/knex`): the shared suite over a Knex instance of its own
 * (client `pg`), the effect written with Knex's query builder; then what is Knex's own: its `?`
 * placeholders and the COMMIT it would take as committed.
 */
import knex, { type Knex } from 'knex';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { knexDataLayer } from '../src/knex/index.js';
import { describeDataLayer } from './support/data-layer-suite.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const openKnex = (databaseUrl: string) => knex({ client: 'pg', connection: databaseUrl, pool: { min: 0, max: 8 } });

describeDataLayer<Knex.Transaction>('knex', async (databaseUrl, schema) => {
  const db = openKnex(databaseUrl);
  return {
    layer: knexDataLayer(db),
    insert: async (trx, row) => {
      await trx.withSchema(schema).table('ledger').insert(row);
    },
    query: (trx, text) => trx.raw(text),
    close: () => db.destroy(),
  };
});

describe('knex: its own transaction and raw SQL', () => {
  let env: TestEnv;
  let db: Knex;

  beforeAll(async () => {
    env = await createTestEnv('dl_knex_own');
    db = openKnex(env.databaseUrl);
  });

  afterAll(async () => {
    await db?.destroy();
    await env?.teardown();
  });

  it("runs a statement with $n placeholders (repeated, out of order) and the text's own ? unchanged", async () => {
    const layer = knexDataLayer(db);
    const { rows } = await layer.transaction((_trx, run) =>
      run(`select $2::text as second, $1::int as first, '{"a": 1}'::jsonb ? 'a' as has_a, $2::text as again, '?' as mark`, [7, 'x']),
    );
    expect(rows).toEqual([{ second: 'x', first: 7, has_a: true, again: 'x', mark: '?' }]);
  });

  it('refuses a statement Knex would send altered (a backslash before ?), and one whose placeholder has no parameter', async () => {
    const layer = knexDataLayer(db);
    await expect(layer.transaction((_trx, run) => run(`select E'\\?' as mark`, []))).rejects.toThrow(/Knex cannot send this statement unchanged/);
    await expect(layer.transaction((_trx, run) => run('select $2::int as n', [1]))).rejects.toThrow(/placeholder \$2 has no parameter/);
  });

  it('pins the transaction to read committed, whatever the session\'s default', async () => {
    // Directly, not through a pooler: a startup option makes every session serializable.
    const strict = knex({ client: 'pg', connection: { connectionString: env.databaseDirectUrl, options: '-c default_transaction_isolation=serializable' }, pool: { min: 0, max: 1 } });
    try {
      expect((await strict.raw('show transaction_isolation')).rows).toEqual([{ transaction_isolation: 'serializable' }]);
      const { rows } = await knexDataLayer(strict).transaction((_trx, run) => run('select current_setting($1) as level', ['transaction_isolation']));
      expect(rows).toEqual([{ level: 'read committed' }]);
    } finally {
      await strict.destroy();
    }
  });

  it('rejects a COMMIT that Postgres answered with ROLLBACK (an error caught inside), and keeps nothing', async () => {
    await db.raw(`create table ${env.schema}.marks (name text not null)`);
    const layer = knexDataLayer(db);
    const committed = layer.transaction(async (trx) => {
      await trx.withSchema(env.schema).table('marks').insert({ name: 'aborted' });
      await trx.raw('select * from no_such_table_anywhere').catch(() => undefined);
      return 'looks fine';
    });
    await expect(committed).rejects.toMatchObject({ code: '25P02', name: 'AbortedTransactionError' });
    expect(await db.withSchema(env.schema).table('marks').select('name')).toEqual([]);
    // The connection went back usable: the next transaction commits.
    await layer.transaction(async (trx) => {
      await trx.withSchema(env.schema).table('marks').insert({ name: 'kept' });
    });
    expect(await db.withSchema(env.schema).table('marks').select('name')).toEqual([{ name: 'kept' }]);
  });

  it("gives the driver's error of a terminated backend, with its SQLSTATE", async () => {
    const layer = knexDataLayer(db);
    const error = await layer.transaction((trx) => trx.raw('select pg_terminate_backend(pg_backend_pid())')).then(
      () => undefined,
      (thrown: unknown) => thrown,
    );
    expect(layer.driverError(error)).toMatchObject({ code: '57P01' });
  });
});
