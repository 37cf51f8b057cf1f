// @module-tag redis
/**
 * Per-job retention through BullMQ and the HTTP API: the producer's `retention` option and the
 * HTTP API's `resultMs` / `tombstoneMs` query parameters reach the worker in the job's data, and
 * the worker's completion keeps the key for that long; a malformed value is refused by the
 * producer (ValidationError), fails a foreign producer's job as invalid data (no key, nothing
 * run), and is a 400 from the HTTP API.
 */
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, IdempotentProducer, ValidationError, createHttpApi, createIdempotentWorker, jobIdFor, type HttpApi, type IdempotentWorker } from '../src/index.js';
import { problemType } from '../src/http/problems.js';
import { httpClient } from './support/http-client.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const silent = pino({ level: 'silent' });
const TOKEN = 'tok_acme_0123456789abcdef';
const HOUR = 3_600_000;
const DAY = 24 * HOUR;

let env: TestEnv;
let keys: IdempotencyKeys;
let api: HttpApi;
let client: ReturnType<typeof httpClient>;
const workers: IdempotentWorker<any, any>[] = [];
const closers: Array<() => Promise<unknown>> = [];
const ran: string[] = [];

beforeAll(async () => {
  env = await createTestEnv('per_job_retention_bullmq');
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema, retentionMs: DAY, maxJobRetentionMs: 10 * DAY, maxJobTombstoneMs: 100 * DAY });
  api = await createHttpApi({ keys, connection: { url: env.redisUrl }, prefix: env.redisPrefix, queues: ['http-jobs'], tokens: { [TOKEN]: 'acme' }, relayPollIntervalMs: 50, logger: silent });
  client = httpClient(await api.listen({ host: '127.0.0.1', port: 0 }));
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((worker) => worker.close({ force: true })));
});
afterAll(async () => {
  await api?.close();
  for (const close of closers.reverse()) await close();
  await env?.teardown();
});

function startWorker(queue: string): void {
  workers.push(
    createIdempotentWorker<unknown, { ok: boolean }>({
      queue,
      connection: { url: env.redisUrl },
      prefix: env.redisPrefix,
      keys,
      logger: silent,
      handler: async (ctx) => {
        ran.push(ctx.key);
        return ctx.transaction(async () => ({ ok: true }));
      },
    }),
  );
}

function producerFor(queue: string): IdempotentProducer {
  const producer = new IdempotentProducer({ queue, connection: { url: env.redisUrl }, prefix: env.redisPrefix, schema: env.schema });
  closers.push(() => producer.close());
  return producer;
}

