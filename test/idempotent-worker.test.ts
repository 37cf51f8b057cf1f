// @module-tag redis
import { randomUUID } from 'node:crypto';
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, IdempotentProducer, KeyReusedError, KeySettledListener, LeaseLostError, OutboxRelay, createIdempotentWorker, jobIdFor, type IdempotentWorker, type IdempotentWorkerOptions, type WorkerEvent } from '../src/index.js';
import { PostgresKeyStore } from '../src/store/postgres-key-store.js';
import { createEffectsTable, effectsOf, expireLease } from './support/protocol-fixtures.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { testHandler, type TestPayload } from './support/test-handler.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';
import { startWorkerChild, stopChildren, type WorkerChild } from './support/worker-child.js';

let env: TestEnv;
let keys: IdempotencyKeys;
let queue: Queue;
let producer: IdempotentProducer;
const QUEUE = 'jobs';
const silent = pino({ level: 'silent' });
const children: WorkerChild[] = [];
const inProcess: IdempotentWorker<any, any>[] = [];

beforeAll(async () => {
  env = await createTestEnv('worker');
  await createEffectsTable(env.db, env.schema);
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
  const connection = { url: env.redisUrl };
  queue = new Queue(QUEUE, { connection, prefix: env.redisPrefix });
  producer = new IdempotentProducer({ queue: QUEUE, connection, prefix: env.redisPrefix, schema: env.schema });
});
afterEach(async () => {
  await stopChildren(children.splice(0));
  await Promise.all(inProcess.splice(0).map((w) => w.close({ force: true })));
});
afterAll(async () => {
  await queue?.close();
  await producer?.close();
  await env?.teardown();
});

function childEnv(extra: Record<string, string> = {}): Record<string, string> {
  return {
    DATABASE_URL: env.databaseUrl,
    DATABASE_DIRECT_URL: env.databaseDirectUrl,
    REDIS_URL: env.redisUrl,
    REDIS_PREFIX: env.redisPrefix,
    SCHEMA: env.schema,
    QUEUE,
    CONCURRENCY: '4',
    MIGRATE: 'false',
    ...extra,
  };
}

function startInProcess(options: Partial<IdempotentWorkerOptions<TestPayload>> = {}, events?: WorkerEvent[]) {
  const worker = createIdempotentWorker<TestPayload>({
    queue: QUEUE,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    keys,
    handler: testHandler(env.schema, 'in-process'),
    concurrency: 4,
    logger: silent,
    ...options,
  });
  if (events) worker.on('event', (event) => events.push(event));
  inProcess.push(worker);
  return worker;
}

/** A foreign producer: raw BullMQ, wire contract, its own job ids. */
async function rawAdd(name: string, data: unknown, opts: Record<string, unknown> = {}) {
  return queue.add(name, data, { jobId: `raw-${randomUUID()}`, ...opts });
}

const keyState = (scope: string, key: string) => keys.get(scope, key);

