/** Fulfils orders: the shipment row and the job's completion commit in one transaction, once per order. */
import { sql } from 'kysely';
import { IdempotencyKeys, createIdempotentWorker, createPostgresDb, migrate } from 'idempotent-jobs';
import { loadEnvConfig } from 'idempotent-jobs/process';

const config = loadEnvConfig();
const db = createPostgresDb({ connectionString: config.DATABASE_URL, maxConnections: 4 });
await migrate(db, { schema: config.SCHEMA });
const shipments = sql.id(config.SCHEMA, 'shipments');
await sql`create table if not exists ${shipments} (order_id text primary key, shipped_at timestamptz not null default now())`.execute(db);

const worker = createIdempotentWorker<{ id: string; cents: number }>({
  queue: 'orders',
  connection: { url: config.REDIS_URL },
  prefix: config.REDIS_PREFIX,
  keys: new IdempotencyKeys({ db, schema: config.SCHEMA }),
  concurrency: 4,
  handler: (ctx) =>
    ctx.transaction(async (tx) => {
      await sql`insert into ${shipments} (order_id) values (${ctx.data.id})`.execute(tx);
      return { shipped: ctx.data.id };
    }),
});
console.log('order worker running');

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, async () => {
    await worker.close();
    await db.destroy();
  });
}
