/** Enqueue cost: `IdempotentProducer.enqueueBulk` against raw `Queue.addBulk`, same jobs. */
import { randomBytes } from 'node:crypto';
import { Queue } from 'bullmq';
import { IdempotentProducer, jobIdFor, toWireJobData } from '../../src/index.js';
import type { BenchEnv } from './bench-env.js';
import { redisConnection } from './throughput.js';

/** One enqueue measurement. */
export interface ProducerRun {
  readonly producer: 'bullmq-addBulk' | 'IdempotentProducer.enqueueBulk';
  readonly n: number;
  readonly batch: number;
  readonly jobsPerSec: number;
}

/** Enqueues `n` unique jobs in batches of `batch` and times it. */
export async function runProducer(env: BenchEnv, producer: ProducerRun['producer'], n: number, batch: number): Promise<ProducerRun> {
  const queueName = `prod-${randomBytes(3).toString('hex')}`;
  const connection = redisConnection(env.redisUrl);
  const queue = new Queue(queueName, { connection, prefix: env.redisPrefix });
  const idempotent = new IdempotentProducer({ queue: queueName, connection, prefix: env.redisPrefix });
  await queue.waitUntilReady();
  await idempotent.queue.waitUntilReady();
  try {
    const startedAt = performance.now();
    for (let start = 0; start < n; start += batch) {
      const keys = Array.from({ length: Math.min(batch, n - start) }, (_, i) => `k${start + i}`);
      if (producer === 'bullmq-addBulk') {
        await queue.addBulk(keys.map((key, i) => ({ name: 'charge', data: toWireJobData('bench', key, { n: start + i }), opts: { jobId: jobIdFor('bench', key) } })));
      } else {
        await idempotent.enqueueBulk(keys.map((key, i) => ({ name: 'charge', scope: 'bench', key, data: { n: start + i } })));
      }
    }
    const elapsedMs = performance.now() - startedAt;
    return { producer, n, batch, jobsPerSec: (n / elapsedMs) * 1000 };
  } finally {
    await idempotent.close();
    await queue.close();
    await env.deleteQueueKeys(queueName);
  }
}