describe('worker', () => {
  it('1. one key enqueued 50 times under distinct job ids across 3 worker processes: one effect, 49 replays', async () => {
    for (let i = 0; i < 3; i++) children.push(await startWorkerChild('./test-worker.ts', childEnv({ DEFER_MAX_MS: '200' })));
    const data = { idempotencyKey: 'order-1', scope: 'shop', payload: { sleepMs: 300, value: 'charged' } };
    const jobs = await Promise.all(Array.from({ length: 50 }, () => rawAdd('charge', data)));
    const finished = await Promise.all(jobs.map((job) => waitForJobState(queue, job.id!, ['completed', 'failed'], 45_000)));
    expect(finished.filter((f) => f.state === 'failed')).toHaveLength(0);
    const effects = await effectsOf(env.db, env.schema, 'shop', 'order-1');
    expect(effects).toHaveLength(1);
    const stored = (await keyState('shop', 'order-1'))!.result;
    for (const { job } of finished) expect(job.returnvalue).toEqual(stored);
    const replays = children.flatMap((c) => c.lines).filter((l) => l.outcome === 'replayed').length;
    const deferrals = children.flatMap((c) => c.lines).filter((l) => l.outcome === 'deferred').length;
    console.log(`50 jobs, one key, 3 processes: effects=1, replays=${replays}, deferrals=${deferrals}`);
    expect(replays).toBe(49);
  });

  it('2. a completed key re-enqueued after its job was removed runs no second effect', async () => {
    startInProcess();
    const first = await producer.enqueue({ name: 'charge', scope: 'shop', key: 'order-2', data: { value: 1 } });
    expect(first.status).toBe('added');
    const done = await waitForJobState(queue, first.jobId, ['completed']);
    await done.job.remove();
    const again = await producer.enqueue({ name: 'charge', scope: 'shop', key: 'order-2', data: { value: 1 } });
    expect(again.status).toBe('added');
    const replayed = await waitForJobState(queue, again.jobId, ['completed']);
    expect(replayed.job.returnvalue).toEqual(done.job.returnvalue);
    expect(await effectsOf(env.db, env.schema, 'shop', 'order-2')).toHaveLength(1);
  });

  it('3. an in-progress duplicate is delayed, not failed, with attemptsMade unchanged, and later replays', async () => {
    const events: WorkerEvent[] = [];
    startInProcess({ deferMaxMs: 300, deferMinMs: 300 }, events);
    const original = await rawAdd('charge', { idempotencyKey: 'order-3', payload: { sleepMs: 1500, value: 3 } });
    await waitFor('original to claim', async () => (await keyState('default', 'order-3'))?.status === 'processing');
    const duplicate = await rawAdd('charge', { idempotencyKey: 'order-3', payload: { sleepMs: 1500, value: 3 } });
    const delayed = await waitForJobState(queue, duplicate.id!, ['delayed'], 5_000);
    expect(delayed.job.attemptsMade).toBe(0);
    const done = await waitForJobState(queue, duplicate.id!, ['completed'], 10_000);
    // Completing counts one attempt, as for a job that was never deferred: the deferral used none.
    expect(done.job.attemptsMade).toBe(1);
    expect((await queue.getJob(original.id!))!.attemptsMade).toBe(1);
    expect(done.job.returnvalue).toMatchObject({ value: 3 });
    expect(await effectsOf(env.db, env.schema, 'default', 'order-3')).toHaveLength(1);
    expect(events.some((e) => e.kind === 'deferred' && e.jobId === duplicate.id)).toBe(true);
  });

  it('4. a worker SIGKILLed mid-handler: the job completes exactly once on another worker after the lease', async () => {
    const timing = { LEASE_MS: '2000', STALLED_INTERVAL_MS: '1000', DEFER_MAX_MS: '250' };
    const victim = await startWorkerChild('./test-worker.ts', childEnv(timing));
    children.push(victim);
    // The victim holds its first claim for 60 s, so it cannot finish before the kill even when
    // the rescuer is slow to start on a loaded machine; the rescuer's own run takes 4 s.
    const job = await rawAdd('charge', { idempotencyKey: 'order-4', payload: { sleepMs: 4000, holdFirstClaimMs: 60_000, value: 4 } });
    await victim.waitForLine((l) => l.key === 'order-4' && l.msg === 'key claimed');
    // The rescuer is already running when the victim dies, as another worker would be.
    const rescuer = await startWorkerChild('./test-worker.ts', childEnv(timing));
    children.push(rescuer);
    const killedAt = Date.now();
    victim.kill('SIGKILL');
    await victim.exited;
    const takeover = await rescuer.waitForLine((l) => l.key === 'order-4' && l.outcome === 'taken-over', 30_000);
    const done = await waitForJobState(queue, job.id!, ['completed', 'failed'], 30_000);
    expect(done.state).toBe('completed');
    const completedAt = (await keyState('default', 'order-4'))!.completedAt!.getTime();
    console.log(
      `recovery after SIGKILL (lease 2000 ms, lock 2000 ms, stalled check 1000 ms): taken over ${(takeover.time as number) - killedAt} ms ` +
        `after the kill; completed ${completedAt - killedAt} ms after it (the handler takes 4000 ms)`,
    );
    const effects = await effectsOf(env.db, env.schema, 'default', 'order-4');
    expect(effects).toHaveLength(1);
    expect(effects[0]!.worker).toBe(`pid-${rescuer.pid}`);
    expect(effects[0]!.fence).toBe(2);
  });

  it('5. a worker SIGSTOPped past its lease is taken over; after SIGCONT its commit is fenced', async () => {
    const timing = { LEASE_MS: '1500', STALLED_INTERVAL_MS: '750', DEFER_MAX_MS: '250' };
    const zombie = await startWorkerChild('./test-worker.ts', childEnv(timing));
    children.push(zombie);
    const job = await rawAdd('charge', { idempotencyKey: 'order-5', payload: { sleepMs: 1000, value: 5 } });
    await zombie.waitForLine((l) => l.key === 'order-5' && l.msg === 'key claimed');
    zombie.kill('SIGSTOP');
    const rescuer = await startWorkerChild('./test-worker.ts', childEnv(timing));
    children.push(rescuer);
    await waitFor('takeover to commit', async () => (await keyState('default', 'order-5'))?.status === 'completed', 30_000);
    zombie.kill('SIGCONT');
    await zombie.waitForLine((l) => l.key === 'order-5' && l.outcome === 'fenced', 15_000);
    const done = await waitForJobState(queue, job.id!, ['completed'], 15_000);
    expect(done.job.returnvalue).toMatchObject({ value: 5, fence: 2 });
    const effects = await effectsOf(env.db, env.schema, 'default', 'order-5');
    expect(effects).toEqual([{ fence: 2, worker: `pid-${rescuer.pid}` }]);
    // BullMQ's errors about the lock the pause lost (could not renew it, Missing lock … on
    // moving the job) are warnings saying what happened, one per job: not error-level stacks.
    const lockLost = await zombie.waitForLine((l) => l.jobId === job.id && String(l.msg).startsWith("BullMQ lost this worker's lock on the job"), 15_000);
    expect(lockLost).toMatchObject({ level: 40, error: expect.stringMatching(/lock for job/) });
    await new Promise((resolve) => setTimeout(resolve, 1_000)); // the job's other lock error, if any, comes in this time
    expect(zombie.lines.filter((l) => (l.level as number) >= 50)).toEqual([]);
    expect(zombie.lines.filter((l) => String(l.msg).startsWith("BullMQ lost this worker's lock")).map((l) => l.jobId)).toEqual([job.id]);
  });

  it('6. key reuse, a missing key and malformed data each fail with a clear reason; nothing runs', async () => {
    startInProcess();
    const first = await rawAdd('charge', { idempotencyKey: 'order-6', payload: { value: 'a' } });
    await waitForJobState(queue, first.id!, ['completed']);
    const cases = [
      { data: { idempotencyKey: 'order-6', payload: { value: 'DIFFERENT' } }, reason: /order-6.*different payload/ },
      { data: { payload: { value: 1 } }, reason: /"idempotencyKey" is missing/ },
      { data: 'not an object', reason: /job\.data must be an object, got string/ },
      { data: { idempotencyKey: 'order-6b' }, reason: /"payload" is missing.*order-6b/ },
      { data: { idempotencyKey: '', payload: 1 }, reason: /must not be empty/ },
      { data: { idempotencyKey: 'k'.repeat(300), payload: 1 }, reason: /300 characters long/ },
      { data: { idempotencyKey: 7, payload: 1 }, reason: /must be a string, got number/ },
    ];
    for (const { data, reason } of cases) {
      const job = await rawAdd('charge', data, { attempts: 3 });
      const failed = await waitForJobState(queue, job.id!, ['failed']);
      expect(failed.job.failedReason).toMatch(reason);
      expect(failed.job.attemptsMade, 'unrecoverable: no retries').toBe(1);
    }
    expect(await effectsOf(env.db, env.schema, 'default', 'order-6')).toHaveLength(1);
    const { rows } = await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, 'effects')} where key <> 'order-6' and key like 'order-6%'`.execute(env.db);
    expect(Number(rows[0]!.n)).toBe(0);
    // The producer refuses the reused key while its job still exists, with the core's error.
    await producer.enqueue({ name: 'charge', scope: 'shop', key: 'order-6c', data: { value: 1 }, opts: { delay: 60_000 } });
    await expect(
      producer.enqueue({ name: 'charge', scope: 'shop', key: 'order-6c', data: { value: 2 } }),
    ).rejects.toBeInstanceOf(KeyReusedError);
    expect((await producer.enqueue({ name: 'charge', scope: 'shop', key: 'order-6c', data: { value: 1 } })).status).toBe('duplicate');
  });

  it('6b. a custom keyOf whose identity cannot be fingerprinted fails once, naming scope and key; nothing is claimed', async () => {
    let deep: unknown = 'leaf';
    for (let i = 0; i < 500; i++) deep = [deep];
    startInProcess({ keyOf: (job) => ({ scope: 'custom', key: String(job.data.ref), payload: job.data, fingerprintOf: deep }) });
    const job = await rawAdd('charge', { ref: 'order-6b-deep' }, { attempts: 3 });
    const failed = await waitForJobState(queue, job.id!, ['failed']);
    expect(failed.job.failedReason).toMatch(/scope "custom", key "order-6b-deep"/);
    expect(failed.job.attemptsMade, 'unrecoverable: no retries').toBe(1);
    expect(await keys.get('custom', 'order-6b-deep')).toBeUndefined();
  });

  it('7. a retryable error then success: one effect; a permanent error is stored and replayed to a duplicate', async () => {
    const events: WorkerEvent[] = [];
    startInProcess({}, events);
    const flaky = await rawAdd('charge', { idempotencyKey: 'order-7', payload: { failTimes: 1, value: 7 } }, { attempts: 3, backoff: { type: 'fixed', delay: 100 } });
    const done = await waitForJobState(queue, flaky.id!, ['completed']);
    expect(done.job.attemptsMade).toBe(2); // one failure, one success
    expect(await effectsOf(env.db, env.schema, 'default', 'order-7')).toHaveLength(1);
    expect(events.filter((e) => e.key === 'order-7').map((e) => e.kind)).toEqual(['claimed', 'released', 'taken-over', 'completed']);

    const doomed = await rawAdd('charge', { idempotencyKey: 'order-7b', payload: { permanent: true } }, { attempts: 3 });
    const failed = await waitForJobState(queue, doomed.id!, ['failed']);
    expect(failed.job.failedReason).toMatch(/account closed/);
    expect(failed.job.attemptsMade).toBe(1);
    expect(await keyState('default', 'order-7b')).toMatchObject({ status: 'failed', error: { message: 'account closed (permanent)' } });
    const duplicate = await rawAdd('charge', { idempotencyKey: 'order-7b', payload: { permanent: true } }, { attempts: 3 });
    const replayed = await waitForJobState(queue, duplicate.id!, ['failed']);
    expect(replayed.job.failedReason).toMatch(/failed permanently before: account closed/);

    // Retryable errors that last through every attempt: the last one is stored.
    const hopeless = await rawAdd('charge', { idempotencyKey: 'order-7c', payload: { failTimes: 99 } }, { attempts: 2 });
    await waitForJobState(queue, hopeless.id!, ['failed']);
    expect(await keyState('default', 'order-7c')).toMatchObject({ status: 'failed', attempts: 2 });
    expect(await effectsOf(env.db, env.schema, 'default', 'order-7b')).toHaveLength(0);
  });

  it('7b. a database-only handler on the fast path: each failed run is a BullMQ attempt; a poison job fails at its last one, stored', async () => {
    const attempts: number[] = [];
    startInProcess({
      handler: {
        transaction: async (tx, ctx) => {
          attempts.push(ctx.message.attemptsMade);
          await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, 'poison')`.execute(tx);
          throw new Error('poison job');
        },
      },
    });
    const poison = await rawAdd('charge', { idempotencyKey: 'order-7d', payload: {} }, { attempts: 3 });
    const failed = await waitForJobState(queue, poison.id!, ['failed']);
    expect(failed.job.attemptsMade).toBe(3);
    // A group that rolled back runs its jobs again within one attempt: count the attempts.
    expect([...new Set(attempts)]).toEqual([0, 1, 2]);
    expect(await keyState('default', 'order-7d')).toMatchObject({ status: 'failed', error: { message: 'poison job' } });
    expect(await effectsOf(env.db, env.schema, 'default', 'order-7d')).toHaveLength(0);
  });

  it('8. outbox: a rollback enqueues nothing; a relay crash between add and mark still yields one effect', async () => {
    await expect(
      env.db.transaction().execute(async (tx) => {
        await producer.enqueue({ name: 'charge', scope: 'shop', key: 'order-8a', data: { value: 1 } }, { tx });
        throw new Error('business rule failed');
      }),
    ).rejects.toThrow('business rule failed');
    const quietRelay = new OutboxRelay({ db: env.db, schema: env.schema, connection: { url: env.redisUrl }, prefix: env.redisPrefix, logger: silent });
    expect(await quietRelay.relayOnce()).toBe(0);

    await env.db.transaction().execute(async (tx) => {
      await producer.enqueue({ name: 'charge', scope: 'shop', key: 'order-8b', data: { value: 8 } }, { tx });
    });
    let crashes = 0;
    const crashingRelay = new OutboxRelay({
      db: env.db,
      schema: env.schema,
      connection: { url: env.redisUrl },
      prefix: env.redisPrefix,
      logger: silent,
      faultHook: (point) => {
        if (point === 'relay-after-add' && crashes++ === 0) throw new Error('relay crashed after add');
      },
    });
    await expect(crashingRelay.relayOnce()).rejects.toThrow('relay crashed');
    const events: WorkerEvent[] = [];
    startInProcess({ workerOptions: { removeOnComplete: { count: 0 } } }, events);
    const jobId = jobIdFor('shop', 'order-8b');
    await waitFor('first delivery to complete', async () => events.some((e) => e.key === 'order-8b' && e.kind === 'completed'));
    await waitFor('job removed', async () => !(await queue.getJob(jobId)));
    expect(await crashingRelay.relayOnce()).toBe(1); // the unsent row goes again
    expect(await crashingRelay.relayOnce()).toBe(0);
    await waitFor('redelivery to replay', async () => events.some((e) => e.key === 'order-8b' && e.kind === 'replayed'));
    expect(await effectsOf(env.db, env.schema, 'shop', 'order-8b')).toHaveLength(1);
    await quietRelay.stop();
    await crashingRelay.stop();
  });

  it('9. SIGTERM during a job lets it finish and leaves no key processing', async () => {
    const worker = await startWorkerChild('./test-worker.ts', childEnv());
    children.push(worker);
    const job = await rawAdd('charge', { idempotencyKey: 'order-9', payload: { sleepMs: 1500, value: 9 } });
    await worker.waitForLine((l) => l.key === 'order-9' && l.msg === 'key claimed');
    worker.kill('SIGTERM');
    expect(await worker.exited).toBe(0);
    expect((await queue.getJob(job.id!))!.returnvalue).toMatchObject({ value: 9 });
    expect(await keyState('default', 'order-9')).toMatchObject({ status: 'completed' });
    expect(await effectsOf(env.db, env.schema, 'default', 'order-9')).toHaveLength(1);
  });

  it('9b. SIGTERM past the shutdown deadline releases the key, and another worker finishes the job once', async () => {
    const worker = await startWorkerChild('./test-worker.ts', childEnv({ SHUTDOWN_TIMEOUT_MS: '300' }));
    children.push(worker);
    const job = await rawAdd('charge', { idempotencyKey: 'order-9b', payload: { sleepMs: 3000, value: 'b' } });
    await worker.waitForLine((l) => l.key === 'order-9b' && l.msg === 'key claimed');
    worker.kill('SIGTERM');
    await worker.exited;
    expect(await keyState('default', 'order-9b')).toMatchObject({ status: 'processing', owner: null });
    startInProcess();
    const done = await waitForJobState(queue, job.id!, ['completed'], 20_000);
    expect(done.job.returnvalue).toMatchObject({ value: 'b', fence: 2 });
    expect(await effectsOf(env.db, env.schema, 'default', 'order-9b')).toHaveLength(1);
  });

  it('fast path: duplicates across workers replay; effects and completion commit once', async () => {
    startInProcess({ fastPath: true, deferMaxMs: 200 });
    startInProcess({ fastPath: true, deferMaxMs: 200 });
    const data = { idempotencyKey: 'order-fast', payload: { sleepMs: 200, value: 'fast' } };
    const jobs = await Promise.all(Array.from({ length: 10 }, () => rawAdd('charge', data)));
    const finished = await Promise.all(jobs.map((j) => waitForJobState(queue, j.id!, ['completed', 'failed'])));
    expect(finished.every((f) => f.state === 'completed')).toBe(true);
    expect(await effectsOf(env.db, env.schema, 'default', 'order-fast')).toHaveLength(1);
    for (const f of finished) expect(f.job.returnvalue).toMatchObject({ value: 'fast' });
  });

  it('group commit: leased and fast-path workers sharing transactions run each of 20 keys once over 100 jobs, and child workers do too', async () => {
    const grouped = new IdempotencyKeys({ db: env.db, schema: env.schema, groupCommit: { maxJobs: 8, maxGroups: 2 } });
    startInProcess({ keys: grouped, concurrency: 8, deferMaxMs: 100 });
    startInProcess({ keys: grouped, concurrency: 8, fastPath: true, deferMaxMs: 100 });
    children.push(await startWorkerChild('./test-worker.ts', childEnv({ GROUP_COMMIT: 'true', CONCURRENCY: '8', DEFER_MAX_MS: '100' })));
    const jobs = await Promise.all(
      Array.from({ length: 100 }, (_, i) => rawAdd('charge', { idempotencyKey: `grouped-${i % 20}`, payload: { value: `v${i % 20}` } })),
    );
    const finished = await Promise.all(jobs.map((j) => waitForJobState(queue, j.id!, ['completed', 'failed'], 30_000)));
    expect(finished.filter((f) => f.state !== 'completed').map((f) => f.job.failedReason)).toEqual([]);
    for (let k = 0; k < 20; k++) expect(await effectsOf(env.db, env.schema, 'default', `grouped-${k}`)).toHaveLength(1);
    for (const f of finished) expect(f.job.returnvalue).toMatchObject({ value: (f.job.data as { payload: { value: string } }).payload.value });
  });

  it('group commit, fast path: a job whose group ran again announces its claim once, although its effect ran twice', async () => {
    // No settled-key probe: the completed key joins the group and fails its end; it runs alone, the others together again.
    const store = new PostgresKeyStore(env.db, env.schema, { probeSettledKeys: false });
    const grouped = new IdempotencyKeys({ db: env.db, schema: env.schema, groupCommit: { maxJobs: 8, maxGroups: 1 } }, store);
    const events: WorkerEvent[] = [];
    const runs = new Map<string, number>();
    startInProcess(
      {
        keys: grouped,
        concurrency: 8,
        fastPath: true,
        handler: async (ctx) => {
          runs.set(ctx.key, (runs.get(ctx.key) ?? 0) + 1);
          return testHandler(env.schema, 'in-process')(ctx);
        },
      },
      events,
    );
    const first = await rawAdd('charge', { idempotencyKey: 'rerun-done', payload: { value: 'done' } });
    expect((await waitForJobState(queue, first.id!, ['completed', 'failed'])).state).toBe('completed');
    runs.clear();
    const jobs = await Promise.all(
      ['rerun-0', 'rerun-1', 'rerun-done', 'rerun-2', 'rerun-3'].map((key) => rawAdd('charge', { idempotencyKey: key, payload: { value: key === 'rerun-done' ? 'done' : key } })),
    );
    const finished = await Promise.all(jobs.map((j) => waitForJobState(queue, j.id!, ['completed', 'failed'])));
    expect(finished.map((f) => f.state)).toEqual(Array(5).fill('completed'));
    expect([...runs.values()].some((n) => n > 1)).toBe(true); // some group did run again
    for (const key of ['rerun-0', 'rerun-1', 'rerun-2', 'rerun-3']) {
      expect(await effectsOf(env.db, env.schema, 'default', key)).toHaveLength(1);
      expect(events.filter((e) => e.key === key && (e.kind === 'claimed' || e.kind === 'taken-over')), key).toHaveLength(1);
    }
  });

  it('waitMs: a duplicate waits for the owner over LISTEN/NOTIFY and replays without being deferred', async () => {
    const listener = new KeySettledListener({ connectionString: env.databaseDirectUrl, schema: env.schema });
    const events: WorkerEvent[] = [];
    startInProcess({ waitMs: 10_000, listener }, events);
    const data = { idempotencyKey: 'order-wait', payload: { sleepMs: 800, value: 'w' } };
    await rawAdd('charge', data);
    await waitFor('original to claim', async () => (await keyState('default', 'order-wait'))?.status === 'processing');
    const duplicate = await rawAdd('charge', data);
    const done = await waitForJobState(queue, duplicate.id!, ['completed'], 10_000);
    expect(done.job.returnvalue).toMatchObject({ value: 'w', fence: 1 });
    expect(events.filter((e) => e.kind === 'deferred')).toHaveLength(0);
    expect(events.some((e) => e.kind === 'replayed' && e.jobId === duplicate.id)).toBe(true);
    await listener.close();
  });

  it('ctx.signal fires with LeaseLostError when the key is taken over mid-handler', async () => {
    let abortReason: unknown;
    startInProcess({
      leaseMs: 600,
      deferMinMs: 100,
      deferMaxMs: 200,
      handler: async (ctx) => {
        await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve, { once: true }));
        abortReason = ctx.signal.reason;
        throw ctx.signal.reason;
      },
    });
    const payload = { value: 'sig' };
    const job = await rawAdd('charge', { idempotencyKey: 'order-signal', payload });
    await waitFor('claim', async () => (await keyState('default', 'order-signal'))?.status === 'processing');
    await expireLease(env.db, env.schema, 'default', 'order-signal');
    const takeover = await keys.claim('default', 'order-signal', keys.fingerprint({ name: 'charge', payload }), { leaseMs: 60_000 });
    expect(takeover.kind).toBe('taken-over');
    await waitFor('the handler to see the abort', async () => abortReason !== undefined, 10_000);
    expect(abortReason).toBeInstanceOf(LeaseLostError);
    // The new owner finishes; the fenced job then replays its result.
    if (takeover.kind === 'taken-over') await keys.runEffect(takeover, async () => ({ by: 'new owner' }));
    const done = await waitForJobState(queue, job.id!, ['completed'], 10_000);
    expect(done.job.returnvalue).toEqual({ by: 'new owner' });
  });

  it('rejects timing options that contradict each other', () => {
    expect(() => startInProcess({ leaseMs: 1000, heartbeatMs: 600 })).toThrow(/heartbeatMs/);
    expect(() => startInProcess({ leaseMs: 1000, lockDurationMs: 1000, stalledIntervalMs: 5000 })).toThrow(/stalledIntervalMs/);
    expect(() => startInProcess({ waitMs: 1000 })).toThrow(/listener/);
  });
});
