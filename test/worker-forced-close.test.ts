// @module-tag redis
/**
 * A close past `shutdownTimeoutMs` aborts running jobs (`ctx.signal`) and releases their keys.
 * A handler that honours the signal ends its run with an error then: the job goes back to its
 * queue without using an attempt (a shutdown is not the job's failure), and the next worker
 * runs it once. Both backends.
 */
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, IdempotentProducer, createIdempotentWorker, type IdempotentWorker, type QueueConnectionOptions, type WorkerEvent } from '../src/index.js';
import { waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let keys: IdempotencyKeys;
const silent = pino({ level: 'silent' });

beforeAll(async () => {
  env = await createTestEnv('worker-forced-close');
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
});
afterAll(async () => {
  await env?.teardown();
});

const backends: Array<[string, () => QueueConnectionOptions]> = [
  ['Redis', () => ({ connection: { url: env.redisUrl }, prefix: env.redisPrefix })],
  ['Postgres', () => ({ backend: 'postgres', connection: env.databaseDirectUrl, prefix: `${env.schema}_queue` })],
];

describe.each(backends)('on %s', (backend, connectionOf) => {
  it('a handler that stops when ctx.signal aborts leaves its job waiting, no attempt used, for the next worker to run once', async () => {
    const queueName = `forced-${backend.toLowerCase()}`;
    const connection = connectionOf();
    const runs: string[] = [];
    const start = (stopOnSignal: boolean): IdempotentWorker => {
      const worker = createIdempotentWorker({
        ...connection,
        queue: queueName,
        keys,
        shutdownTimeoutMs: 200,
        logger: silent,
        handler: async (ctx) => {
          runs.push(stopOnSignal ? 'aborted' : 'completed');
          if (stopOnSignal) {
            await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve, { once: true }));
            throw new Error('stopped: the worker is closing');
          }
          return ctx.transaction(async () => 'done');
        },
      });
      return worker;
    };
    const producer = new IdempotentProducer({ ...connection, queue: queueName, schema: env.schema });
    const queue = producer.queue as unknown as Queue;
    const first = start(true);
    await first.waitUntilReady();
    const claimed = new Promise<void>((resolve) => first.on('event', (event: WorkerEvent) => event.kind === 'claimed' && resolve()));
    const { jobId } = await producer.enqueue({ name: 'charge', key: `forced-${backend}`, data: {} });
    await claimed;
    await first.close();

    const job = (await queue.getJob(jobId))!;
    expect(await job.getState()).toBe('waiting');
    expect(job.attemptsMade).toBe(0);
    const { rows } = await sql<{ status: string; owner: string | null }>`select status, owner from ${sql.id(env.schema, 'idempotency_keys')} where key = ${`forced-${backend}`}`.execute(env.db);
    expect(rows).toEqual([{ status: 'processing', owner: null }]);

    const second = start(false);
    const done = await waitForJobState(queue, jobId, ['completed', 'failed']);
    expect(done.state).toBe('completed');
    expect(done.job.returnvalue).toBe('done');
    expect(runs).toEqual(['aborted', 'completed']);
    await second.close();
    await producer.close();
  });
});
