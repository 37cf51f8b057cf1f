// The same through require() (CommonJS): the entry point loads without Express or NestJS.
'use strict';
const { IdempotencyKeys, createPostgresDb, migrate } = require('idempotent-jobs');
const { IdempotentRequests, expressIdempotency, fastifyIdempotency, IdempotencyInterceptor } = require('idempotent-jobs/http-idempotency');

async function main() {
  const schema = process.env.SCHEMA;
  const db = createPostgresDb({ connectionString: process.env.DATABASE_URL });
  await migrate(db, { schema });
  const requests = new IdempotentRequests({ keys: new IdempotencyKeys({ db, schema }), namespace: 'smoke' });
  const request = { method: 'POST', target: '/orders', idempotencyKey: 'order-cjs', body: { cents: 1999 }, client: 'smoke' };
  const handler = async () => ({ status: 201, body: { id: 'order-cjs' } });
  const first = await requests.handle(request, (ctx) => ctx.transaction(handler));
  const again = await requests.handle(request, (ctx) => ctx.transaction(handler));
  console.log('adapters', [typeof expressIdempotency, typeof fastifyIdempotency, typeof IdempotencyInterceptor].join(','));
  console.log('answered', JSON.stringify([first.outcome, first.status, again.outcome, again.status, again.body.toString()]));
  await db.destroy();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
