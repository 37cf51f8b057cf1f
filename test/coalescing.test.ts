// @module-tag redis
/**
 * Coalescing mode: one running job plus at most one pending successor per key, the newest
 * payload winning; each run's effect commits once, also when the running worker is replaced.
 */
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, IdempotentProducer, createIdempotentWorker, type IdempotentWorker, type WorkerEvent } from '../src/index.js';
import { createEffectsTable, createGate } from './support/protocol-fixtures.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let keys: IdempotencyKeys;
const workers: IdempotentWorker<any, any>[] = [];
const queues: Queue[] = [];

beforeAll(async () => {
  env = await createTestEnv('coalescing');
  await createEffectsTable(env.db, env.schema);
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.close({ force: true })));
  await Promise.all(queues.splice(0).map((q) => q.close()));
});
afterAll(async () => {
  await env?.teardown();
});

async function runs(key: string): Promise<Array<{ key: string; worker: string }>> {
  const { rows } = await sql<{ key: string; worker: string }>`
    select key, worker from ${sql.id(env.schema, 'effects')} where key like ${`${key}#%`} order by id`.execute(env.db);
  return rows;
}

describe('coalescing keys (protocol)', () => {
  it('runs the first arrival, folds arrivals during its run into one successor with the newest payload, and starts afresh once it finished', async () => {
    expect(await keys.coalesceArrive('c', 'entity-1', 'j1', { v: 1 })).toEqual({ action: 'run', generation: 1, payload: { v: 1 } });
    // A redelivery of the running job runs its own generation again.
    expect(await keys.coalesceArrive('c', 'entity-1', 'j1', { v: 1 })).toEqual({ action: 'run', generation: 1, payload: { v: 1 } });
    expect(await keys.coalesceArrive('c', 'entity-1', 'j2', { v: 2 })).toEqual({ action: 'coalesced' });
    expect(await keys.coalesceArrive('c', 'entity-1', 'j3', { v: 3 })).toEqual({ action: 'coalesced' });
    // Another job cannot take the successor while j1 runs; j1 takes it once its run ends.
    expect(await keys.coalesceNext('c', 'entity-1', 'j2', 1)).toBeUndefined();
    expect(await keys.coalesceNext('c', 'entity-1', 'j1', 1)).toEqual({ generation: 2, payload: { v: 3 } });
    expect(await keys.coalesceNext('c', 'entity-1', 'j1', 2)).toBeUndefined();
    // Generation 2 finished (its key completed): the next arrival runs generation 3 itself.
    const claim = await keys.claim('c', 'entity-1#2', keys.fingerprint('x'));
    if (claim.kind !== 'claimed') throw new Error(claim.kind);
    await keys.runEffect(claim, async () => 'done');
    expect(await keys.coalesceArrive('c', 'entity-1', 'j4', { v: 4 })).toEqual({ action: 'run', generation: 3, payload: { v: 4 } });
  });

  it('orders payloads by when they were sent: an arrival held back (a delivery deferred by a fault) never replaces or outruns a newer one', async () => {
    const sent = (s: number) => ({ sentAtMs: Date.UTC(2026, 0, 1, 0, 0, s) });
    expect(await keys.coalesceArrive('c', 'entity-2', 'j2', { v: 2 }, sent(2))).toEqual({ action: 'run', generation: 1, payload: { v: 2 } });
    expect(await keys.coalesceArrive('c', 'entity-2', 'j5', { v: 5 }, sent(5))).toEqual({ action: 'coalesced' });
    // Sent before the pending payload: superseded, the pending one stays.
    expect(await keys.coalesceArrive('c', 'entity-2', 'j4', { v: 4 }, sent(4))).toEqual({ action: 'coalesced' });
    expect(await keys.coalesceNext('c', 'entity-2', 'j2', 1)).toEqual({ generation: 2, payload: { v: 5 } });
    const claim = await keys.claim('c', 'entity-2#2', keys.fingerprint('x'));
    if (claim.kind !== 'claimed') throw new Error(claim.kind);
    await keys.runEffect(claim, async () => 'done');
    // Nothing in flight, but the newest payload sent has run: one sent before it does not run after it.
    expect(await keys.coalesceArrive('c', 'entity-2', 'j1', { v: 1 }, sent(1))).toEqual({ action: 'coalesced' });
    // A newer one runs; one without a send time goes by its arrival, as before.
    expect(await keys.coalesceArrive('c', 'entity-2', 'j6', { v: 6 }, sent(6))).toEqual({ action: 'run', generation: 3, payload: { v: 6 } });
    expect(await keys.coalesceArrive('c', 'entity-2', 'j7', { v: 7 })).toEqual({ action: 'coalesced' });
    expect(await keys.coalesceNext('c', 'entity-2', 'j6', 3)).toEqual({ generation: 4, payload: { v: 7 } });
  });
});

