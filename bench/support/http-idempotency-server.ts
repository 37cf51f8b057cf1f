/**
 * The server of `npm run bench:http-idempotency`: one Fastify app with the same order endpoint
 * three times, `POST /plain/orders` (its own transaction, no middleware), `POST /orders` (the
 * middleware, a function handler under a lease) and `POST /fast-orders` (the middleware,
 * database-only: the fast path). Each writes one order row and its job's outbox row in one
 * transaction and answers 201 with a small JSON body. Prints `listening <url>` when ready.
 */
import { randomUUID } from 'node:crypto';
import Fastify from 'fastify';
import { sql, type Kysely } from 'kysely';
import { IdempotencyKeys, IdempotentProducer, createPostgresDb } from 'idempotent-jobs';
import { IdempotentRequests, fastifyIdempotency, type IdempotentResponse } from 'idempotent-jobs/http-idempotency';

const schema = process.env.SCHEMA!;
const db = createPostgresDb({ connectionString: process.env.DATABASE_URL!, maxConnections: Number(process.env.PG_POOL_SIZE ?? 16), applicationName: 'idempotent-jobs:bench-http' });
const producer = new IdempotentProducer({ queue: 'payments', connection: { url: process.env.REDIS_URL! }, prefix: process.env.REDIS_PREFIX!, schema });
const orders = sql.id(schema, 'orders');

/** The endpoint's work, the same on every route: the order and its job, in `tx`. */
async function placeOrder(tx: Kysely<any>, body: { cents: number }): Promise<IdempotentResponse> {
  const id = randomUUID();
  await sql`insert into ${orders} (id, cents) values (${id}, ${body.cents})`.execute(tx);
  await producer.enqueue({ name: 'charge', key: `order-${id}`, data: { orderId: id, cents: body.cents } }, { tx });
  return { status: 201, headers: { location: `/orders/${id}` }, body: { id, cents: body.cents } };
}

const app = Fastify();
await app.register(fastifyIdempotency, {
  requests: new IdempotentRequests({ keys: new IdempotencyKeys({ db, schema }), namespace: 'bench' }),
  client: () => 'bench',
});
app.post<{ Body: { cents: number } }>('/plain/orders', async (request, reply) => {
  const response = await db.transaction().execute((tx) => placeOrder(tx, request.body));
  return reply.code(response.status).headers(response.headers as Record<string, string>).send(response.body);
});
app.post<{ Body: { cents: number } }>('/orders', { config: { idempotency: true } }, (request) => request.idempotency.transaction((tx) => placeOrder(tx, request.body)));
app.post<{ Body: { cents: number } }>('/fast-orders', { config: { idempotency: { databaseOnly: true } } }, (request) => request.idempotency.transaction((tx) => placeOrder(tx, request.body)));

const url = await app.listen({ host: '127.0.0.1', port: 0 });
console.log(`listening ${url}`);
process.once('SIGTERM', async () => {
  await app.close();
  await producer.close();
  await db.destroy();
  process.exit(0);
});
