// A consumer's first worker, as the README shows it: one job enqueued, processed once, replayed once.
import { IdempotencyKeys, IdempotentProducer, createIdempotentWorker, createPostgresDb, migrate } from 'idempotent-jobs';

const [schema, prefix] = [process.env.SCHEMA!, process.env.REDIS_PREFIX!];
const db = createPostgresDb({ connectionString: process.env.DATABASE_URL! });
await migrate(db, { schema });
const keys = new IdempotencyKeys({ db, schema, leaseMs: 30_000 });
const connection = { url: process.env.REDIS_URL! };
const worker = createIdempotentWorker<{ cents: number }, { charged: number }>({
  queue: 'smoke', connection, prefix, keys, handler: async (ctx) => ctx.transaction(async () => ({ charged: ctx.data.cents })),
});
const producer = new IdempotentProducer({ queue: 'smoke', connection, prefix });
const done = new Promise((resolve) => worker.on('event', (event) => event.kind === 'completed' && resolve(event)));
await producer.enqueue({ name: 'charge', scope: 'smoke', key: 'order-1', data: { cents: 1999 } });
console.log('completed', JSON.stringify(await done));
await Promise.all([worker.close(), producer.close()]);
await db.destroy();
