// @module-tag redis
/**
 * Coalescing mode: one running job plus at most one pending successor per key, the newest
 * payload winning; each run's effect commits once, also when the running worker is replaced.
 */
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  IdempotencyKeys,
  IdempotentProducer,
  KeyedJobRunner,
  OutboxRelay,
  StoreUnavailableError,
  createIdempotentWorker,
  identityFromWireContract,
  resolveWorkerTiming,
  toWireJobData,
  type IdempotentWorker,
  type JobIdentity,
  type WorkerEvent,
} from '../src/index.js';
import { Janitor, type FaultHook } from '../src/process/index.js';
import { PostgresKeyStore } from '../src/store/index.js';
import { PostgresOperatorStore } from '../src/store/operator-store.js';
import { faultingKeyStore, type FaultPlan } from './support/faulting-key-store.js';
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

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function janitor(options: { retentionMs?: number } = {}): Janitor {
  return new Janitor({ db: env.db, schema: env.schema, logger: pino({ level: 'silent' }), ...options });
}

/** Runs generation `generation` of a coalescing key to its commit, as its job would. */
async function finishGeneration(key: string, generation: number, retention?: { resultMs: number }, scope = 'c', on = keys): Promise<void> {
  const claim = await on.claim(scope, `${key}#${generation}`, on.fingerprint('x'), retention ? { retention } : {});
  if (claim.kind !== 'claimed') throw new Error(claim.kind);
  await on.runEffect(claim, async () => 'done');
}

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
    await finishGeneration('entity-2', 2);
    expect(await keys.coalesceNext('c', 'entity-2', 'j2', 2)).toBeUndefined();
    // Nothing in flight, but the newest payload sent has run: one sent before it does not run after it.
    expect(await keys.coalesceArrive('c', 'entity-2', 'j1', { v: 1 }, sent(1))).toEqual({ action: 'coalesced' });
    // A newer one runs; one without a send time goes by its arrival, as before.
    expect(await keys.coalesceArrive('c', 'entity-2', 'j6', { v: 6 }, sent(6))).toEqual({ action: 'run', generation: 3, payload: { v: 6 } });
    expect(await keys.coalesceArrive('c', 'entity-2', 'j7', { v: 7 })).toEqual({ action: 'coalesced' });
    expect(await keys.coalesceNext('c', 'entity-2', 'j6', 3)).toEqual({ generation: 4, payload: { v: 7 } });
  });

  it('hands the running job, delivered again after its generation finished, the pending successor rather than its finished generation', async () => {
    expect(await keys.coalesceArrive('c', 'entity-3', 'j1', { v: 1 })).toEqual({ action: 'run', generation: 1, payload: { v: 1 } });
    expect(await keys.coalesceArrive('c', 'entity-3', 'j2', { v: 2 })).toEqual({ action: 'coalesced' });
    // Generation 1 commits; j1 never hands over (a fault, a crash): its redelivery does.
    await finishGeneration('entity-3', 1);
    expect(await keys.coalesceArrive('c', 'entity-3', 'j1', { v: 1 })).toEqual({ action: 'run', generation: 2, payload: { v: 2 } });
    // Delivered once more after generation 2 finished, nothing pending: nothing runs again.
    await finishGeneration('entity-3', 2);
    expect(await keys.coalesceArrive('c', 'entity-3', 'j1', { v: 1 })).toEqual({ action: 'finished', generation: 2 });
  });

  it('counts a generation whose key the janitor deleted after its retention as finished: nothing runs again, the next arrival runs', async () => {
    expect(await keys.coalesceArrive('c', 'entity-4', 'j1', { v: 1 })).toEqual({ action: 'run', generation: 1, payload: { v: 1 } });
    // Kept 1 ms, then deleted by the janitor before j1 hands over (it crashed after its commit).
    await finishGeneration('entity-4', 1, { resultMs: 1 });
    await sleep(5);
    expect((await janitor().runOnce()).keysDeleted).toBeGreaterThan(0);
    expect(await keys.get('c', 'entity-4#1')).toBeUndefined();
    expect(await keys.coalesceArrive('c', 'entity-4', 'j1', { v: 1 })).toEqual({ action: 'finished', generation: 1 });
    expect(await keys.coalesceArrive('c', 'entity-4', 'j2', { v: 2 })).toEqual({ action: 'run', generation: 2, payload: { v: 2 } });
  });

  it('counts a send time ahead of the database clock as the clock at arrival: a producer clock minutes fast does not drop later updates', async () => {
    const tenMinutesAhead = Date.now() + 10 * 60_000;
    expect(await keys.coalesceArrive('c', 'entity-5', 'fast', { v: 1 }, { sentAtMs: tenMinutesAhead })).toEqual({ action: 'run', generation: 1, payload: { v: 1 } });
    // Sent by a right clock after the fast one arrived: newer, so it is the pending successor, and runs after generation 1.
    expect(await keys.coalesceArrive('c', 'entity-5', 'right', { v: 2 }, { sentAtMs: Date.now() + 1 })).toEqual({ action: 'coalesced' });
    expect(await keys.coalesceNext('c', 'entity-5', 'fast', 1)).toEqual({ generation: 2, payload: { v: 2 } });
    await finishGeneration('entity-5', 2);
    expect(await keys.coalesceNext('c', 'entity-5', 'fast', 2)).toBeUndefined();
    expect(await keys.coalesceArrive('c', 'entity-5', 'right-2', { v: 3 }, { sentAtMs: Date.now() + 1 })).toEqual({ action: 'run', generation: 3, payload: { v: 3 } });
    const { rows } = await sql<{ ahead: boolean }>`
      select newest_sent_at > now() as ahead from ${sql.id(env.schema, 'coalescing_keys')} where scope = 'c' and key = 'entity-5'`.execute(env.db);
    expect(rows[0]!.ahead).toBe(false);
  });

  it('counts every delivery of a job stamped ahead of the database clock as sent at its first arrival: delivered again after a newer payload, it runs nothing', async () => {
    const ahead = { sentAtMs: Date.now() + 10 * 60_000 };
    expect(await keys.coalesceArrive('c', 'entity-6', 'j1', { v: 1 }, ahead)).toEqual({ action: 'run', generation: 1, payload: { v: 1 } });
    // Generation 1 commits; j1 crashes before it hands over. A newer arrival runs at once.
    await finishGeneration('entity-6', 1);
    expect(await keys.coalesceArrive('c', 'entity-6', 'j2', { v: 2 }, { sentAtMs: Date.now() + 1 })).toEqual({ action: 'run', generation: 2, payload: { v: 2 } });
    expect(await keys.coalesceArrive('c', 'entity-6', 'j1', { v: 1 }, ahead)).toEqual({ action: 'finished', generation: 1 });
    await finishGeneration('entity-6', 2);
    expect(await keys.coalesceArrive('c', 'entity-6', 'j3', { v: 3 }, { sentAtMs: Date.now() + 1 })).toEqual({ action: 'run', generation: 3, payload: { v: 3 } });
    // Delivered once more, stamped ten minutes ahead (later than j3 by the database's clock now):
    // it counts as sent when it first arrived, before j2 and j3.
    expect(await keys.coalesceArrive('c', 'entity-6', 'j1', { v: 1 }, ahead)).toEqual({ action: 'coalesced' });
    // So does a job without a send time (RabbitMQ): j4 is pending; delivered again after j5 arrived, it stays superseded.
    expect(await keys.coalesceArrive('c', 'entity-6', 'j4', { v: 4 })).toEqual({ action: 'coalesced' });
    expect(await keys.coalesceArrive('c', 'entity-6', 'j5', { v: 5 }, { sentAtMs: Date.now() + 1 })).toEqual({ action: 'coalesced' });
    expect(await keys.coalesceArrive('c', 'entity-6', 'j4', { v: 4 })).toEqual({ action: 'coalesced' });
    expect(await keys.coalesceNext('c', 'entity-6', 'j3', 3)).toEqual({ generation: 4, payload: { v: 5 } });
  });

  it('runs a payload once when the job that sent it, stamped ahead and coalesced, is delivered again after a newer payload (a shrunk counterexample of the property test)', async () => {
    const ahead = { sentAtMs: Date.now() + 10 * 60_000 };
    expect(await keys.coalesceArrive('c', 'entity-8', 'j1', { v: 1 }, { sentAtMs: Date.now() })).toMatchObject({ action: 'run', generation: 1 });
    // j2's arrival is folded into j1's run, and its acknowledgement lost.
    expect(await keys.coalesceArrive('c', 'entity-8', 'j2', { v: 2 }, ahead)).toEqual({ action: 'coalesced' });
    await finishGeneration('entity-8', 1);
    expect(await keys.coalesceNext('c', 'entity-8', 'j1', 1)).toEqual({ generation: 2, payload: { v: 2 } });
    await finishGeneration('entity-8', 2);
    expect(await keys.coalesceArrive('c', 'entity-8', 'j3', { v: 3 }, { sentAtMs: Date.now() + 1 })).toEqual({ action: 'run', generation: 3, payload: { v: 3 } });
    // j2 again: its payload ran as generation 2, and j3's is newer.
    expect(await keys.coalesceArrive('c', 'entity-8', 'j2', { v: 2 }, ahead)).toEqual({ action: 'coalesced' });
  });

  it('records the end of a generation whose key an operator purged', async () => {
    expect(await keys.coalesceArrive('c', 'entity-7', 'j1', { v: 1 })).toEqual({ action: 'run', generation: 1, payload: { v: 1 } });
    await finishGeneration('entity-7', 1);
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set completed_at = now() - interval '1 hour' where scope = 'c' and key = 'entity-7#1'`.execute(env.db);
    expect(await new PostgresOperatorStore(env.db, env.schema).purgeKeys(60_000, 100)).toBeGreaterThan(0);
    expect(await keys.get('c', 'entity-7#1')).toBeUndefined();
    expect(await keys.coalesceArrive('c', 'entity-7', 'j1', { v: 1 })).toEqual({ action: 'finished', generation: 1 });
  });

  it('the janitor deletes coalescing rows idle longer than its retention, never one with a run in flight or a successor pending; a key arriving again starts past its old generations', async () => {
    // A schema of its own: a deletion raises the schema's generation floor, where every new key starts.
    const own = await createTestEnv('coalescing_janitor');
    try {
      const ownKeys = new IdempotencyKeys({ db: own.db, schema: own.schema });
      for (const key of ['idle', 'in-flight', 'pending', 'recent']) {
        expect(await ownKeys.coalesceArrive('gc', key, 'j1', { v: 1 })).toMatchObject({ action: 'run', generation: 1 });
      }
      await finishGeneration('idle', 1, undefined, 'gc', ownKeys);
      await finishGeneration('recent', 1, undefined, 'gc', ownKeys);
      expect((await ownKeys.claim('gc', 'in-flight#1', ownKeys.fingerprint('x'))).kind).toBe('claimed');
      expect(await ownKeys.coalesceArrive('gc', 'pending', 'j2', { v: 2 })).toEqual({ action: 'coalesced' });
      // The send times given to jobs without one: an old one goes, a recent one stays.
      expect(await ownKeys.coalesceArrive('gc', 'pending', 'unstamped-old', { v: 3 })).toEqual({ action: 'coalesced' });
      expect(await ownKeys.coalesceArrive('gc', 'pending', 'unstamped-new', { v: 4 })).toEqual({ action: 'coalesced' });
      await sql`update ${sql.id(own.schema, 'coalescing_keys')} set assigned_at = now() - interval '2 hours'
                 where scope = 'gc' and key in ('idle', 'in-flight', 'pending')`.execute(own.db);
      await sql`update ${sql.id(own.schema, 'coalescing_arrivals')} set arrived_at = now() - interval '2 hours' where job_id = 'unstamped-old'`.execute(own.db);
      const report = await new Janitor({ db: own.db, schema: own.schema, retentionMs: 3_600_000, logger: pino({ level: 'silent' }) }).runOnce();
      expect(report).toMatchObject({ coalescingKeysDeleted: 1, coalescingArrivalsDeleted: 1 });
      const { rows: remembered } = await sql<{ job_id: string }>`select job_id from ${sql.id(own.schema, 'coalescing_arrivals')} where job_id like 'unstamped-%'`.execute(own.db);
      expect(remembered).toEqual([{ job_id: 'unstamped-new' }]);
      const { rows } = await sql<{ key: string }>`select key from ${sql.id(own.schema, 'coalescing_keys')} order by key`.execute(own.db);
      expect(rows.map((r) => r.key)).toEqual(['in-flight', 'pending', 'recent']);
      // idle#1 is still kept (completed): the key's next run is generation 2, which runs rather than replays idle#1.
      expect(await ownKeys.coalesceArrive('gc', 'idle', 'j3', { v: 3 })).toEqual({ action: 'run', generation: 2, payload: { v: 3 } });
      expect((await ownKeys.claim('gc', 'idle#2', ownKeys.fingerprint('x'))).kind).toBe('claimed');
      // So does any key new to the schema: its generations start past every generation deleted.
      expect(await ownKeys.coalesceArrive('gc', 'new', 'j4', { v: 4 })).toEqual({ action: 'run', generation: 2, payload: { v: 4 } });
    } finally {
      await own.teardown();
    }
  });
});

describe('coalescing runs (runner)', () => {
  interface Message {
    readonly id: string;
    readonly data: unknown;
  }
  const deliver = (id: string, key: string, v: number, extras: { retention?: { resultMs: number }; sentAtMs?: number } = {}) => ({
    message: { id, data: { ...toWireJobData('c', key, { v }, extras.retention ? { retention: extras.retention } : {}), coalesce: true } },
    id,
    label: `Job ${id}`,
    queue: 'coalesce',
    name: 'sync',
    lastAttempt: false,
    deferrals: 0,
    ...(extras.sentAtMs === undefined ? {} : { sentAtMs: extras.sentAtMs }),
  });
  function runner(runKeys: IdempotencyKeys, gate?: { started: () => void; wait: Promise<void> }, faultHook?: FaultHook) {
    return new KeyedJobRunner<{ v: number }, unknown, Message>({
      keys: runKeys,
      ...(faultHook ? { faultHook } : {}),
      timing: resolveWorkerTiming({}, runKeys.options.leaseMs),
      identityOf: (message) => identityFromWireContract({ id: message.id, name: 'sync', data: message.data }) as JobIdentity<{ v: number }>,
      handler: async (ctx) => {
        if (gate && ctx.data.v === 1) {
          gate.started();
          await gate.wait;
        }
        return ctx.transaction(async (tx) => {
          await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${`v${ctx.data.v}`})`.execute(tx);
          return ctx.data.v;
        });
      },
      logger: pino({ level: 'silent' }),
    });
  }

  it('a store fault at the hand-over to the pending successor defers the job without using an attempt; its redelivery runs the successor', async () => {
    const plan: FaultPlan = (method, call) => (method === 'coalesceNext' && call === 1 ? { kind: 'transient', timing: 'before' } : undefined);
    const faulty = new IdempotencyKeys({ db: env.db, schema: env.schema, groupCommit: false }, faultingKeyStore(new PostgresKeyStore(env.db, env.schema), plan));
    const gate = createGate();
    const started = createGate();
    const jobs = runner(faulty, { started: started.open, wait: gate.wait });
    const first = jobs.run(deliver('h1', 'handed', 1));
    await started.wait;
    expect(await jobs.run(deliver('h2', 'handed', 2))).toMatchObject({ kind: 'replayed', coalesced: true });
    gate.open();
    expect((await first).kind).toBe('store-unavailable');
    expect(await runs('handed')).toEqual([{ key: 'handed#1', worker: 'v1' }]);
    // The broker delivers the job again, without counting an attempt: it runs the successor.
    expect(await jobs.run({ ...deliver('h1', 'handed', 1), deferrals: 1 })).toEqual({ kind: 'completed', result: 2 });
    expect(await runs('handed')).toEqual([
      { key: 'handed#1', worker: 'v1' },
      { key: 'handed#2', worker: 'v2' },
    ]);
  });

  it('a store fault after the hand-over reached Postgres (its answer lost) defers the job too; its redelivery runs the generation it was handed', async () => {
    let faults = 0;
    const lostAnswer: FaultHook = (point, context) => {
      if (point === 'after-hand-over' && faults++ === 0) {
        throw new StoreUnavailableError(context.scope!, context.key!, 'coalescing successor', { cause: Object.assign(new Error('connection lost'), { code: '08006' }) });
      }
    };
    const gate = createGate();
    const started = createGate();
    const jobs = runner(keys, { started: started.open, wait: gate.wait }, lostAnswer);
    const first = jobs.run(deliver('a1', 'answer-lost', 1));
    await started.wait;
    expect(await jobs.run(deliver('a2', 'answer-lost', 2))).toMatchObject({ kind: 'replayed', coalesced: true });
    gate.open();
    expect((await first).kind).toBe('store-unavailable');
    expect(await jobs.run({ ...deliver('a1', 'answer-lost', 1), deferrals: 1 })).toEqual({ kind: 'completed', result: 2 });
    expect(await runs('answer-lost')).toEqual([
      { key: 'answer-lost#1', worker: 'v1' },
      { key: 'answer-lost#2', worker: 'v2' },
    ]);
  });

  it('a database-only generation running longer than the stale bound (ten leases) is in flight: an arrival meanwhile is folded into its successor, never run beside it', { timeout: 30_000 }, async () => {
    // The fast path's key is an insert not yet committed while its transaction runs: seen by
    // nobody, so an arrival past the stale bound took the generation for a lost one.
    const briefLeases = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 300 });
    const started = createGate();
    let inFlight = 0;
    let mostInFlight = 0;
    const jobs = new KeyedJobRunner<{ v: number }, unknown, Message>({
      keys: briefLeases,
      timing: resolveWorkerTiming({ heartbeatMs: 100 }, briefLeases.options.leaseMs),
      identityOf: (message) => identityFromWireContract({ id: message.id, name: 'sync', data: message.data }) as JobIdentity<{ v: number }>,
      handler: {
        transaction: async (tx, ctx) => {
          mostInFlight = Math.max(mostInFlight, ++inFlight);
          try {
            if (ctx.data.v === 1) {
              started.open();
              await sleep(4_500);
            }
            await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${`v${ctx.data.v}`})`.execute(tx);
            return ctx.data.v;
          } finally {
            inFlight--;
          }
        },
      },
      logger: pino({ level: 'silent' }),
    });
    const first = jobs.run(deliver('long-1', 'long-generation', 1));
    await started.wait;
    await sleep(3_500);
    expect(await jobs.run(deliver('long-2', 'long-generation', 2))).toMatchObject({ kind: 'replayed', coalesced: true });
    expect(await first).toEqual({ kind: 'completed', result: 2 });
    expect(mostInFlight).toBe(1);
    expect(await runs('long-generation')).toEqual([
      { key: 'long-generation#1', worker: 'v1' },
      { key: 'long-generation#2', worker: 'v2' },
    ]);
  });

  it('a job kept 1 s whose generation key the janitor deleted: the next arrival runs', async () => {
    const jobs = runner(keys);
    expect(await jobs.run(deliver('r1', 'kept-briefly', 1, { retention: { resultMs: 1_000 } }))).toEqual({ kind: 'completed', result: 1 });
    await sleep(1_100);
    expect((await janitor().runOnce()).keysDeleted).toBeGreaterThan(0);
    expect(await jobs.run(deliver('r2', 'kept-briefly', 2))).toEqual({ kind: 'completed', result: 2 });
    expect(await runs('kept-briefly')).toEqual([
      { key: 'kept-briefly#1', worker: 'v1' },
      { key: 'kept-briefly#2', worker: 'v2' },
    ]);
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

describe('coalescing through the outbox', () => {
  it('a row added again after its relay failed to mark it sent, its first job run and removed, is folded by its enqueue time: it never runs after newer payloads', { timeout: 60_000 }, async () => {
    const queueName = 'coalesce-outbox';
    const queue = new Queue(queueName, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
    queues.push(queue);
    const producer = new IdempotentProducer({ queue: queueName, connection: { url: env.redisUrl }, prefix: env.redisPrefix, schema: env.schema });
    let crashes = 0;
    const relay = new OutboxRelay({
      db: env.db,
      schema: env.schema,
      connection: { url: env.redisUrl },
      prefix: env.redisPrefix,
      logger: pino({ level: 'silent' }),
      faultHook: (point) => {
        if (point === 'relay-after-add' && crashes++ === 0) throw new Error('relay crashed after its add');
      },
    });
    try {
      const events: WorkerEvent[] = [];
      const worker = createIdempotentWorker<{ v: number }>({
        queue: queueName,
        connection: { url: env.redisUrl },
        prefix: env.redisPrefix,
        keys,
        logger: pino({ level: 'silent' }),
        workerOptions: { removeOnComplete: { count: 0 } },
        handler: async (ctx) =>
          ctx.transaction(async (tx) => {
            await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${`v${ctx.data.v}`})`.execute(tx);
            return ctx.data.v;
          }),
      });
      worker.on('event', (event: WorkerEvent) => events.push(event));
      workers.push(worker);
      const settled = () => events.filter((event) => event.kind === 'completed' || event.kind === 'coalesced').length;
      await env.db.transaction().execute(async (tx) => {
        await producer.enqueue({ name: 'sync', scope: 'c', key: 'outbox-account', data: { v: 1 }, coalesce: true }, { tx });
      });
      // Added to BullMQ, but the relay crashed before it marked the row sent.
      await expect(relay.relayOnce()).rejects.toThrow('relay crashed');
      await waitFor('the first run', async () => (settled() === 1 ? true : undefined));
      for (const v of [2, 3]) {
        await producer.enqueue({ name: 'sync', scope: 'c', key: 'outbox-account', data: { v }, coalesce: true });
        await waitFor(`the run of v${v}`, async () => (settled() === v ? true : undefined));
      }
      // The unsent row goes again: its first job is gone, so BullMQ adds it anew.
      expect(await relay.relayOnce()).toBe(1);
      await waitFor('the row added again to settle', async () => (settled() === 4 ? true : undefined));
      expect(await runs('outbox-account')).toEqual([
        { key: 'outbox-account#1', worker: 'v1' },
        { key: 'outbox-account#2', worker: 'v2' },
        { key: 'outbox-account#3', worker: 'v3' },
      ]);
    } finally {
      await relay.stop();
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