function bullQueue(name: string): Queue {
  const queue = new Queue(name, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  closers.push(() => queue.close());
  return queue;
}

/** The key's retention (expires_at − completed_at) and its own tombstone window, once it is settled. */
async function settledRetention(scope: string, key: string): Promise<{ status: string; retentionMs: number; tombstoneMs: number | null }> {
  return waitFor(`key ${scope}/${key} to settle`, async () => {
    const { rows } = await sql<{ status: string; retention_ms: string; tombstone_ms: string | null }>`
      select status, (extract(epoch from expires_at - completed_at) * 1000)::bigint::text as retention_ms, tombstone_ms::text
        from ${sql.id(env.schema, 'idempotency_keys')} where scope = ${scope} and key = ${key} and status <> 'processing'`.execute(env.db);
    const row = rows[0];
    return row && { status: row.status, retentionMs: Number(row.retention_ms), tombstoneMs: row.tombstone_ms === null ? null : Number(row.tombstone_ms) };
  });
}

describe('the producer\'s retention option', () => {
  it('reaches the worker in the job\'s data; the completion keeps the key for it, held to the worker\'s bounds', async () => {
    const producer = producerFor('produced');
    startWorker('produced');
    await producer.enqueue({ name: 'charge', scope: 'p', key: 'week', data: { n: 1 }, retention: { resultMs: 7 * DAY, tombstoneMs: 90 * DAY } });
    await producer.enqueue({ name: 'charge', scope: 'p', key: 'year', data: { n: 2 }, retention: { resultMs: 365 * DAY } });
    await producer.enqueue({ name: 'charge', scope: 'p', key: 'plain', data: { n: 3 } });
    expect((await producer.queue.getJob(jobIdFor('p', 'week')))?.data).toMatchObject({ retention: { resultMs: 7 * DAY, tombstoneMs: 90 * DAY } });
    expect(await settledRetention('p', 'week')).toEqual({ status: 'completed', retentionMs: 7 * DAY, tombstoneMs: 90 * DAY });
    expect(await settledRetention('p', 'year')).toEqual({ status: 'completed', retentionMs: 10 * DAY, tombstoneMs: null });
    expect(await settledRetention('p', 'plain')).toEqual({ status: 'completed', retentionMs: DAY, tombstoneMs: null });
  });

  it('refuses a malformed retention before enqueueing; a foreign producer\'s malformed one fails its job as invalid data, nothing run', async () => {
    const producer = producerFor('foreign');
    await expect(producer.enqueue({ name: 'charge', scope: 'f', key: 'neg', data: {}, retention: { resultMs: -5 } })).rejects.toBeInstanceOf(ValidationError);
    await expect(producer.enqueue({ name: 'charge', scope: 'f', key: 'neg', data: {}, retention: { tombstoneMs: 0.5 } })).rejects.toMatchObject({ code: 'INVALID_JOB_DATA' });

    const queue = bullQueue('foreign');
    startWorker('foreign');
    const jobId = jobIdFor('f', 'foreign');
    await queue.add('charge', { idempotencyKey: 'foreign', scope: 'f', payload: {}, retention: { resultMs: '7 days' } }, { jobId, attempts: 3 });
    const { job } = await waitForJobState(queue, jobId, ['failed']);
    expect(job.failedReason).toMatch(/"retention" resultMs must be a whole number of milliseconds/);
    expect(job.attemptsMade).toBe(1);
    const { rows } = await sql<{ n: number }>`select count(*)::int as n from ${sql.id(env.schema, 'idempotency_keys')} where scope = 'f'`.execute(env.db);
    expect(rows[0]!.n).toBe(0);
    expect(ran).not.toContain('foreign');
  });
});

describe('the HTTP API\'s resultMs and tombstoneMs', () => {
  it('enqueue the job with that retention, shown on the job once it finished', async () => {
    startWorker('http-jobs');
    const posted = await client.post(`/v1/queues/http-jobs/jobs?resultMs=${2 * DAY}&tombstoneMs=${30 * DAY}`, { token: TOKEN, key: 'h-1', json: { n: 1 } });
    // The worker runs meanwhile: 202, or 200 when the job finished before the answer read its state.
    expect([200, 202]).toContain(posted.status);
    expect(posted.headers.get('idempotent-replayed')).toBeNull();
    expect(await settledRetention('acme', 'h-1')).toEqual({ status: 'completed', retentionMs: 2 * DAY, tombstoneMs: 30 * DAY });
    const view = await client.get('/v1/queues/http-jobs/jobs/h-1', { token: TOKEN });
    expect(view.status).toBe(200);
    expect(view.body).toMatchObject({ state: 'completed', tombstoneMs: 30 * DAY });
    expect(Date.parse(view.body.expiresAt) - Date.parse(view.body.finishedAt)).toBe(2 * DAY);
    // The key inspector's page of the job's key shows its own window (and its expiry).
    const page = await api.app.inject({ url: '/ui/view/key?scope=acme&key=h-1' });
    expect(page.statusCode).toBe(200);
    expect(page.body).toContain(`<dd data-field="tombstone-ms">${30 * DAY} ms after it finished (its job&#39;s own)</dd>`);
    expect(page.body).toMatch(/<dd data-field="expires">\d{4}-/);
  });

  it('answers 400 invalid-request for a malformed value, and enqueues nothing', async () => {
    const bad = ['resultMs=abc', 'resultMs=-1', 'resultMs=1.5', 'resultMs=1e3', 'resultMs=0', `resultMs=${1e17}`, 'tombstoneMs=-1', 'tombstoneMs=1&tombstoneMs=2', 'resultMs='];
    for (const [i, query] of bad.entries()) {
      const answer = await client.post(`/v1/queues/http-jobs/jobs?${query}`, { token: TOKEN, key: `bad-${i}`, json: { n: i } });
      expect(answer.status, query).toBe(400);
      expect(answer.body, query).toMatchObject({ type: problemType('invalid-request'), detail: expect.stringMatching(/resultMs|tombstoneMs/) });
    }
    const { rows } = await sql<{ n: number }>`select count(*)::int as n from ${sql.id(env.schema, 'idempotency_keys')} where key like 'bad-%'`.execute(env.db);
    expect(rows[0]!.n).toBe(0);
  });
});
