// Idempotency-Key on a consumer's own endpoint, without Express or NestJS installed: one request
// handled (its response stored in the transaction), then replayed.
import { IdempotencyKeys, createPostgresDb, migrate } from 'idempotent-jobs';
import { IdempotentRequests } from 'idempotent-jobs/http-idempotency';

const schema = process.env.SCHEMA!;
const db = createPostgresDb({ connectionString: process.env.DATABASE_URL! });
await migrate(db, { schema });
const requests = new IdempotentRequests({ keys: new IdempotencyKeys({ db, schema }), namespace: 'smoke' });
const request = { method: 'POST', target: '/orders', idempotencyKey: 'order-esm', body: { cents: 1999 }, client: 'smoke' };
const handler = async () => ({ status: 201, body: { id: 'order-esm' } });
const first = await requests.handle(request, (ctx) => ctx.transaction(handler));
const again = await requests.handle(request, (ctx) => ctx.transaction(handler));
console.log('answered', JSON.stringify([first.outcome, first.status, again.outcome, again.status, again.body?.toString()]));
await db.destroy();
