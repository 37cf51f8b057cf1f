/**
 * Broker consumers against a plain consumer doing the same transaction:
 *
 *   npm run bench:brokers -- --broker amqp [--messages 2000] [--concurrency 8] [--rounds 3] [--handler function|database-only]
 *
 * Each round pre-fills a queue with `messages` wire-contract messages (unique keys), then
 * times how long a consumer takes to commit them all, alternating:
 *
 * - plain: amqplib's consumer, one transaction per message (insert the ledger row), then ack:
 *   at-least-once, what teams write before they add an inbox;
 * - ours: `createAmqpConsumer`, the same insert in `ctx.transaction` (claim, lease, fenced
 *   completion, ack after commit), or with `--handler database-only` in a database-only
 *   handler (the fast path with group commit).
 *
 * Printed: messages/s per round and the ratio ours / plain of the medians. Alternating rounds
 * and a ratio from one run, because the machine is shared and absolute numbers are noisy.
 * Uses the shared Postgres (a schema of its own) and RabbitMQ (queues of its own), removed after.
 */
import { randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';
import { connect, type ChannelModel } from 'amqplib';
import { sql, type Kysely } from 'kysely';
import { pino } from 'pino';
import { createAmqpConsumer, amqpTopology } from '../src/amqp/index.js';
import { IdempotencyKeys, createPostgresDb, databaseOnly, migrate } from '../src/index.js';

const { values } = parseArgs({
  options: {
    broker: { type: 'string', default: 'amqp' },
    messages: { type: 'string', default: '2000' },
    concurrency: { type: 'string', default: '8' },
    rounds: { type: 'string', default: '3' },
    // Our handler's form: a function calling ctx.transaction, or a database-only handler
    // ({ transaction }: the fast path with group commit by default).
    handler: { type: 'string', default: 'function' },
  },
});
if (values.handler !== 'function' && values.handler !== 'database-only') {
  console.error(`--handler ${values.handler}: function or database-only`);
  process.exit(2);
}
const HANDLER_FORM = values.handler;
if (values.broker !== 'amqp') {
  console.error(`--broker ${values.broker}: only amqp is measured here`);
  process.exit(2);
}
const MESSAGES = Number(values.messages);
const CONCURRENCY = Number(values.concurrency);
const ROUNDS = Number(values.rounds);
const DATABASE_URL = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const AMQP_URL = process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672';
const suffix = randomBytes(4).toString('hex');
const schema = `bench_brokers_${suffix}`;
const silent = pino({ level: 'silent' });

const db = createPostgresDb({ connectionString: DATABASE_URL, maxConnections: CONCURRENCY + 2, applicationName: 'bench-brokers' }, () => {});
await migrate(db, { schema });
await sql`create table ${sql.id(schema, 'ledger')} (key text not null, amount int not null)`.execute(db);
const connection = await connect(AMQP_URL);
const queues: string[] = [];

async function fill(queue: string, round: string): Promise<void> {
  const channel = await connection.createConfirmChannel();
  await channel.assertQueue(queue, { durable: true });
  for (let i = 0; i < MESSAGES; i++) {
    const body = JSON.stringify({ idempotencyKey: `${round}-${i}`, scope: 'bench', payload: { amount: i } });
    channel.sendToQueue(queue, Buffer.from(body), { persistent: true, contentType: 'application/json' });
  }
  await channel.waitForConfirms();
  await channel.close();
}

async function rowsOf(round: string): Promise<number> {
  const { rows } = await sql<{ n: string }>`select count(*) as n from ${sql.id(schema, 'ledger')} where key like ${`${round}-%`}`.execute(db);
  return Number(rows[0]!.n);
}

async function untilAll(round: string, queue: string): Promise<void> {
  while ((await rowsOf(round)) < MESSAGES) {
    // A dead-lettered message would never commit: say so rather than wait for ever.
    const dead = await connection.createChannel().then(async (channel) => {
      channel.on('error', () => {});
      const count = await channel.checkQueue(amqpTopology(queue).deadLetterQueue).then((q) => q.messageCount, () => 0);
      await channel.close().catch(() => {});
      return count;
    });
    if (dead > 0) throw new Error(`${dead} messages of ${queue} were dead-lettered`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** amqplib, a transaction per message, ack after COMMIT. */
async function plainRound(round: string, queue: string): Promise<number> {
  const channel = await connection.createChannel();
  await channel.prefetch(CONCURRENCY);
  const started = performance.now();
  const { consumerTag } = await channel.consume(queue, (message) => {
    if (!message) return;
    const body = JSON.parse(message.content.toString()) as { idempotencyKey: string; payload: { amount: number } };
    void db
      .transaction()
      .execute((tx) => tx.insertInto(`${schema}.ledger`).values({ key: body.idempotencyKey, amount: body.payload.amount }).execute())
      .then(() => channel.ack(message), () => channel.nack(message));
  });
  await untilAll(round, queue);
  const elapsed = performance.now() - started;
  await channel.cancel(consumerTag);
  await channel.close();
  return elapsed;
}

async function oursRound(round: string, queue: string, keys: IdempotencyKeys): Promise<number> {
  const consumer = createAmqpConsumer<{ amount: number }>({
    url: AMQP_URL,
    queue,
    keys,
    concurrency: CONCURRENCY,
    logger: silent,
    handler:
      HANDLER_FORM === 'database-only'
        ? databaseOnly<{ amount: number }, null>(async (tx, ctx) => {
            await tx.insertInto(`${schema}.ledger`).values({ key: ctx.key, amount: ctx.data.amount }).execute();
            return null;
          })
        : (ctx) =>
            ctx.transaction(async (tx: Kysely<any>) => {
              await tx.insertInto(`${schema}.ledger`).values({ key: ctx.key, amount: ctx.data.amount }).execute();
              return null;
            }),
  });
  const started = performance.now();
  await consumer.start();
  await untilAll(round, queue);
  const elapsed = performance.now() - started;
  await consumer.close();
  return elapsed;
}

const keys = new IdempotencyKeys({ db, schema });
const rates: Record<'plain' | 'ours', number[]> = { plain: [], ours: [] };
try {
  for (let round = 0; round < ROUNDS; round++) {
    // Alternate which goes first, so a drift of the machine's load falls on both.
    const order: ('plain' | 'ours')[] = round % 2 === 0 ? ['plain', 'ours'] : ['ours', 'plain'];
    for (const kind of order) {
      const name = `${kind}${round}`;
      const queue = `bench.brokers.${suffix}.${name}`;
      queues.push(queue);
      await fill(queue, name);
      const ms = kind === 'plain' ? await plainRound(name, queue) : await oursRound(name, queue, keys);
      const rate = MESSAGES / (ms / 1000);
      rates[kind].push(rate);
      console.log(`round ${round + 1} ${kind.padEnd(5)} ${Math.round(rate)} messages/s (${MESSAGES} in ${Math.round(ms)} ms)`);
    }
  }
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  console.log(
    `\namqp, ${HANDLER_FORM} handler, ${MESSAGES} messages × ${ROUNDS} rounds, concurrency ${CONCURRENCY}: plain ${Math.round(median(rates.plain))}/s, ours ${Math.round(median(rates.ours))}/s, ` +
      `ratio ours/plain ${(median(rates.ours) / median(rates.plain)).toFixed(2)}`,
  );
} finally {
  await cleanup(connection);
}

async function cleanup(conn: ChannelModel): Promise<void> {
  for (const queue of queues) {
    const topology = amqpTopology(queue);
    for (const name of [queue, topology.deadLetterQueue, ...topology.delayQueues]) {
      const channel = await conn.createChannel();
      channel.on('error', () => {});
      await channel.deleteQueue(name).catch(() => {});
      await channel.close().catch(() => {});
    }
  }
  await conn.close();
  await sql`drop schema ${sql.id(schema)} cascade`.execute(db);
  await db.destroy();
}
