/**
 * A BullMQ worker with a database-only handler that persists a MikroORM entity (`mikroOrmDataLayer(orm.em)`): the ledger row and the key's completion commit in the same
 * MikroORM transaction. One payment is added twice (two job ids) and another once; the ledger
 * ends with one row per key. The queue is named after SCHEMA and removed at the end.
 */
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { IdempotencyKeys, createIdempotentWorker, createPostgresDb, databaseOnly, migrate, toWireJobData, type DatabaseOnlyJobContext } from 'idempotent-jobs';
import { loadEnvConfig } from 'idempotent-jobs/process';
import { EntitySchema, MikroORM } from '@mikro-orm/postgresql';
import { mikroOrmDataLayer } from 'idempotent-jobs/mikro-orm';

const config = loadEnvConfig();
const connection = { url: config.REDIS_URL };
// The keys, in the same database as the ledger (the library's own pool).
const keysDb = createPostgresDb({ connectionString: config.DATABASE_URL, maxConnections: 4 });
await migrate(keysDb, { schema: config.SCHEMA });
const ledgerTable = `"${config.SCHEMA}".mikro_orm_ledger`;
// No unique constraint on the key: a job that ran twice would leave two rows.
await sql`create table if not exists ${sql.raw(ledgerTable)} (key text not null, cents integer not null)`.execute(keysDb);

const Ledger = new EntitySchema<{ key: string; cents: number }>({
  name: 'Ledger',
  tableName: 'mikro_orm_ledger',
  schema: config.SCHEMA,
  properties: { key: { type: 'string', primary: true }, cents: { type: 'number' } },
});
const orm = await MikroORM.init({ clientUrl: config.DATABASE_URL, entities: [Ledger], pool: { min: 0, max: 4 } });
const ledger = mikroOrmDataLayer(orm.em);

interface Charge {
  readonly cents: number;
}

const queue = `${config.SCHEMA}-example-mikro-orm`;
const worker = createIdempotentWorker({
  queue,
  connection,
  prefix: config.REDIS_PREFIX,
  keys: new IdempotencyKeys({ db: keysDb, schema: config.SCHEMA }),
  concurrency: 1,
  logger: pino({ level: config.LOG_LEVEL }),
  // Database-only: claim, row and result in one MikroORM transaction (the fast path); MikroORM
  // flushes the persisted entity before it commits.
  handler: databaseOnly(ledger, async (em, ctx: DatabaseOnlyJobContext<Charge>) => {
    em.persist(em.create(Ledger, { key: ctx.key, cents: ctx.data.cents }));
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
await orm.close();
await keysDb.destroy();
