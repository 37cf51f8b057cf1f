/** Enqueues one payment: `tsx enqueue.ts <order id> <cents>`. Enqueueing it again is a no-op. */
import { IdempotentProducer } from 'idempotent-jobs';
import { loadEnvConfig } from 'idempotent-jobs/process';

const [orderId = 'order-1', cents = '1999'] = process.argv.slice(2);
const config = loadEnvConfig();
const producer = new IdempotentProducer({ queue: 'payments', connection: { url: config.REDIS_URL }, prefix: config.REDIS_PREFIX });
const result = await producer.enqueue({ name: 'pay', key: orderId, data: { orderId, cents: Number(cents) } });
console.log(JSON.stringify(result));
await producer.close();
