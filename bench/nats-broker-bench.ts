/**
 * The NATS JetStream consumer against a plain JetStream consumer doing the same transaction:
 *
 *   npm run bench:brokers:nats -- [--messages 2000] [--concurrency 8] [--rounds 3] [--handler function|database-only]
 *
 * Each round fills a stream of its own with `messages` wire-contract messages (unique keys),
 * then times how long a consumer takes to commit them all, alternating:
 *
 * - plain: a durable pull consumer (`consume()`), one transaction per message (insert the
 *   ledger row), then ack: at-least-once, what teams write before they add an inbox;
 * - ours: `createIdempotentNatsConsumer`, the same insert in `ctx.transaction` (claim, lease,
 *   fenced completion, ack after commit), or with `--handler database-only` in a database-only
 *   handler (the fast path with group commit).
 *
 * Printed: messages/s per round and the ratio ours / plain of the medians. Alternating rounds
 * and a ratio from one run, because the machine is shared and absolute numbers are noisy.
 * Uses the shared Postgres (a schema of its own) and NATS (`NATS_URL`, streams of its own),
 * removed after.
 */
import { randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { connect } from '@nats-io/transport-node';
import { sql } from 'kysely';
import { pino } from 'pino';
import { IdempotencyKeys, createPostgresDb, databaseOnly, migrate } from '../src/index.js';
import { createIdempotentNatsConsumer, ensureJetStreamConsumer } from '../src/nats/index.js';

const { values } = parseArgs({
  options: {
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
const MESSAGES = Number(values.messages);
const CONCURRENCY = Number(values.concurrency);
const ROUNDS = Number(values.rounds);
const DATABASE_URL = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const NATS_URL = process.env.NATS_URL ?? '127.0.0.1:4222';
const suffix = randomBytes(4).toString('hex');
const schema = `bench_nats_${suffix}`;
const silent = pino({ level: 'silent' });

const db = createPostgresDb({ connectionString: DATABASE_URL, maxConnections: CONCURRENCY + 2, applicationName: 'bench-nats' }, () => {});
await migrate(db, { schema });
await sql`create table ${sql.id(schema, 'ledger')} (key text not null, amount int not null)`.execute(db);
const connection = await connect({ servers: NATS_URL });
const js = jetstream(connection);
const jsm = await jetstreamManager(connection);
const streams: string[] = [];
const encoder = new TextEncoder();

async function fill(round: string): Promise<string> {
  const stream = `bench_nats_${suffix}_${round}`;
  streams.push(stream);
  await ensureJetStreamConsumer(connection, { stream, subjects: [`${stream}.>`], consumer: 'bench', ackWaitMs: 30_000 });
  const acks = [];
  for (let i = 0; i < MESSAGES; i++) {
    const body = encoder.encode(JSON.stringify({ idempotencyKey: `${round}-${i}`, scope: 'bench', payload: { amount: i } }));
    acks.push(js.publish(`${stream}.orders`, body));
    if (acks.length >= 256) await Promise.all(acks.splice(0));
  }
  await Promise.all(acks);
  return stream;
}

async function waitForLedger(round: string, started: number): Promise<number> {
  for (;;) {
    const { rows } = await sql<{ n: string }>`select count(*) as n from ${sql.id(schema, 'ledger')} where key like ${`${round}-%`}`.execute(db);
    if (Number(rows[0]!.n) >= MESSAGES) return performance.now() - started;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

async function plainRound(round: string): Promise<number> {
  const stream = await fill(round);
  const consumer = await js.consumers.get(stream, 'bench');
  const messages = await consumer.consume({ max_messages: Math.max(10, 2 * CONCURRENCY) });
  const started = performance.now();
  const inFlight = new Set<Promise<void>>();
  const loop = (async () => {
    for await (const message of messages) {
      while (inFlight.size >= CONCURRENCY) await Promise.race(inFlight);
      const handled = (async () => {
        const body = message.json<{ idempotencyKey: string; payload: { amount: number } }>();
        await db.transaction().execute((tx) => tx.insertInto(`${schema}.ledger`).values({ key: body.idempotencyKey, amount: body.payload.amount }).execute());
        message.ack();
      })();
      inFlight.add(handled);
      void handled.finally(() => inFlight.delete(handled));
    }
  })();
  const elapsed = await waitForLedger(round, started);
  await messages.close();
  await loop;
  return elapsed;
}

async function oursRound(round: string): Promise<number> {
  const stream = await fill(round);
  const keys = new IdempotencyKeys({ db, schema });
  const consumer = createIdempotentNatsConsumer<{ amount: number }>({
    servers: NATS_URL,
    stream,
    consumer: 'bench',
    keys,
    concurrency: CONCURRENCY,
    logger: silent,
    handler:
      HANDLER_FORM === 'database-only'
        ? databaseOnly<{ amount: number }, null>((tx, ctx) => tx.insertInto(`${schema}.ledger`).values({ key: ctx.key, amount: ctx.data.amount }).execute().then(() => null))
        : (ctx) => ctx.transaction((tx) => tx.insertInto(`${schema}.ledger`).values({ key: ctx.key, amount: ctx.data.amount }).execute().then(() => null)),
  });
  const started = performance.now();
  await consumer.waitUntilReady();
  const elapsed = await waitForLedger(round, started);
  await consumer.close();
  return elapsed;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const rates = { plain: [] as number[], ours: [] as number[] };
try {
  for (let r = 0; r < ROUNDS; r++) {
    // Alternate which goes first, so a trend in the machine's load does not favour one.
    const order = r % 2 === 0 ? (['plain', 'ours'] as const) : (['ours', 'plain'] as const);
    for (const kind of order) {
      const ms = kind === 'plain' ? await plainRound(`p${r}`) : await oursRound(`o${r}`);
      const rate = (MESSAGES / ms) * 1000;
      rates[kind].push(rate);
      console.log(`round ${r + 1} ${kind.padEnd(5)} ${MESSAGES} messages in ${Math.round(ms)} ms: ${Math.round(rate)} msg/s`);
    }
  }
  const plain = median(rates.plain);
  const ours = median(rates.ours);
  console.log(`\n${HANDLER_FORM} handler, median: plain ${Math.round(plain)} msg/s, ours ${Math.round(ours)} msg/s; ours / plain = ${(ours / plain).toFixed(2)} ` +
    `(${MESSAGES} messages, concurrency ${CONCURRENCY}, ${ROUNDS} alternating rounds; ${new Date().toISOString()})`);
} finally {
  for (const stream of streams) await jsm.streams.delete(stream).catch(() => false);
  await connection.close();
  await sql`drop schema if exists ${sql.id(schema)} cascade`.execute(db);
  await db.destroy();
}
