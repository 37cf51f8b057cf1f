/**
 * The Drizzle data layer (`idempotent-jobs/drizzle`): the shared suite over both of Drizzle's
 * Postgres drivers, node-postgres and postgres.js. The effect inserts with Drizzle's query builder.
 */
import { sql } from 'drizzle-orm';
import { drizzle as drizzleNodePg } from 'drizzle-orm/node-postgres';
import { drizzle as drizzlePostgresJs } from 'drizzle-orm/postgres-js';
import { integer, pgSchema, text } from 'drizzle-orm/pg-core';
import pg from 'pg';
import postgres from 'postgres';
import { drizzleDataLayer } from '../src/drizzle/index.js';
import { describeDataLayer } from './support/data-layer-suite.js';

const ledgerIn = (schema: string) =>
  pgSchema(schema).table('ledger', { key: text('key').notNull(), fence: integer('fence').notNull(), worker: text('worker').notNull() });

type Tx = { insert: (...args: any[]) => any; execute: (...args: any[]) => any };

describeDataLayer<Tx>('drizzle over node-postgres', async (databaseUrl, schema) => {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 8 });
  pool.on('error', () => {});
  const db = drizzleNodePg(pool);
  const ledger = ledgerIn(schema);
  return {
    layer: drizzleDataLayer(db) as never,
    insert: async (tx, row) => {
      await tx.insert(ledger).values(row);
    },
    query: (tx, statement) => tx.execute(sql.raw(statement)),
    close: () => pool.end(),
  };
});

describeDataLayer<Tx>('drizzle over postgres.js', async (databaseUrl, schema) => {
  const client = postgres(databaseUrl, { max: 8, onnotice: () => {} });
  const db = drizzlePostgresJs(client);
  const ledger = ledgerIn(schema);
  return {
    layer: drizzleDataLayer(db) as never,
    insert: async (tx, row) => {
      await tx.insert(ledger).values(row);
    },
    query: (tx, statement) => tx.execute(sql.raw(statement)),
    close: () => client.end({ timeout: 5 }),
  };
}, {
  // Drizzle's postgres.js driver runs its transactions in sql.begin, whose ROLLBACK after a
  // terminated backend is written to the closed socket from a timer: an uncaught TypeError
  // (postgres.js issues #1154, #1208). The postgres.js adapter avoids sql.begin for this reason.
  backendTermination: 'postgres.js 3.4 crashes the process in sql.begin when the backend is terminated (issues #1154, #1208)',
});
