/** The postgres.js data layer (`idempotent-jobs/postgres-js`): the shared suite over a client of its own. */
import postgres, { type ReservedSql } from 'postgres';
import { postgresJsDataLayer } from '../src/postgres-js/index.js';
import { describeDataLayer } from './support/data-layer-suite.js';

describeDataLayer<ReservedSql<any>>('postgres.js', async (databaseUrl, schema) => {
  const sql = postgres(databaseUrl, { max: 8, onnotice: () => {} });
  return {
    layer: postgresJsDataLayer(sql),
    insert: async (tx, row) => {
      await tx`insert into ${tx(schema)}.ledger (key, fence, worker) values (${row.key}, ${row.fence}, ${row.worker})`;
    },
    query: (tx, text) => tx.unsafe(text),
    close: () => sql.end({ timeout: 5 }),
  };
});
