/**
 * An order service: `POST /orders` writes the order and its fulfilment job's outbox row in one
 * transaction, so there is never an order without its job nor a job without its order. The
 * outbox relay, in the same process, moves committed rows into BullMQ.
 */
import Fastify from 'fastify';
import { sql } from 'kysely';
import { IdempotentProducer, OutboxRelay, createPostgresDb, migrate } from 'idempotent-jobs';
import { loadEnvConfig } from 'idempotent-jobs/process';

const config = loadEnvConfig(); // DATABASE_URL, REDIS_URL, SCHEMA, REDIS_PREFIX, QUEUE
const db = createPostgresDb({ connectionString: config.DATABASE_URL, maxConnections: 4 });
await migrate(db, { schema: config.SCHEMA });
const orders = sql.id(config.SCHEMA, 'orders');
await sql`create table if not exists ${orders} (id text primary key, cents integer not null)`.execute(db);

const connection = { url: config.REDIS_URL };
const producer = new IdempotentProducer({ queue: 'orders', connection, prefix: config.REDIS_PREFIX, schema: config.SCHEMA });
const relay = new OutboxRelay({ db, schema: config.SCHEMA, connection, prefix: config.REDIS_PREFIX, pollIntervalMs: 50 });
relay.start();

const app = Fastify();
app.post<{ Body: { id: string; cents: number } }>('/orders', async (request, reply) => {
  const { id, cents } = request.body;
  const created = await db.transaction().execute(async (tx) => {
    // A repeated POST of the same order adds neither a row nor a job.
    const inserted = await sql`insert into ${orders} (id, cents) values (${id}, ${cents}) on conflict do nothing`.execute(tx);
    if (inserted.numAffectedRows === 0n) return false;
    await producer.enqueue({ name: 'fulfil', key: `order-${id}`, data: { id, cents } }, { tx });
    return true;
  });
  return reply.code(created ? 201 : 200).send({ id, created });
});

const url = await app.listen({ host: '127.0.0.1', port: Number(process.env.PORT ?? 3000) });
console.log(`order service listening on ${url}`);

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, async () => {
    await app.close();
    await relay.stop();
    await producer.close();
    await db.destroy();
  });
}
