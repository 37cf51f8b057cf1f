/**
 * A JetStream consumer whose handler writes a ledger row in the transaction that completes the
 * message's key, and a publisher that sends one order twice and another once: the ledger ends
 * with one row per key. The streams and subjects are named after SCHEMA and deleted at the end.
 */
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { connect } from '@nats-io/transport-node';
import { sql } from 'kysely';
import { pino } from 'pino';
import { IdempotencyKeys, createPostgresDb, migrate, toWireJobData } from 'idempotent-jobs';
import { loadEnvConfig } from 'idempotent-jobs/process';
import { createIdempotentNatsConsumer, ensureJetStreamConsumer } from 'idempotent-jobs/nats';

const config = loadEnvConfig();
const servers = process.env.NATS_URL ?? '127.0.0.1:4222';
const db = createPostgresDb({ connectionString: config.DATABASE_URL, maxConnections: 4 });
await migrate(db, { schema: config.SCHEMA });
const ledger = sql.id(config.SCHEMA, 'nats_ledger');
// No unique constraint on the key: a message that ran twice would leave two rows.
await sql`create table if not exists ${ledger} (key text not null, cents integer not null)`.execute(db);

// The stream, a dead-letter stream and a durable pull consumer with explicit acks.
const stream = `${config.SCHEMA}-example-orders`;
const deadLetter = { stream: `${stream}-dead-letters`, subject: `${config.SCHEMA}.example-dead-letters` };
const nc = await connect({ servers });
await ensureJetStreamConsumer(nc, { stream, subjects: [`${config.SCHEMA}.example-orders.>`], consumer: 'ledger', deadLetter });

const consumer = createIdempotentNatsConsumer<{ cents: number }>({
  servers,
  stream,
  consumer: 'ledger',
  deadLetterSubject: deadLetter.subject,
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
await consumer.waitUntilReady();

// The publisher: the wire contract as the body; order-1 twice, as a publisher's retry would.
// No Nats-Msg-Id, so JetStream's own publish dedup lets the repeat through to the consumer.
const js = jetstream(nc);
for (const [key, cents] of [['order-1', 1200], ['order-1', 1200], ['order-2', 500]] as const) {
  await js.publish(`${config.SCHEMA}.example-orders.created`, JSON.stringify(toWireJobData('orders', key, { cents })));
}
await allSettled;
await consumer.close();

const rows = await sql<{ key: string; n: number }>`select key, count(*)::int as n from ${ledger} group by key order by key`.execute(db);
console.log(`ledger rows per key: ${JSON.stringify(Object.fromEntries(rows.rows.map((row) => [row.key, row.n])))}`);

// Removes what this run created: both streams (the consumer goes with its stream).
const jsm = await jetstreamManager(nc);
for (const name of [stream, deadLetter.stream]) await jsm.streams.delete(name);
await nc.close();
await db.destroy();
