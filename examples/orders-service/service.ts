/**
 * An order service whose `POST /orders` is idempotent under `Idempotency-Key`: the order row, its
 * payment job (in the outbox) and the response commit in one transaction together with the
 * request's key, so a client that times out and retries gets the first response again, never a
 * second order or a second charge; another body under the key is 422, a retry racing the first
 * is 409. The outbox relay, in the same process, moves committed jobs into BullMQ.
 */
import { randomUUID } from 'node:crypto';
import Fastify from 'fastify';
import { sql } from 'kysely';
import { IdempotencyKeys, IdempotentProducer, OutboxRelay, createPostgresDb, migrate } from 'idempotent-jobs';
import { IdempotentRequests, fastifyIdempotency } from 'idempotent-jobs/http-idempotency';
import { loadEnvConfig } from 'idempotent-jobs/process';

const config = loadEnvConfig(); // DATABASE_URL, REDIS_URL, SCHEMA, REDIS_PREFIX, LEASE_MS
const db = createPostgresDb({ connectionString: config.DATABASE_URL, maxConnections: 8 });
await migrate(db, { schema: config.SCHEMA });
const orders = sql.id(config.SCHEMA, 'customer_orders');
await sql`create table if not exists ${orders} (id text primary key, tenant text not null, reference text not null, cents integer not null)`.execute(db);

const connection = { url: config.REDIS_URL };
const producer = new IdempotentProducer({ queue: 'payments', connection, prefix: config.REDIS_PREFIX, schema: config.SCHEMA });
const relay = new OutboxRelay({ db, schema: config.SCHEMA, connection, prefix: config.REDIS_PREFIX, pollIntervalMs: 50 });
relay.start();

const app = Fastify();
await app.register(fastifyIdempotency, {
  requests: new IdempotentRequests({ keys: new IdempotencyKeys({ db, schema: config.SCHEMA }), namespace: 'orders-service', leaseMs: config.LEASE_MS }),
  // Keys are kept per tenant; the header stands in for your authentication.
  client: (request) => (typeof request.headers['x-tenant'] === 'string' ? request.headers['x-tenant'] : undefined),
});

const orderSchema = {
  type: 'object',
  required: ['reference', 'cents'],
  properties: { reference: { type: 'string', minLength: 1, maxLength: 100 }, cents: { type: 'integer', minimum: 1 } },
  additionalProperties: false,
} as const;

app.post<{ Body: { reference: string; cents: number } }>('/orders', { config: { idempotency: true }, schema: { body: orderSchema } }, async (request) => {
  const ctx = request.idempotency;
  const { reference, cents } = request.body;
  return ctx.transaction(async (tx) => {
    const id = randomUUID();
    await sql`insert into ${orders} (id, tenant, reference, cents) values (${id}, ${ctx.client}, ${reference}, ${cents})`.execute(tx);
    await producer.enqueue({ name: 'charge', key: `order-${id}`, data: { orderId: id, reference, cents } }, { tx });
    return { status: 201, headers: { location: `/orders/${id}` }, body: { id, reference, cents } };
  });
});

const url = await app.listen({ host: '127.0.0.1', port: Number(process.env.PORT ?? 3000) });
console.log(`orders service listening on ${url}`);

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, async () => {
    await app.close();
    await relay.stop();
    await producer.close();
    await db.destroy();
  });
}
