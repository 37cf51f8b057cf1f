// A CommonJS consumer: `require('idempotent-jobs')` (Node's require of an ES module, Node
// 20.19+, 22.12+ and 24), one job enqueued, processed once, replayed once.
'use strict';
const { IdempotencyKeys, IdempotentProducer, createIdempotentWorker, createPostgresDb, migrate } = require('idempotent-jobs');

async function main() {
  const [schema, prefix] = [process.env.SCHEMA, process.env.REDIS_PREFIX];
  const db = createPostgresDb({ connectionString: process.env.DATABASE_URL });
  await migrate(db, { schema });
  const keys = new IdempotencyKeys({ db, schema, leaseMs: 30_000 });
  const connection = { url: process.env.REDIS_URL };
  const worker = createIdempotentWorker({
    queue: 'smoke-cjs', connection, prefix, keys, handler: async (ctx) => ctx.transaction(async () => ({ charged: ctx.data.cents })),
  });
  const producer = new IdempotentProducer({ queue: 'smoke-cjs', connection, prefix });
  const done = new Promise((resolve) => worker.on('event', (event) => event.kind === 'completed' && resolve(event)));
  await producer.enqueue({ name: 'charge', scope: 'smoke', key: 'order-cjs', data: { cents: 1999 } });
  console.log('completed', JSON.stringify(await done));
  await Promise.all([worker.close(), producer.close()]);
  await db.destroy();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