describe('coalescing producers', () => {
  it('IdempotentProducer gives each coalescing job an id of its own and marks it, so BullMQ keeps every arrival', async () => {
    const producer = new IdempotentProducer({ queue: 'coalesce-producer', connection: { url: env.redisUrl }, prefix: env.redisPrefix });
    try {
      const first = await producer.enqueue({ name: 'sync', scope: 'c', key: 'account-7', data: { v: 1 }, coalesce: true });
      const second = await producer.enqueue({ name: 'sync', scope: 'c', key: 'account-7', data: { v: 2 }, coalesce: true });
      expect([first.status, second.status]).toEqual(['added', 'added']);
      expect(first.jobId).toMatch(/^ijc_[0-9a-f]{32}$/);
      expect(second.jobId).not.toBe(first.jobId);
      const queue = new Queue('coalesce-producer', { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
      queues.push(queue);
      expect((await queue.getJob(second.jobId))?.data).toMatchObject({ idempotencyKey: 'account-7', coalesce: true, payload: { v: 2 } });
    } finally {
      await producer.close();
    }
  });
});

describe('coalescing workers', () => {
  it('a burst while one run is in flight collapses into one successor run with the newest payload; each run commits once', { timeout: 60_000 }, async () => {
    const queue = new Queue('coalesce', { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
    queues.push(queue);
    const gate = createGate();
    const started = createGate();
    const events: WorkerEvent[] = [];
    const seen: unknown[] = [];
    const worker = createIdempotentWorker<{ v: number }>({
      queue: 'coalesce',
      connection: { url: env.redisUrl },
      prefix: env.redisPrefix,
      keys,
      concurrency: 4,
      logger: pino({ level: 'silent' }),
      handler: async (ctx) => {
        seen.push(ctx.data.v);
        if (ctx.data.v === 1) {
          started.open();
          await gate.wait;
        }
        return ctx.transaction(async (tx) => {
          await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${`v${ctx.data.v}`})`.execute(tx);
          return ctx.data.v;
        });
      },
    });
    worker.on('event', (event: WorkerEvent) => events.push(event));
    workers.push(worker);
    const data = (v: number) => ({ idempotencyKey: 'account-42', scope: 'c', payload: { v }, coalesce: true });
    await queue.add('sync', data(1), { jobId: 'burst-1' });
    await started.wait;
    for (let v = 2; v <= 6; v++) {
      await queue.add('sync', data(v), { jobId: `burst-${v}` });
      await waitForJobState(queue, `burst-${v}`, ['completed']);
    }
    gate.open();
    await waitForJobState(queue, 'burst-1', ['completed']);
    expect(seen).toEqual([1, 6]);
    expect(await runs('account-42')).toEqual([
      { key: 'account-42#1', worker: 'v1' },
      { key: 'account-42#2', worker: 'v6' },
    ]);
    expect((await queue.getJob('burst-1'))?.returnvalue).toBe(6);
    expect(events.filter((e) => e.kind === 'coalesced')).toHaveLength(5);
    // After the burst, a new arrival runs a fresh generation at once.
    await queue.add('sync', data(7), { jobId: 'later-7' });
    await waitFor('generation 3 to commit', async () => ((await runs('account-42')).length === 3 ? true : undefined));
    expect((await runs('account-42'))[2]).toEqual({ key: 'account-42#3', worker: 'v7' });
  });
});
