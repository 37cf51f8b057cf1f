// @module-tag redis
import { Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { IdempotentProducer, KeyReusedError, jobIdFor } from '../src/index.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

// The producer alone: no worker runs, so every job it adds stays in BullMQ for the read-back.
let env: TestEnv;
let producer: IdempotentProducer;
let foreign: Queue;
const QUEUE = 'orders';

beforeAll(async () => {
  env = await createTestEnv('producer');
  producer = new IdempotentProducer({ queue: QUEUE, connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  foreign = new Queue(QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
});
afterAll(async () => {
  await producer?.close();
  await foreign?.close();
  await env?.teardown();
});

describe('IdempotentProducer.enqueueBulk', () => {
  it('tells each job of a batch added from duplicate: new keys, a key twice in the batch, a key already queued', async () => {
    await producer.enqueue({ name: 'charge', scope: 's', key: 'queued', data: { cents: 5 } });
    const results = await producer.enqueueBulk([
      { name: 'charge', scope: 's', key: 'a', data: { cents: 1 } },
      { name: 'charge', scope: 's', key: 'b', data: { cents: 2 } },
      { name: 'charge', scope: 's', key: 'a', data: { cents: 1 } },
      { name: 'charge', scope: 's', key: 'queued', data: { cents: 5 } },
    ]);
    expect(results.map(({ key, status }) => `${key}:${status}`)).toEqual(['a:added', 'b:added', 'a:duplicate', 'queued:duplicate']);
    expect(results[0]!.jobId).toBe(jobIdFor('s', 'a'));
    expect(await foreign.getJobCounts('wait', 'delayed')).toEqual({ wait: 3, delayed: 0 });
  });

  it('refuses a key queued with another payload or job name, and a key a foreign producer queued with data it cannot read', async () => {
    await producer.enqueue({ name: 'charge', scope: 's', key: 'reused', data: { cents: 7 } });
    await expect(producer.enqueueBulk([{ name: 'charge', scope: 's', key: 'reused', data: { cents: 8 } }])).rejects.toBeInstanceOf(KeyReusedError);
    await expect(producer.enqueue({ name: 'refund', scope: 's', key: 'reused', data: { cents: 7 } })).rejects.toBeInstanceOf(KeyReusedError);
    // Not under the wire contract (no idempotencyKey): nothing to compare it with, so not ours.
    await foreign.add('charge', { cents: 9 }, { jobId: jobIdFor('s', 'foreign') });
    await expect(producer.enqueue({ name: 'charge', scope: 's', key: 'foreign', data: { cents: 9 } })).rejects.toBeInstanceOf(KeyReusedError);
  });

  it('adds a key again once its job has been removed', async () => {
    const first = await producer.enqueue({ name: 'charge', scope: 's', key: 'removed', data: { cents: 3 } });
    await foreign.remove(first.jobId);
    expect((await producer.enqueue({ name: 'charge', scope: 's', key: 'removed', data: { cents: 3 } })).status).toBe('added');
  });
});

describe('IdempotentProducer.enqueue without data', () => {
  it('adds the job with a null payload and tells a repeat as a duplicate (no KeyReusedError)', async () => {
    // Plain JavaScript may leave `data` out; the type says it is required.
    const request = { name: 'ping', scope: 's', key: 'no-data' } as unknown as Parameters<IdempotentProducer['enqueue']>[0];
    expect((await producer.enqueue(request)).status).toBe('added');
    expect((await producer.enqueue(request)).status).toBe('duplicate');
    expect((await producer.enqueue({ name: 'ping', scope: 's', key: 'no-data', data: null })).status).toBe('duplicate');
    const job = await foreign.getJob(jobIdFor('s', 'no-data'));
    expect(job?.data).toMatchObject({ payload: null });
    expect(Object.keys(job!.data as object)).toContain('payload');
  });

  it('a repeat within the same millisecond is a duplicate, not added again (its add had the first one\'s timestamp, by which an add is known to be ours)', async () => {
    const now = Date.now();
    const clock = vi.spyOn(Date, 'now').mockReturnValue(now);
    try {
      const request = { name: 'ping', scope: 's', key: 'same-millisecond', data: { n: 1 } };
      expect((await producer.enqueue(request)).status).toBe('added');
      expect((await producer.enqueue(request)).status).toBe('duplicate');
      expect((await producer.enqueueBulk([request, request])).map((result) => result.status)).toEqual(['duplicate', 'duplicate']);
    } finally {
      clock.mockRestore();
    }
    expect((await foreign.getJob(jobIdFor('s', 'same-millisecond')))?.data).toMatchObject({ payload: { n: 1 } });
  });

  it('refuses an unknown request field, naming the closest one', async () => {
    const request = { name: 'ping', scope: 's', key: 'misspelt', data: 1, retension: { resultMs: 1000 } } as unknown as Parameters<IdempotentProducer['enqueue']>[0];
    await expect(producer.enqueue(request)).rejects.toThrow('producer.enqueue(request): unknown option "retension". Did you mean "retention"?');
  });
});
