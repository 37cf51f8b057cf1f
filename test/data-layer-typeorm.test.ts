/** The TypeORM data layer (`idempotent-jobs/typeorm`): the shared suite over a DataSource of its own; the effect saves an entity. */
import { DataSource, EntitySchema, type EntityManager } from 'typeorm';
import { typeormDataLayer } from '../src/typeorm/index.js';
import { describeDataLayer } from './support/data-layer-suite.js';

interface LedgerRow {
  id?: number;
  key: string;
  fence: number;
  worker: string;
}

describeDataLayer<EntityManager>('typeorm', async (databaseUrl, schema) => {
  const Ledger = new EntitySchema<LedgerRow>({
    name: 'Ledger',
    tableName: 'ledger',
    schema,
    columns: {
      id: { type: 'bigint', primary: true, generated: true },
      key: { type: 'text' },
      fence: { type: 'int' },
      worker: { type: 'text' },
    },
  });
  const dataSource = await new DataSource({ type: 'postgres', url: databaseUrl, entities: [Ledger], poolSize: 8 }).initialize();
  return {
    layer: typeormDataLayer(dataSource),
    insert: async (manager, row) => {
      await manager.insert(Ledger, row);
    },
    query: (manager, text) => manager.query(text),
    close: () => dataSource.destroy(),
  };
});
