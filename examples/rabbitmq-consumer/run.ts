/**
 * A RabbitMQ consumer whose handler writes a ledger row in the transaction that completes the
 * message's key, and a publisher that sends one payment twice and another once: the ledger ends
 * with one row per key. The queues are named after SCHEMA and deleted at the end.
 */
import { connect } from 'amqplib';
import { sql } from 'kysely';
import { pino } from 'pino';
import { IdempotencyKeys, createPostgresDb, migrate, toWireJobData } from 'idempotent-jobs';
import { loadEnvConfig } from 'idempotent-jobs/process';
import { createAmqpConsumer } from 'idempotent-jobs/amqp';

const config = loadEnvConfig();
const url = process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672';
const db = createPostgresDb({ connectionString: config.DATABASE_URL, maxConnections: 4 });
await migrate(db, { schema: config.SCHEMA });
const ledger = sql.id(config.SCHEMA, 'rabbitmq_ledger');
// No unique constraint on the key: a message that ran twice would leave two rows.
await sql`create table if not exists ${ledger} (key text not null, cents integer not null)`.execute(db);

const consumer = createAmqpConsumer<{ cents: number }>({
  url,
  queue: `${config.SCHEMA}.example-payments`,
  keys: new IdempotencyKeys({ db, schema: config.SCHEMA }),
  logger: pino({ level: config.LOG_LEVEL }),
  // Database-only: the row and the key's completion commit in one transaction.
  handler: {
    transaction: async (tx, ctx) => {
      await sql`insert into ${ledger} (key, cents) values (${ctx.key}, ${ctx.data.cents})`.execute(tx);
      return { booked: ctx.data.cents };
    },
  },
});
// The outcomes after which a message is acknowledged or dead-lettered.
const settledKinds = new Set(['completed', 'replayed', 'replayed-failure', 'key-reused', 'invalid', 'failed']);
let settled = 0;
const allSettled = new Promise<void>((resolve) => {
  consumer.on('event', (event) => {
    if (!settledKinds.has(event.kind)) return;
    console.log(`${event.key}: ${event.kind}`);
    if (++settled === 3) resolve();
  });
});
await consumer.start(); // declares the queue and its dead-letter queue

// The publisher: the wire contract as the body; order-1 twice, as a publisher's retry would.
const connection = await connect(url);
const channel = await connection.createConfirmChannel();
for (const [key, cents] of [['order-1', 1200], ['order-1', 1200], ['order-2', 500]] as const) {
  channel.sendToQueue(consumer.topology.queue, Buffer.from(JSON.stringify(toWireJobData('payments', key, { cents }))), { persistent: true });
}
await channel.waitForConfirms();
await allSettled;
await consumer.close();

const rows = await sql<{ key: string; n: number }>`select key, count(*)::int as n from ${ledger} group by key order by key`.execute(db);
console.log(`ledger rows per key: ${JSON.stringify(Object.fromEntries(rows.rows.map((row) => [row.key, row.n])))}`);

// Removes what the consumer declared: its queue, its dead-letter queue and any delay queue.
const { queue, deadLetterQueue, delayQueues } = consumer.topology;
for (const name of [queue, deadLetterQueue, ...delayQueues]) await channel.deleteQueue(name);
await connection.close();
await db.destroy();
