/** The node-postgres data layer (`idempotent-jobs/pg`): the shared suite over a pool of its own. */
import pg from 'pg';
import { pgDataLayer } from '../src/pg/index.js';
import { describeDataLayer } from './support/data-layer-suite.js';

describeDataLayer<pg.PoolClient>('node-postgres', async (databaseUrl, schema) => {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 8 });
  pool.on('error', () => {});
  return {
    layer: pgDataLayer(pool),
    insert: async (client, row) => {
      await client.query(`insert into ${pg.escapeIdentifier(schema)}.ledger (key, fence, worker) values ($1, $2, $3)`, [row.key, row.fence, row.worker]);
    },
    query: (client, text) => client.query(text),
    close: () => pool.end(),
  };
});
