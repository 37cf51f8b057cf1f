// @module-tag redis
/**
 * A run whose concurrency slot is lost (no renewal confirmed for a lease: its time may be up and
 * another run in it), through the worker on real Postgres and Redis: the run is told, on the
 * leased path after its commit too, and a fast-path run is not started again beside the run that
 * may hold its slot now.
 */
import { Queue } from 'bullmq';
import { pino } from 'pino';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { IdempotencyKeys, createIdempotentWorker, type IdempotentWorker } from '../src/index.js';
import { ConcurrencySlotLostError } from '../src/consumer/concurrency-slot-heartbeat.js';
import { PostgresKeyStore, type KeyStore } from '../src/store/index.js';
import { sleep, waitFor } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const LEASE_MS = 1_000;
const GROUP = { concurrencyKey: 'tenant:lost', concurrencyLimit: 1 };

let env: TestEnv;
const workers: IdempotentWorker<any, any>[] = [];
const queues: Queue[] = [];
beforeAll(async () => {
  env = await createTestEnv('concurrency_slot_loss');
});
afterAll(async () => {
  for (const worker of workers) await worker.close({ force: true });
  for (const queue of queues) await queue.close();
  await env?.teardown();
});

/** The store, its slot renewals failing as a Postgres that drops the connection would have them. */
function failingRenewals(store: KeyStore): KeyStore {
  return new Proxy(store, {
    get(target, property) {
      if (property === 'renewSlots') {
        return async () => {
          throw Object.assign(new Error('terminating connection due to administrator command (injected)'), { code: '57P01' });
        };
      }
      const value = Reflect.get(target, property, target) as unknown;
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
}

/** The worker options every case shares: this file's Redis, and keys whose slot renewals fail. */
function workerOn(queue: string) {
  const keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: LEASE_MS }, failingRenewals(new PostgresKeyStore(env.db, env.schema)));
  return { queue, connection: { url: env.redisUrl }, prefix: env.redisPrefix, keys, logger: pino({ level: 'silent' }) };
}

function queueNamed(name: string): Queue {
  const queue = new Queue(name, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  queues.push(queue);
  return queue;
}

it('leased path: a slot lost after the commit aborts ctx.signal while the handler goes on', async () => {
  const seen: { aborted?: boolean; reason?: unknown } = {};
  workers.push(
    createIdempotentWorker<{ n: number }>({
      ...workerOn('lost-after-commit'),
      handler: async (ctx) => {
        const result = await ctx.transaction(async () => ctx.data.n);
        // Work after the commit is still the run's: its slot bounds it.
        const aborted = new Promise<boolean>((resolve) => ctx.signal.addEventListener('abort', () => resolve(true), { once: true }));
        seen.aborted = await Promise.race([aborted, sleep(LEASE_MS * 4).then(() => ctx.signal.aborted)]);
        seen.reason = ctx.signal.reason;
        return result;
      },
    }),
  );
  await queueNamed('lost-after-commit').add('j', { idempotencyKey: 'after-commit', scope: 's', payload: { n: 1 }, ...GROUP }, { jobId: 'after-commit' });
  await waitFor('the handler to end', async () => seen.aborted !== undefined || undefined, 20_000);
  expect(seen.aborted).toBe(true);
  expect(seen.reason).toBeInstanceOf(ConcurrencySlotLostError);
});

it('fast path with group commit: a run whose slot was lost is not started again when its group runs it alone', async () => {
  const starts: boolean[] = [];
  workers.push(
    createIdempotentWorker<{ ms: number }>({
      ...workerOn('lost-fast-path'),
      fastPath: true,
      concurrency: 4,
      handler: {
        // Longer than the lease and than a group's slow-job bound: the slot is lost while it runs,
        // and its group runs it alone again (its other runs are not the subject here).
        transaction: async (_tx, ctx) => {
          starts.push(ctx.signal.aborted);
          await sleep(ctx.data.ms);
          return 1;
        },
      },
    }),
  );
  await queueNamed('lost-fast-path').add('j', { idempotencyKey: 'fast', scope: 's', payload: { ms: LEASE_MS * 1.3 }, ...GROUP }, { jobId: 'fast' });
  await waitFor('the first run', async () => starts.length > 0 || undefined, 20_000);
  // Long enough for the first run to end and its group to give its verdict.
  await sleep(LEASE_MS * 2);
  // The job, deferred without an attempt, runs again later in a slot it takes afresh: that run
  // starts with its signal clear. A start with the signal already aborted is the lost run's
  // handler started again.
  expect(starts.length).toBeGreaterThan(0);
  expect(starts.filter((aborted) => aborted)).toEqual([]);
});
