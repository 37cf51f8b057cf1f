// @module-tag redis
/**
 * Job data from a foreign producer, written raw into BullMQ (default job options: one
 * attempt), to a real idempotent worker. Every job either runs once or fails for good with an
 * error that says what is wrong (and, once they are known, names its scope and key); none
 * fails with an internal error ("Maximum call stack size exceeded", "Lone surrogate is not
 * allowed"), and no key is left `processing` after the drain.
 */
import { Queue } from 'bullmq';
import fc from 'fast-check';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, createIdempotentWorker, type IdempotentWorker, type JobContext } from '../src/index.js';
import { createEffectsTable, insertEffect } from './support/protocol-fixtures.js';
import { waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const silent = pino({ level: 'silent' });
/** Failure messages that name an internal error instead of what is wrong with the data. */
const INTERNAL_ERRORS = /Maximum call stack|Lone surrogate is not allowed|Infinity is not allowed|invalid byte sequence|untranslatable/i;

let env: TestEnv;
let run = 0;
const queues = new Map<string, Queue>();
const workers: IdempotentWorker<unknown, unknown>[] = [];
/** Payloads as the handler received them, by key. */
const received = new Map<string, unknown>();

beforeAll(async () => {
  env = await createTestEnv('wire-fuzz');
  await createEffectsTable(env.db, env.schema);
  for (const [queue, fastPath] of [['leased', false], ['fast', true]] as const) {
    queues.set(queue, new Queue(queue, { connection: { url: env.redisUrl }, prefix: env.redisPrefix }));
    const worker = createIdempotentWorker<unknown, unknown>({
      queue,
      connection: { url: env.redisUrl },
      prefix: env.redisPrefix,
      keys: new IdempotencyKeys({ db: env.db, schema: env.schema }),
      fastPath,
      concurrency: 4,
      logger: silent,
      handler: async (ctx: JobContext<unknown>) => {
        received.set(ctx.key, ctx.data);
        return ctx.transaction(async (tx) => {
          await insertEffect(tx, env.schema, { scope: ctx.scope, key: ctx.key, fence: ctx.fence, worker: queue });
          return { ran: true };
        });
      },
    });
    workers.push(worker);
  }
});
afterAll(async () => {
  await Promise.all(workers.map((worker) => worker.close({ force: true })));
  await Promise.all([...queues.values()].map((queue) => queue.close()));
  await env?.teardown();
});

async function keysLeftProcessing(): Promise<number> {
  const { rows } = await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, 'idempotency_keys')} where status = 'processing'`.execute(env.db);
  return Number(rows[0]!.n);
}

async function effectsOfKey(scope: string, key: string): Promise<number> {
  const { rows } = await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, 'effects')} where scope = ${scope} and key = ${key}`.execute(env.db);
  return Number(rows[0]!.n);
}

/** Adds jobs as a foreign producer would (no job id, no options) and waits until each has finished. */
async function enqueueRaw(queue: string, jobs: ReadonlyArray<{ name: string; data: unknown }>) {
  const added = await queues.get(queue)!.addBulk(jobs.map((job) => ({ name: job.name, data: job.data })));
  return Promise.all(added.map(async (job) => (await waitForJobState(queues.get(queue)!, job.id!, ['completed', 'failed'])).job));
}

/**
 * Adds one job whose data is the JSON `text` exactly as a producer in another language would
 * write it (JSON.stringify in this process would overflow on 5,000 levels before BullMQ
 * stored anything): the job is added delayed, its data replaced in Redis, then promoted.
 */
async function enqueueRawJson(queue: string, name: string, text: string) {
  const bull = queues.get(queue)!;
  const placeholder = await bull.add(name, {}, { delay: 3_600_000 });
  await env.openRedis().hset(`${env.redisPrefix}:${queue}:${placeholder.id}`, 'data', text);
  await placeholder.promote();
  return (await waitForJobState(bull, placeholder.id!, ['completed', 'failed'])).job;
}

