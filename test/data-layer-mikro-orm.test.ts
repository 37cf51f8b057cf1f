/**
 * The MikroORM data layer (`idempotent-jobs/mikro-orm`): the shared suite over an ORM of its own
 * (`@mikro-orm/postgresql`), the effect inserting an entity; then what is MikroORM's own: the
 * COMMIT that Knex underneath would take as committed, a transaction of its own inside the
 * caller's, and what the effect persisted without flushing.
 */
import { EntitySchema, MikroORM, type EntityManager } from '@mikro-orm/postgresql';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mikroOrmDataLayer } from '../src/mikro-orm/index.js';
import { describeDataLayer } from './support/data-layer-suite.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

interface LedgerRow {
  id?: string;
  key: string;
  fence: number;
  worker: string;
}

const ledgerIn = (schema: string) =>
  new EntitySchema<LedgerRow>({
    name: 'Ledger',
    tableName: 'ledger',
    schema,
    properties: {
      id: { type: 'bigint', primary: true, autoincrement: true },
      key: { type: 'string' },
      fence: { type: 'number' },
      worker: { type: 'string' },
    },
  });

const openOrm = (databaseUrl: string, entities: EntitySchema<any>[]) =>
  MikroORM.init({ clientUrl: databaseUrl, entities, pool: { min: 0, max: 8 }, allowGlobalContext: true, debug: false });

describeDataLayer<EntityManager>('mikro-orm', async (databaseUrl, schema) => {
  const Ledger = ledgerIn(schema);
  const orm = await openOrm(databaseUrl, [Ledger]);
  return {
    layer: mikroOrmDataLayer(orm.em),
    insert: async (em, row) => {
      await em.insert(Ledger, row);
    },
    query: (em, text) => em.execute(text),
    close: () => orm.close(true),
  };
});

describe('mikro-orm: its own transaction', () => {
  let env: TestEnv;
  let orm: MikroORM;
  let Ledger: EntitySchema<LedgerRow>;

  beforeAll(async () => {
    env = await createTestEnv('dl_mikro_own');
    await env.db.schema.withSchema(env.schema).createTable('ledger')
      .addColumn('id', 'bigint', (column) => column.generatedAlwaysAsIdentity().primaryKey())
      .addColumn('key', 'text', (column) => column.notNull())
      .addColumn('fence', 'integer', (column) => column.notNull())
      .addColumn('worker', 'text', (column) => column.notNull())
      .execute();
    Ledger = ledgerIn(env.schema);
    orm = await openOrm(env.databaseUrl, [Ledger]);
  });

  afterAll(async () => {
    await orm?.close(true);
    await env?.teardown();
  });

  const workers = async (key: string) => (await orm.em.fork().find(Ledger, { key }, { orderBy: { id: 'asc' } })).map((row) => row.worker);

  it('rejects a COMMIT that Postgres answered with ROLLBACK (an error caught inside), and keeps nothing', async () => {
    const layer = mikroOrmDataLayer(orm.em);
    const committed = layer.transaction(async (em) => {
      await em.insert(Ledger, { key: 'aborted', fence: 0, worker: 'a' });
      await em.execute('select * from no_such_table_anywhere').catch(() => undefined);
      return 'looks fine';
    });
    await expect(committed).rejects.toMatchObject({ code: '25P02', name: 'AbortedTransactionError' });
    expect(await workers('aborted')).toEqual([]);
  });

  it('flushes what the effect persisted in the same transaction, and rolls it back with it', async () => {
    const layer = mikroOrmDataLayer(orm.em);
    await layer.transaction(async (em) => {
      em.persist(em.create(Ledger, { key: 'persisted', fence: 0, worker: 'kept' }));
    });
    await expect(
      layer.transaction(async (em, run) => {
        em.persist(em.create(Ledger, { key: 'persisted', fence: 0, worker: 'dropped' }));
        await run('select 1', []);
        throw new Error('changed my mind');
      }),
    ).rejects.toThrow('changed my mind');
    expect(await workers('persisted')).toEqual(['kept']);
  });

  it("opens a transaction of its own inside the caller's: its commit stands when the caller's rolls back", async () => {
    const layer = mikroOrmDataLayer(orm.em);
    await expect(
      orm.em.fork().transactional(async (outer) => {
        await outer.insert(Ledger, { key: 'own', fence: 0, worker: 'outer' });
        await layer.transaction(async (em) => {
          await em.insert(Ledger, { key: 'own', fence: 0, worker: 'inner' });
        });
        throw new Error('the outer transaction fails');
      }),
    ).rejects.toThrow('the outer transaction fails');
    expect(await workers('own')).toEqual(['inner']);
  });

  it("gives the driver's error of a terminated backend, with its SQLSTATE", async () => {
    const layer = mikroOrmDataLayer(orm.em);
    const error = await layer.transaction((em) => em.execute('select pg_terminate_backend(pg_backend_pid())')).then(
      () => undefined,
      (thrown: unknown) => thrown,
    );
    expect(layer.driverError(error)).toMatchObject({ code: '57P01' });
  });

  it('refuses statementsOn outside a transaction, naming what to do', () => {
    const layer = mikroOrmDataLayer(orm.em);
    expect(() => layer.statementsOn!(orm.em.fork())).toThrow(/inside em\.transactional/);
  });
});
