/**
 * One chaos consumer process on RabbitMQ: the chaos handler (an external call, some work, the
 * effect in ctx.transaction) under the AMQP consumer, logging JSON lines the checker reads.
 * SIGUSR2 makes the broker close its channel (an acknowledgement of an unknown delivery tag).
 */
import { pino } from 'pino';
import { createAmqpConsumer } from '../../src/amqp/index.js';
import { IdempotencyKeys, createPostgresDb, type JobContext } from '../../src/index.js';
import { chaosHandler, type ChaosPayload } from './chaos-handler.js';

const env = process.env;
const logger = pino({ level: 'info' });
const db = createPostgresDb({ connectionString: env.DATABASE_URL!, maxConnections: Number(env.CONCURRENCY) + 4, applicationName: 'chaos-amqp' }, () => {});
const keys = new IdempotencyKeys({ db, schema: env.SCHEMA!, leaseMs: Number(env.LEASE_MS) });
const handler = chaosHandler(env.SCHEMA!, Promise.resolve(db));
const consumer = createAmqpConsumer<ChaosPayload>({
  url: env.AMQP_URL!,
  queue: env.QUEUE!,
  keys,
  concurrency: Number(env.CONCURRENCY),
  leaseMs: Number(env.LEASE_MS),
  deferMaxMs: 1_000,
  storeRetryMaxMs: 2_000,
  retryDelayMs: 200,
  maxAttempts: 1_000_000,
  shutdownTimeoutMs: 5_000,
  logger,
  // The chaos handler reads only data, key, scope, fence and signal: the same on every broker.
  handler: (ctx) => handler(ctx as unknown as JobContext<ChaosPayload>),
});
process.on('SIGUSR2', () => {
  logger.warn('chaos: closing my channel');
  consumer.channel?.ack({ fields: { deliveryTag: 2 ** 31 } } as never);
});
process.on('SIGTERM', () => {
  void consumer.close().then(async () => {
    await db.destroy();
    process.exit(0);
  });
});
await consumer.start();
logger.info('worker ready');
