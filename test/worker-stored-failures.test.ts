// @module-tag redis
/**
 * Every failure is recorded: an error whose message Postgres jsonb would refuse (a NUL, a lone
 * surrogate) is stored sanitised, and a payload that `storePayload` cannot keep is refused
 * clearly at the claim. No key is left `processing` for the sweeper.
 */
import { randomUUID } from 'node:crypto';
import { Queue } from 'bullmq';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, createIdempotentWorker, type IdempotentWorker, type IdempotentWorkerOptions, type JobHandler } from '../src/index.js';
import { PostgresKeyStore } from '../src/store/postgres-key-store.js';
import { waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let keys: IdempotencyKeys;
let queue: Queue;
const QUEUE = 'stored-failures';
const workers: IdempotentWorker<any, any>[] = [];

beforeAll(async () => {
  env = await createTestEnv('stored_failures');
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
  queue = new Queue(QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((worker) => worker.close({ force: true })));
});
afterAll(async () => {
  await queue?.close();
  await env?.teardown();
});

function startWorker(handler: JobHandler<any>, options: Partial<IdempotentWorkerOptions<any>> = {}) {
  const worker = createIdempotentWorker<any>({
    queue: QUEUE,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    keys,
    handler,
    logger: pino({ level: 'silent' }),
    ...options,
  });
  workers.push(worker);
  return worker;
}

/**
 * A handler that throws an error carrying `payload.message`, followed by half a surrogate pair
 * when `payload.loneSurrogate` (job data cannot carry one: its fingerprint refuses it).
 */
const throwing: JobHandler<{ message: string; loneSurrogate?: boolean }> = async (ctx) => {
  throw new Error(ctx.data.message + (ctx.data.loneSurrogate ? '\ud800.' : ''));
};

async function runToFailure(key: string, payload: unknown, attempts = 1) {
  const job = await queue.add('job', { idempotencyKey: key, scope: 'sf', payload }, { jobId: `job-${randomUUID()}`, attempts });
  return (await waitForJobState(queue, job.id!, ['failed'], 20_000)).job;
}

describe.each([
  { path: 'leased path', fastPath: false },
  { path: 'fast path', fastPath: true },
])('worker, $path', ({ fastPath }) => {
  const prefix = fastPath ? 'fast' : 'leased';

  it('1. an error message with a NUL is stored with U+FFFD: the key ends failed, the job failed once', async () => {
    startWorker(throwing, { fastPath });
    // JSON.parse of binary data quotes the raw NUL in its message.
    const failed = await runToFailure(`${prefix}-nul`, { message: 'Unexpected token \u0000 in binary body' });
    expect(failed.attemptsMade).toBe(1);
    expect(failed.failedReason).toContain('in binary body');
    const record = await keys.get('sf', `${prefix}-nul`);
    expect(record).toMatchObject({ status: 'failed', error: { name: 'Error', message: 'Unexpected token \ufffd in binary body' } });
  });

  it('2. an error message with a lone surrogate is stored with U+FFFD, on a retried attempt (released) and the last (failed)', async () => {
    startWorker(throwing, { fastPath });
    const failed = await runToFailure(`${prefix}-surrogate`, { message: 'half an emoji: ', loneSurrogate: true }, 2);
    expect(failed.attemptsMade).toBe(2);
    const record = await keys.get('sf', `${prefix}-surrogate`);
    expect(record).toMatchObject({ status: 'failed', error: { message: 'half an emoji: \ufffd.' } });
  });

  it('3. with storePayload, a payload jsonb cannot store is refused at the claim: one unrecoverable failure naming scope and key, no key left processing', async () => {
    let runs = 0;
    startWorker(async () => ++runs, { fastPath, storePayload: true });
    // (A lone surrogate never gets this far: the job's fingerprint refuses it.)
    const key = `${prefix}-payload-nul`;
    const failed = await runToFailure(key, { text: 'a\u0000b' }, 3);
    expect(failed.attemptsMade, 'unrecoverable: no retries').toBe(1);
    expect(failed.failedReason).toMatch(new RegExp(`idempotency key "${key}" in scope "sf" cannot be stored`));
    expect(failed.failedReason).toMatch(/NUL character/);
    // The leased path refuses before claiming; the fast path records the refusal on the key, without the payload.
    const record = await keys.get('sf', key);
    if (fastPath) expect(record).toMatchObject({ status: 'failed', error: { code: 'INVALID_JOB_DATA' }, payload: null });
    else expect(record).toBeUndefined();
    expect(runs).toBe(0);
  });
});

describe('recordFailure', () => {
  it('4. when the failure cannot be stored after its claim, the key is released (claimable at once), not left processing', async () => {
    const store = new PostgresKeyStore(env.db, env.schema);
    store.fail = async () => {
      throw new Error('the store refused the failure');
    };
    const refusing = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 60_000 }, store);
    const fingerprint = keys.fingerprint({ n: 1 });
    await expect(refusing.recordFailure('sf', 'record-refused', fingerprint, new Error('effect failed'))).rejects.toThrow(/refused the failure/);
    expect(await keys.get('sf', 'record-refused')).toMatchObject({ status: 'processing', owner: null, error: { message: 'effect failed' } });
    expect((await keys.claim('sf', 'record-refused', fingerprint)).kind).toBe('taken-over');
  });

  it('5. when its claim is taken over before the failure is stored, nothing is recorded and the outcome says the key is in progress', async () => {
    const store = new PostgresKeyStore(env.db, env.schema);
    const fingerprint = keys.fingerprint({ n: 2 });
    store.fail = async (claim, errorJson, retentionMs) => {
      await keys.release(claim);
      expect((await keys.claim('sf', 'record-taken-over', fingerprint)).kind).toBe('taken-over');
      return PostgresKeyStore.prototype.fail.call(store, claim, errorJson, retentionMs);
    };
    const racing = new IdempotencyKeys({ db: env.db, schema: env.schema }, store);
    const outcome = await racing.recordFailure('sf', 'record-taken-over', fingerprint, new Error('effect failed'));
    expect(outcome).toEqual({ kind: 'in-progress', scope: 'sf', key: 'record-taken-over', retryAfterMs: 0 });
    expect(await keys.get('sf', 'record-taken-over')).toMatchObject({ status: 'processing', fence: 2 });
  });
});
