/** Charges orders: the payment row and the job's key commit in one transaction, once per order. */
import { sql } from 'kysely';
import { IdempotencyKeys, createIdempotentWorker, createPostgresDb, databaseOnly, migrate } from 'idempotent-jobs';
import { loadEnvConfig } from 'idempotent-jobs/process';

const config = loadEnvConfig();
const db = createPostgresDb({ connectionString: config.DATABASE_URL, maxConnections: 4 });
await migrate(db, { schema: config.SCHEMA });
const charges = sql.id(config.SCHEMA, 'order_charges');
await sql`create table if not exists ${charges} (order_id text primary key, cents integer not null)`.execute(db);

const worker = createIdempotentWorker({
  queue: 'payments',
  connection: { url: config.REDIS_URL },
  prefix: config.REDIS_PREFIX,
  keys: new IdempotencyKeys({ db, schema: config.SCHEMA }),
  concurrency: 4,
  handler: databaseOnly(async (tx, ctx) => {
    const { orderId, cents } = ctx.data as { orderId: string; cents: number };
    await sql`insert into ${charges} (order_id, cents) values (${orderId}, ${cents})`.execute(tx);
    return { charged: cents };
  }),
});
console.log('payment worker running');

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, async () => {
    await worker.close();
    await db.destroy();
  });
}
