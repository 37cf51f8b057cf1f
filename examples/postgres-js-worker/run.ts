/**
 * A BullMQ worker with a database-only handler written with postgres.js (`postgresJsDataLayer(client)`): the ledger row and the key's completion commit in the same
 * postgres.js transaction. One payment is added twice (two job ids) and another once; the ledger
 * ends with one row per key. The queue is named after SCHEMA and removed at the end.
 */
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { IdempotencyKeys, createIdempotentWorker, createPostgresDb, databaseOnly, migrate, toWireJobData, type DatabaseOnlyJobContext } from 'idempotent-jobs';
import { loadEnvConfig } from 'idempotent-jobs/process';
import postgres from 'postgres';
import { postgresJsDataLayer } from 'idempotent-jobs/postgres-js';

const config = loadEnvConfig();
const connection = { url: config.REDIS_URL };
// The keys, in the same database as the ledger (the library's own pool).
const keysDb = createPostgresDb({ connectionString: config.DATABASE_URL, maxConnections: 4 });
await migrate(keysDb, { schema: config.SCHEMA });
const ledgerTable = `"${config.SCHEMA}".postgres_js_ledger`;
// No unique constraint on the key: a job that ran twice would leave two rows.
await sql`create table if not exists ${sql.raw(ledgerTable)} (key text not null, cents integer not null)`.execute(keysDb);

const client = postgres(config.DATABASE_URL, { max: 4, onnotice: () => {} });
const ledger = postgresJsDataLayer(client);

interface Charge {
  readonly cents: number;
}

const queue = `${config.SCHEMA}-example-postgres-js`;
const worker = createIdempotentWorker({
  queue,
  connection,
  prefix: config.REDIS_PREFIX,
  keys: new IdempotencyKeys({ db: keysDb, schema: config.SCHEMA }),
  concurrency: 1,
  logger: pino({ level: config.LOG_LEVEL }),
  // Database-only: claim, row and result in one postgres.js transaction (the fast path).
  handler: databaseOnly(ledger, async (tx, ctx: DatabaseOnlyJobContext<Charge>) => {
    await tx.unsafe(`insert into ${ledgerTable} (key, cents) values ($1, $2)`, [ctx.key, ctx.data.cents]);
    return { booked: ctx.data.cents };
  }),
});
let settled = 0;
const allSettled = new Promise<void>((resolve) => {
  worker.on('event', (event) => {
    if (event.kind !== 'completed' && event.kind !== 'replayed') return;
    console.log(`${event.key}: ${event.kind}`);
    if (++settled === 3) resolve();
  });
});

// order-1 twice under two job ids, as a producer's retry would add it; then order-2.
const jobs = new Queue(queue, { connection, prefix: config.REDIS_PREFIX });
for (const [jobId, key, cents] of [['a', 'order-1', 1200], ['b', 'order-1', 1200], ['c', 'order-2', 500]] as const) {
  await jobs.add('payments', toWireJobData(queue, key, { cents }), { jobId }); // scope: the queue
}
await allSettled;
await worker.close();
await jobs.obliterate({ force: true });
await jobs.close();

const { rows } = await sql<{ key: string; n: number }>`select key, count(*)::int as n from ${sql.raw(ledgerTable)} group by key order by key`.execute(keysDb);
console.log(`ledger rows per key: ${JSON.stringify(Object.fromEntries(rows.map((row) => [row.key, row.n])))}`);
await client.end();
await keysDb.destroy();