const nested = (depth: number, leaf: unknown): unknown => {
  let value = leaf;
  for (let level = 0; level < depth; level++) value = level % 2 === 0 ? [value] : { d: value };
  return value;
};

describe('job data from a foreign producer', () => {
  it('a payload nested 5,000 deep fails for good, naming scope, key and the depth (not "Maximum call stack size exceeded")', async () => {
    const text = `{"idempotencyKey":"deep-1","scope":"shop","payload":${'['.repeat(5000)}1${']'.repeat(5000)}}`;
    const job = await enqueueRawJson('leased', 'charge', text);
    expect(await job.getState()).toBe('failed');
    expect(job.failedReason).toMatch(/"payload" is nested deeper than 64 levels.*scope "shop", key "deep-1"/);
    expect(job.failedReason).not.toMatch(INTERNAL_ERRORS);
    expect(await keysLeftProcessing()).toBe(0);
  });

  it('a payload holding a lone surrogate fails for good, naming scope, key and where (not "Lone surrogate is not allowed")', async () => {
    const [inValue, inKey] = await enqueueRaw('leased', [
      { name: 'charge', data: { idempotencyKey: 'lone-1', scope: 'shop', payload: { note: ['ok', 'a\ud800b'] } } },
      { name: 'charge', data: { idempotencyKey: 'lone-2', payload: { ['k\udc00']: 1 } } },
    ]);
    expect(inValue!.failedReason).toMatch(/"payload" holds a lone UTF-16 surrogate .* at \/note\/1 \(scope "shop", key "lone-1"\)/);
    expect(inKey!.failedReason).toMatch(/has a key that holds a lone UTF-16 surrogate .* at \/k\\udc00 \(scope "default", key "lone-2"\)/);
    // A lone surrogate in the key itself: Postgres would store it as U+FFFD, merging keys.
    const [badKey] = await enqueueRaw('fast', [{ name: 'charge', data: { idempotencyKey: 'lone-\udbff', payload: 1 } }]);
    expect(badKey!.failedReason).toMatch(/the key holds a lone UTF-16 surrogate .*key "lone-\\udbff"/);
    expect(await keysLeftProcessing()).toBe(0);
  });

  it('a number beyond ±1.8e308 written by another producer (1e400 parses as Infinity) fails for good, naming scope, key and where', async () => {
    const job = await enqueueRawJson('fast', 'charge', '{"idempotencyKey":"huge-1","scope":"shop","payload":{"amount":[1, -1e400]}}');
    expect(await job.getState()).toBe('failed');
    expect(job.failedReason).toMatch(/"payload" is a number JSON cannot hold \(-Infinity.* at \/amount\/1 \(scope "shop", key "huge-1"\)/);
    expect(await keysLeftProcessing()).toBe(0);
  });

  it('non-finite numbers from JavaScript reach BullMQ as null (JSON.stringify), so such a job runs with null', async () => {
    const [job] = await enqueueRaw('leased', [{ name: 'charge', data: { idempotencyKey: 'inf-1', payload: { a: Infinity, b: [NaN, -Infinity] } } }]);
    expect(await job!.getState()).toBe('completed');
    expect(received.get('inf-1')).toEqual({ a: null, b: [null, null] });
  });

  it('random job data: each job runs once or fails with a clear error; no key is left processing', async () => {
    const lone = fc.integer({ min: 0xd800, max: 0xdfff }).map((code) => String.fromCharCode(code));
    const scope = fc.constantFrom(undefined, 'tenant-a', 'ü-scope', 'a:b');
    type Case = { readonly kind: string; readonly build: (key: string) => { name: string; data: unknown }; readonly reason?: RegExp };
    const cases: fc.Arbitrary<Case> = fc.oneof(
      fc.record({ payload: fc.jsonValue({ stringUnit: 'binary', maxDepth: 5 }), scope }).map(({ payload, scope }) => ({
        kind: 'valid',
        build: (key: string) => ({ name: 'job', data: { idempotencyKey: key, scope, payload } }),
      })),
      fc.integer({ min: 0, max: 64 }).map((depth) => ({
        kind: 'valid',
        build: (key: string) => ({ name: 'job', data: { idempotencyKey: key, payload: nested(depth, 'leaf') } }),
      })),
      fc.constantFrom(1e308, -Number.MAX_VALUE, 2 ** 60, Infinity, NaN, Number.MIN_VALUE).map((n) => ({
        kind: 'valid',
        build: (key: string) => ({ name: 'job', data: { idempotencyKey: key, payload: { n } } }),
      })),
      fc.integer({ min: 65, max: 3000 }).map((depth) => ({
        kind: 'deep',
        build: (key: string) => ({ name: 'job', data: { idempotencyKey: key, payload: nested(depth, 0) } }),
        reason: /nested deeper than 64 levels/,
      })),
      fc.tuple(lone, fc.boolean(), fc.jsonValue({ maxDepth: 2 })).map(([char, asKey, other]) => ({
        kind: 'lone-in-payload',
        build: (key: string) => ({ name: 'job', data: { idempotencyKey: key, payload: { other, [asKey ? `x${char}` : 'x']: asKey ? 1 : `a${char}b` } } }),
        reason: /lone UTF-16 surrogate .* at \/x/,
      })),
      lone.map((char) => ({
        kind: 'lone-in-key-or-scope',
        build: (key: string) => ({ name: 'job', data: { idempotencyKey: `${key}${char}`, payload: 1 } }),
        reason: /the key holds a lone UTF-16 surrogate/,
      })),
      fc.constant({
        kind: 'nul-in-name',
        build: (key: string) => ({ name: 'job\u0000name', data: { idempotencyKey: key, payload: 1 } }),
        reason: /the job name holds a NUL character/,
      }),
      fc
        .constantFrom<(key: string) => unknown>(
          () => null,
          () => 42,
          () => 'text',
          () => [1, 2],
          () => ({ payload: 1 }),
          (key) => ({ idempotencyKey: key }),
          () => ({ idempotencyKey: 5, payload: 1 }),
          () => ({ idempotencyKey: '', payload: 1 }),
          () => ({ idempotencyKey: 'k'.repeat(300), payload: 1 }),
          (key) => ({ idempotencyKey: `${key}\u0000`, payload: 1 }),
          (key) => ({ idempotencyKey: key, scope: 7, payload: 1 }),
        )
        .map((data) => ({
          kind: 'malformed',
          build: (key: string) => ({ name: 'job', data: data(key) }),
          reason: /was not run: (Malformed job data|Idempotency (key|scope))/,
        })),
    );

    await fc.assert(
      fc.asyncProperty(fc.array(cases, { minLength: 1, maxLength: 12 }), fc.constantFrom('leased', 'fast'), async (batch, queue) => {
        run++;
        const jobs = batch.map((each, index) => ({ each, key: `r${run}-${index}`, ...each.build(`r${run}-${index}`) }));
        const finished = await enqueueRaw(queue, jobs);
        for (const [index, job] of finished.entries()) {
          const { each, key, data } = jobs[index]!;
          const state = await job.getState();
          if (each.kind === 'valid') {
            expect({ kind: each.kind, state, reason: job.failedReason }).toEqual({ kind: 'valid', state: 'completed', reason: undefined });
            const scope = (data as { scope?: string }).scope ?? 'default';
            expect(await effectsOfKey(scope, key)).toBe(1);
          } else {
            expect({ kind: each.kind, state }).toEqual({ kind: each.kind, state: 'failed' });
            expect(job.failedReason).toMatch(each.reason!);
            expect(job.failedReason).not.toMatch(INTERNAL_ERRORS);
            expect(job.attemptsMade).toBeLessThanOrEqual(1);
          }
        }
        expect(await keysLeftProcessing()).toBe(0);
      }),
      { numRuns: 15 },
    );
  });
});
