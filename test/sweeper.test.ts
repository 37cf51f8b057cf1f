// @module-tag redis
import { Queue, Worker } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { IdempotencyKeys, IdempotentProducer, ConfigError, type EnqueueResult, createIdempotentWorker, jobIdFor, toWireJobData, type IdempotentWorker, createPostgresDb, type WorkerEvent } from '../src/index.js';
import { BullmqJobLookup, Maintenance, Sweeper, loadEnvConfig, startWorkerProcess, sweeperQueuesFromConfig, type SweepReport, type JobLookup, type SweeperOptions } from '../src/process/index.js';
import { withMaintenanceLock } from '../src/store/maintenance-lock.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { createGate } from './support/protocol-fixtures.js';
import { brokerQueueName } from '../src/consumer/broker-queue-names.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let keys: IdempotencyKeys;
let jobs: BullmqJobLookup;
let queue: Queue;
const QUEUE = 'sweep';
const OTHER_QUEUE = 'sweep-b';
const silent = pino({ level: 'silent' });
const workers: IdempotentWorker<any, any>[] = [];
const closers: Array<() => Promise<unknown>> = [];

beforeAll(async () => {
  env = await createTestEnv('sweeper');
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000 });
  jobs = new BullmqJobLookup({ connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  queue = new Queue(QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
});
beforeEach(async () => {
  await queue.obliterate({ force: true });
  await sql`truncate ${sql.id(env.schema, 'idempotency_keys')} cascade`.execute(env.db);
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.close({ force: true })));
  await Promise.all(closers.splice(0).map((close) => close()));
});
afterAll(async () => {
  await jobs?.close();
  await queue?.close();
  await env?.teardown();
});

function sweeper(options: Partial<SweeperOptions> = {}): Sweeper {
  return new Sweeper({ db: env.db, schema: env.schema, jobs, sweepAfterMs: 60_000, logger: silent, ...options });
}

/**
 * Leaves a key exactly as a lost job does: claimed by a worker (job id, queue, job name and,
 * optionally, payload recorded), its lease ended an hour ago, and no BullMQ job behind it.
 */
async function loseJob(key: string, options: { payload?: unknown; storePayload?: boolean; scope?: string } = {}) {
  const scope = options.scope ?? 'acme';
  const payload = options.payload ?? { cents: 100, key };
  const fingerprint = keys.fingerprint({ name: 'charge', payload });
  const outcome = await keys.claim(scope, key, fingerprint, {
    jobId: jobIdFor(scope, key),
    queue: QUEUE,
    jobName: 'charge',
    ...(options.storePayload === false ? {} : { payload }),
  });
  expect(outcome.kind).toBe('claimed');
  await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 hour'
             where scope = ${scope} and key = ${key}`.execute(env.db);
  return { scope, key, payload, jobId: jobIdFor(scope, key) };
}

function startWorker(events: WorkerEvent[] = []): IdempotentWorker<any, any> {
  const worker = createIdempotentWorker<any, any>({
    queue: QUEUE,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    keys,
    logger: silent,
    handler: async (ctx) => ({ charged: ctx.data.cents, fence: ctx.fence }),
  });
  worker.on('event', (event) => events.push(event));
  workers.push(worker);
  return worker;
}

describe('Sweeper', () => {
  it('re-enqueues a lost job with its stored payload, and a worker then completes the key (takeover)', async () => {
    const lost = await loseJob('order-1');
    const report = await sweeper({ action: 'reenqueue' }).runOnce();
    expect(report).toMatchObject({ examined: 1, alive: 0, unverifiable: 0, changed: 0, more: false });
    expect(report.recoveries).toEqual([
      { scope: 'acme', key: 'order-1', fence: 1, queue: QUEUE, jobId: lost.jobId, action: 'reenqueued', jobWas: 'missing' },
    ]);
    const job = await queue.getJob(lost.jobId);
    expect(job?.name).toBe('charge');
    expect(job?.data).toEqual(toWireJobData('acme', 'order-1', lost.payload));

    // The job is back: a second sweep sees it alive and leaves it alone.
    expect(await sweeper().runOnce()).toMatchObject({ examined: 1, alive: 1, recoveries: [] });

    const events: WorkerEvent[] = [];
    startWorker(events);
    const { job: done } = await waitForJobState(queue, lost.jobId, ['completed']);
    expect(done.returnvalue).toEqual({ charged: 100, fence: 2 });
    expect(events.map((e) => e.kind)).toContain('taken-over');
    const row = await keys.get('acme', 'order-1');
    expect(row).toMatchObject({ status: 'completed', fence: 2, result: { charged: 100, fence: 2 } });
    expect(await sweeper().runOnce()).toMatchObject({ examined: 0, recoveries: [] });
  });

  it('re-enqueues when the job exists but finished (e.g. failed while Postgres was unreachable), replacing it', async () => {
    const lost = await loseJob('order-2');
    // A plain BullMQ worker fails the job for good, leaving the key processing.
    await queue.add('charge', toWireJobData('acme', 'order-2', lost.payload), { jobId: lost.jobId, attempts: 1 });
    const failer = new Worker(QUEUE, async () => {
      throw new Error('database unreachable');
    }, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
    closers.push(() => failer.close());
    await waitForJobState(queue, lost.jobId, ['failed']);
    await failer.close();

    const report = await sweeper().runOnce();
    expect(report.recoveries).toMatchObject([{ key: 'order-2', action: 'reenqueued', jobWas: 'finished' }]);
    expect(await queue.getJobState(lost.jobId)).toBe('waiting');
    startWorker();
    const { job } = await waitForJobState(queue, lost.jobId, ['completed']);
    expect(job.returnvalue).toEqual({ charged: 100, fence: 2 });
  });

  it('abandons a lost job whose payload was not stored: the key fails with ABANDONED and duplicates replay that failure', async () => {
    const lost = await loseJob('order-3', { storePayload: false });
    const report = await sweeper({ action: 'reenqueue' }).runOnce();
    expect(report.recoveries).toMatchObject([{ key: 'order-3', action: 'abandoned', jobWas: 'missing', fence: 1 }]);
    expect(await queue.getJob(lost.jobId)).toBeUndefined();
    const row = await keys.get('acme', 'order-3');
    expect(row).toMatchObject({ status: 'failed', owner: null, lockedUntil: null });
    expect(row!.expiresAt).not.toBeNull();
    expect(row!.error).toMatchObject({ code: 'ABANDONED', name: 'KeyAbandonedError', abandoned_by_sweeper: true });
    expect((row!.error as { message: string }).message).toMatch(/Key "order-3" in scope "acme" was abandoned.*no payload was stored/);

    // A duplicate of the job now replays the failure instead of running.
    const events: WorkerEvent[] = [];
    startWorker(events);
    const producer = new IdempotentProducer({ queue: QUEUE, connection: { url: env.redisUrl }, prefix: env.redisPrefix });
    closers.push(() => producer.close());
    await producer.enqueue({ name: 'charge', scope: 'acme', key: 'order-3', data: lost.payload });
    const { job } = await waitForJobState(queue, lost.jobId, ['failed']);
    expect(job.failedReason).toMatch(/abandoned by the sweeper/);
    expect(events.map((e) => e.kind)).toEqual(['replayed-failure']);
  });

  it('abandons instead of re-enqueuing on a queue configured to abandon, even with a stored payload', async () => {
    await loseJob('order-4');
    const report = await sweeper({ action: 'reenqueue', queueActions: { [QUEUE]: 'abandon' } }).runOnce();
    expect(report.recoveries).toMatchObject([{ key: 'order-4', action: 'abandoned' }]);
    expect((await keys.get('acme', 'order-4'))!.error).toMatchObject({ code: 'ABANDONED' });
    expect(((await keys.get('acme', 'order-4'))!.error as { message: string }).message).toMatch(/set to abandon lost jobs/);
  });

  it('leaves alone keys whose job still exists, keys with a recent lease end, and keys with no job recorded', async () => {
    const waiting = await loseJob('order-5');
    await queue.add('charge', toWireJobData('acme', 'order-5', waiting.payload), { jobId: waiting.jobId, delay: 3_600_000 });
    // Lease ended 10 s ago only: within sweepAfterMs, BullMQ's own recovery may still be under way.
    await keys.claim('acme', 'order-6', keys.fingerprint({}), { leaseMs: 100, jobId: 'x', queue: QUEUE, jobName: 'charge', payload: {} });
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '10 seconds'
               where key = 'order-6'`.execute(env.db);
    // Claimed through the protocol API, outside BullMQ: nothing to ask BullMQ about.
    await keys.claim('acme', 'order-7', keys.fingerprint({}), {});
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 hour'
               where key = 'order-7'`.execute(env.db);

    const report = await sweeper().runOnce();
    expect(report).toMatchObject({ examined: 2, alive: 1, unverifiable: 1, recoveries: [], changed: 0 });
    for (const key of ['order-5', 'order-6', 'order-7']) expect((await keys.get('acme', key))!.status).toBe('processing');
  });

  it('does not abandon a key that a worker claimed while the sweeper was asking BullMQ', async () => {
    await loseJob('order-8', { storePayload: false });
    const racing: JobLookup = {
      async presence(queueName, jobIds) {
        const answer = await jobs.presence(queueName, jobIds);
        // Meanwhile a redelivered job takes the key over (fence 2, live lease).
        const outcome = await keys.claim('acme', 'order-8', keys.fingerprint({ name: 'charge', payload: { cents: 100, key: 'order-8' } }));
        expect(outcome.kind).toBe('taken-over');
        return answer;
      },
      reenqueue: (request) => jobs.reenqueue(request),
    };
    const report = await sweeper({ jobs: racing }).runOnce();
    expect(report).toMatchObject({ examined: 1, changed: 1, recoveries: [] });
    expect(await keys.get('acme', 'order-8')).toMatchObject({ status: 'processing', fence: 2 });
  });

  it('asks the queue of the job that took the key over: not abandoned while that job is pending, re-enqueued into that queue once it is gone', async () => {
    const other = new Queue(OTHER_QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
    closers.push(async () => {
      await other.obliterate({ force: true });
      await other.close();
    });
    const lost = await loseJob('moved-1');
    // A job of another queue, under its producer's own id, takes the key over; then its
    // worker dies too, and the job waits in its queue for a retry.
    const taker = await keys.claim('acme', 'moved-1', keys.fingerprint({ name: 'charge', payload: lost.payload }), {
      jobId: 'b-own-1',
      queue: OTHER_QUEUE,
      jobName: 'charge-b',
      payload: lost.payload,
    });
    expect(taker).toMatchObject({ kind: 'taken-over', fence: 2 });
    await other.add('charge-b', toWireJobData('acme', 'moved-1', lost.payload), { jobId: 'b-own-1', delay: 3_600_000 });
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 hour'
               where key = 'moved-1'`.execute(env.db);
    expect(await keys.get('acme', 'moved-1')).toMatchObject({ queue: OTHER_QUEUE, jobId: 'b-own-1', jobName: 'charge-b' });

    expect(await sweeper({ action: 'abandon' }).runOnce()).toMatchObject({ examined: 1, alive: 1, recoveries: [] });
    expect(await keys.get('acme', 'moved-1')).toMatchObject({ status: 'processing', fence: 2 });

    await other.remove('b-own-1');
    const report = await sweeper({ action: 'reenqueue' }).runOnce();
    expect(report.recoveries).toEqual([
      { scope: 'acme', key: 'moved-1', fence: 2, queue: OTHER_QUEUE, jobId: 'b-own-1', action: 'reenqueued', jobWas: 'missing' },
    ]);
    expect((await other.getJob(lost.jobId))?.name).toBe('charge-b');
    expect(await queue.getJob(lost.jobId)).toBeUndefined();
  });

  it('counts a duplicate under the deterministic id in another of its queues as pending', async () => {
    const other = new Queue(OTHER_QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
    closers.push(async () => {
      await other.obliterate({ force: true });
      await other.close();
    });
    const lost = await loseJob('moved-2', { storePayload: false });
    await keys.claim('acme', 'moved-2', keys.fingerprint({ name: 'charge', payload: lost.payload }), {
      jobId: 'b-own-2',
      queue: OTHER_QUEUE,
      jobName: 'charge-b',
    });
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 hour'
               where key = 'moved-2'`.execute(env.db);
    // The first job (our producer's deterministic id) is still due for a retry in the first queue.
    await queue.add('charge', toWireJobData('acme', 'moved-2', lost.payload), { jobId: lost.jobId, delay: 3_600_000 });
    expect(await sweeper({ queues: [QUEUE, OTHER_QUEUE] }).runOnce()).toMatchObject({ examined: 1, alive: 1, recoveries: [] });
    await queue.remove(lost.jobId);
    expect(await sweeper({ queues: [QUEUE, OTHER_QUEUE] }).runOnce()).toMatchObject({
      recoveries: [{ key: 'moved-2', queue: OTHER_QUEUE, jobId: 'b-own-2', action: 'abandoned' }],
    });
  });

  it('does not abandon a key released or claimed again under the same fence between its look and its abandon', async () => {
    const payload = { cents: 100, key: 'order-13' };
    const claim = await keys.claim('acme', 'order-13', keys.fingerprint({ name: 'charge', payload }), {
      jobId: jobIdFor('acme', 'order-13'),
      queue: QUEUE,
      jobName: 'charge',
    });
    if (claim.kind !== 'claimed') throw new Error(`expected a claim, got ${claim.kind}`);
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 hour'
               where key = 'order-13'`.execute(env.db);
    const racing: JobLookup = {
      async presence(queueName, jobIds) {
        const answer = await jobs.presence(queueName, jobIds);
        // Meanwhile its owner gives the key up for a retry: same fence, no owner, lease ended now.
        expect(await keys.release(claim, new Error('retry me'))).toBe(true);
        return answer;
      },
      reenqueue: (request) => jobs.reenqueue(request),
    };
    const report = await sweeper({ jobs: racing, sweepAfterMs: 0 }).runOnce();
    expect(report).toMatchObject({ examined: 1, changed: 1, recoveries: [] });
    expect(await keys.get('acme', 'order-13')).toMatchObject({ status: 'processing', fence: 1, owner: null });
  });

  it('a run that meets a dropped connection or a Redis error changes nothing, is logged, and the next period sweeps normally', async () => {
    await loseJob('order-14', { storePayload: false });
    const applicationName = `sweeper-transient-${process.pid}`;
    const db = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 2, applicationName });
    closers.push(() => db.destroy());
    let calls = 0;
    const faulty: JobLookup = {
      async presence(queueName, jobIds) {
        calls++;
        // First run: this sweep's own connection is terminated while it asks BullMQ.
        if (calls === 1) {
          await sql`select pg_terminate_backend(pid) from pg_stat_activity where application_name = ${applicationName}`.execute(env.db);
        }
        // Second run: Redis does not answer.
        if (calls === 2) throw new Error('Connection is closed.');
        return jobs.presence(queueName, jobIds);
      },
      reenqueue: (request) => jobs.reenqueue(request),
    };
    const logged: Array<{ task: unknown; msg: unknown }> = [];
    const logger = pino({ level: 'warn' }, { write: (line: string) => logged.push(JSON.parse(line)) });
    const maintenance = new Maintenance({
      db,
      schema: env.schema,
      sweeper: sweeper({ db, jobs: faulty }),
      sweeperIntervalMs: 50,
      statsIntervalMs: 0,
      logger,
    });
    const errors: unknown[] = [];
    const reports: SweepReport[] = [];
    maintenance.on('error', (_task, error) => errors.push(error));
    maintenance.on('sweeper', (report) => reports.push(report));
    maintenance.start();
    try {
      await waitFor('a sweep after the failed ones', async () => reports.length > 0);
    } finally {
      await maintenance.stop();
    }
    expect(errors).toHaveLength(2);
    expect(logged.filter((line) => line.task === 'sweeper' && /run failed/.test(String(line.msg)))).toHaveLength(2);
    // The failed runs acted on nothing; the next one abandoned the key once.
    expect(reports[0]!.recoveries).toMatchObject([{ key: 'order-14', action: 'abandoned', fence: 1 }]);
    expect(await keys.get('acme', 'order-14')).toMatchObject({ status: 'failed', fence: 1, error: { code: 'ABANDONED' } });
  });

  it('pages through candidates in lease order and stops at maxKeysPerRun', async () => {
    for (let i = 0; i < 5; i++) await loseJob(`page-${i}`, { storePayload: false });
    // Two alive keys first in lease order, so paging must walk past them.
    await sql`update ${sql.id(env.schema, 'idempotency_keys')}
                 set locked_until = now() - interval '2 hours' where key in ('page-0', 'page-1')`.execute(env.db);
    for (const key of ['page-0', 'page-1']) await queue.add('charge', {}, { jobId: jobIdFor('acme', key), delay: 3_600_000 });
    const first = await sweeper({ batchSize: 2, maxKeysPerRun: 4 }).runOnce();
    expect(first).toMatchObject({ examined: 4, alive: 2, more: true });
    expect(first.recoveries.map((r) => r.key)).toHaveLength(2);
    const second = await sweeper({ batchSize: 2, maxKeysPerRun: 4 }).runOnce();
    expect(second).toMatchObject({ examined: 3, alive: 2, more: false });
    expect(second.recoveries).toHaveLength(1);
    const { rows } = await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, 'idempotency_keys')}
                                               where status = 'failed' and key like 'page-%'`.execute(env.db);
    expect(Number(rows[0]!.n)).toBe(3);
  });

  it('sweeps only the queues it is given; unverifiable keys only when sweeping everything', async () => {
    await loseJob('order-10', { storePayload: false });
    await keys.claim('acme', 'order-11', keys.fingerprint({}), {});
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 hour'
               where key = 'order-11'`.execute(env.db);
    expect(await sweeper({ queues: ['elsewhere'] }).runOnce()).toMatchObject({ examined: 0, recoveries: [], unverifiable: 0 });
    expect((await keys.get('acme', 'order-10'))!.status).toBe('processing');
    expect(await sweeper({ queues: [QUEUE, 'elsewhere'] }).runOnce()).toMatchObject({ examined: 1, unverifiable: 0, recoveries: [{ key: 'order-10' }] });
    expect(await sweeper({ queues: '*' }).runOnce()).toMatchObject({ examined: 1, unverifiable: 1 });
  });

  it("leaves broker consumers' keys to their broker when sweeping everything: unverifiable, never re-enqueued into BullMQ", async () => {
    // As the RabbitMQ and JetStream consumers record them: a message id as the job id, the
    // broker's queue name, the payload kept (STORE_PAYLOAD=true).
    for (const [key, queueName] of [['from-rabbitmq', brokerQueueName('amqp', 'payments')], ['from-jetstream', brokerQueueName('nats', 'ORDERS/payments')]] as const) {
      await keys.claim('brokers', key, keys.fingerprint({}), { jobId: `message-${key}`, queue: queueName, jobName: 'charge', payload: { cents: 1 } });
    }
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 hour'
               where scope = 'brokers'`.execute(env.db);
    const report = await sweeper({ queues: '*', action: 'reenqueue' }).runOnce();
    expect(report).toMatchObject({ examined: 2, unverifiable: 2, recoveries: [], changed: 0 });
    expect((await keys.get('brokers', 'from-rabbitmq'))!.status).toBe('processing');
    expect((await keys.get('brokers', 'from-jetstream'))!.status).toBe('processing');
  });

  it('a key whose recorded queue is no BullMQ queue name (a colon) is unverifiable and does not stop the sweep of the keys after it', async () => {
    // Recorded by a claim of the protocol's own, whose queue is free text; its lease ended first.
    await keys.claim('elsewhere', 'odd-queue', keys.fingerprint({}), { jobId: 'job-odd', queue: 'my:queue', jobName: 'charge', payload: { cents: 1 } });
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '2 hours'
               where scope = 'elsewhere'`.execute(env.db);
    const lost = await loseJob('after-the-odd-one');
    const report = await sweeper({ queues: '*', action: 'reenqueue' }).runOnce();
    expect(report).toMatchObject({ examined: 2, unverifiable: 1, changed: 0 });
    expect(report.recoveries).toEqual([expect.objectContaining({ key: 'after-the-odd-one', action: 'reenqueued' })]);
    expect(await queue.getJob(lost.jobId)).toBeDefined();
    expect((await keys.get('elsewhere', 'odd-queue'))!.status).toBe('processing');
  });

  it('runs one sweep at a time per queue list under the advisory lock; other queue lists are not blocked', async () => {
    await loseJob('order-12', { storePayload: false });
    const mine = sweeper({ queues: [QUEUE] });
    const maintenance = new Maintenance({ db: env.openDb(2), schema: env.schema, sweeper: mine, logger: silent });
    const others = new Maintenance({ db: env.openDb(2), schema: env.schema, sweeper: sweeper({ queues: ['elsewhere'] }), logger: silent });
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let held!: () => void;
    const holding = new Promise<void>((resolve) => (held = resolve));
    const holder = withMaintenanceLock(env.openDb(1), env.schema, 'sweeper', async () => {
      held();
      await gate;
    }, mine.lockScope);
    await holding;
    expect(await maintenance.runSweeper()).toEqual({ ran: false });
    expect((await keys.get('acme', 'order-12'))!.status).toBe('processing');
    expect((await others.runSweeper()).ran).toBe(true);
    release();
    await holder;
    const run = await maintenance.runSweeper();
    expect(run.ran && run.result.recoveries).toMatchObject([{ key: 'order-12', action: 'abandoned' }]);
  });

  it('takes its queues from SWEEPER_QUEUES, else QUEUE', () => {
    expect(sweeperQueuesFromConfig(loadEnvConfig({ QUEUE: 'payments' }))).toEqual(['payments']);
    expect(sweeperQueuesFromConfig(loadEnvConfig({ QUEUE: 'payments', SWEEPER_QUEUES: '*' }))).toBe('*');
    expect(sweeperQueuesFromConfig(loadEnvConfig({ SWEEPER_QUEUES: 'payments, emails' }))).toEqual(['payments', 'emails']);
    expect(() => loadEnvConfig({ SWEEPER_QUEUES: 'payments,,emails' })).toThrow(ConfigError);
    expect(() => loadEnvConfig({ SWEEPER_QUEUES: 'payments,,emails' })).toThrow(/SWEEPER_QUEUES/);
  });

  it('refuses invalid options with the option named', () => {
    expect(() => sweeper({ action: 'retry' as never })).toThrow(/action/);
    expect(() => sweeper({ sweepAfterMs: -1 })).toThrow(/sweepAfterMs/);
    expect(() => sweeper({ queues: [] })).toThrow(/queues/);
    expect(() => new Sweeper({ db: env.db } as SweeperOptions)).toThrow(/jobs is required/);
  });

  describe('a lost job keeps what its data said beyond the payload', () => {
    /**
     * Runs `enqueue` through a real worker whose handler never returns, then loses the job as
     * Redis losing data does: the worker is gone, the queue emptied, the key left processing
     * with its lease ended an hour ago.
     */
    async function loseRunningJob(enqueue: (producer: IdempotentProducer) => Promise<unknown>, runningKey: { scope: string; key: string }) {
      const hang = createGate();
      const worker = createIdempotentWorker<any, any>({
        queue: QUEUE,
        connection: { url: env.redisUrl },
        prefix: env.redisPrefix,
        keys,
        logger: silent,
        storePayload: true,
        concurrency: 4,
        handler: async () => hang.wait,
      });
      workers.push(worker);
      const producer = new IdempotentProducer({ queue: QUEUE, connection: { url: env.redisUrl }, prefix: env.redisPrefix });
      closers.push(() => producer.close());
      // The lost run, a zombie by then, ends when the test does: its completion is fenced out.
      closers.push(async () => hang.open());
      await enqueue(producer);
      await waitFor('the job to be running', async () => (await keys.get(runningKey.scope, runningKey.key))?.status === 'processing');
      return { producer, worker };
    }

    async function forget(worker: IdempotentWorker<any, any>, scope: string, key: string) {
      // The job vanishes first (as when Redis loses it), then its worker goes (releasing the key).
      await queue.obliterate({ force: true });
      await worker.close({ force: true });
      await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 hour', owner = null
                 where scope = ${scope} and key = ${key}`.execute(env.db);
      // Its concurrency slot, if any, has long ended too.
      await sql`update ${sql.id(env.schema, 'concurrency_slots')} set acquired_until = now() - interval '1 hour'
                 where scope = ${scope} and key = ${key}`.execute(env.db);
    }

    it("re-enqueues a concurrency-limited job with its concurrency key and limit, so the limit still holds for it", async () => {
      const limit = { key: 'tenant:acme', limit: 1 };
      const { worker } = await loseRunningJob(
        (producer) => producer.enqueue({ name: 'charge', scope: 'acme', key: 'limited-1', data: { cents: 7 }, concurrency: limit }),
        { scope: 'acme', key: 'limited-1' },
      );
      await forget(worker, 'acme', 'limited-1');

      const report = await sweeper({ action: 'reenqueue' }).runOnce();
      expect(report.recoveries).toMatchObject([{ key: 'limited-1', action: 'reenqueued' }]);
      const job = await queue.getJob(jobIdFor('acme', 'limited-1'));
      expect(job?.data).toEqual({ idempotencyKey: 'limited-1', scope: 'acme', payload: { cents: 7 }, concurrencyKey: 'tenant:acme', concurrencyLimit: 1 });

      // The limit holds for the re-enqueued job: while another job of the tenant holds the one slot, it waits.
      const holder = await keys.acquireConcurrencySlot('acme', 'other-job', limit, { leaseMs: 60_000, starvationMs: 600_000 });
      expect(holder.acquired).toBe(true);
      const events: WorkerEvent[] = [];
      startWorker(events);
      await waitFor('the re-enqueued job to be deferred by the limit', async () => events.some((e) => e.kind === 'concurrency-limited'));
      expect((await keys.get('acme', 'limited-1'))?.status).toBe('processing');
      if (holder.acquired) await keys.releaseConcurrencySlot('acme', 'other-job', holder);
      const { job: done } = await waitForJobState(queue, jobIdFor('acme', 'limited-1'), ['completed'], 30_000);
      expect(done.returnvalue).toEqual({ charged: 7, fence: 2 });
    });

    it('re-enqueues a job that named two concurrency keys with both, so each limit still holds for it', async () => {
      const limits = [
        { key: 'tenant:acme', limit: 2 },
        { key: 'all-charges', limit: 1 },
      ];
      const { worker } = await loseRunningJob(
        (producer) => producer.enqueue({ name: 'charge', scope: 'acme', key: 'limited-2', data: { cents: 9 }, concurrency: limits }),
        { scope: 'acme', key: 'limited-2' },
      );
      await forget(worker, 'acme', 'limited-2');

      const report = await sweeper({ action: 'reenqueue' }).runOnce();
      expect(report.recoveries).toMatchObject([{ key: 'limited-2', action: 'reenqueued' }]);
      const job = await queue.getJob(jobIdFor('acme', 'limited-2'));
      // Both limits, in the order the slots are taken (by key).
      expect(job?.data).toEqual({
        idempotencyKey: 'limited-2',
        scope: 'acme',
        payload: { cents: 9 },
        concurrencyLimits: [
          { key: 'all-charges', limit: 1 },
          { key: 'tenant:acme', limit: 2 },
        ],
      });

      // The in-all limit holds for the re-enqueued job although its tenant has a free slot.
      const holder = await keys.acquireConcurrencySlot('globex', 'other-job', limits[1]!, { leaseMs: 60_000, starvationMs: 600_000 });
      expect(holder.acquired).toBe(true);
      const events: WorkerEvent[] = [];
      startWorker(events);
      await waitFor('the re-enqueued job to be deferred by the limit', async () => events.some((e) => e.kind === 'concurrency-limited'));
      expect(events.find((e) => e.kind === 'concurrency-limited')).toMatchObject({ concurrencyKey: 'all-charges' });
      expect((await keys.get('acme', 'limited-2'))?.status).toBe('processing');
      if (holder.acquired) await keys.releaseConcurrencySlot('globex', 'other-job', holder);
      const { job: done } = await waitForJobState(queue, jobIdFor('acme', 'limited-2'), ['completed'], 30_000);
      expect(done.returnvalue).toEqual({ charged: 9, fence: 2 });
    });

    it('re-enqueues a coalescing run as that run, so its pending successor still runs after it', { timeout: 60_000 }, async () => {
      let first: EnqueueResult | undefined;
      const { producer, worker } = await loseRunningJob(async (p) => {
        first = await p.enqueue({ name: 'charge', scope: 'acme', key: 'entity-1', data: { cents: 1 }, coalesce: true });
      }, { scope: 'acme', key: 'entity-1#1' });
      // Arrives while generation 1 runs: becomes its pending successor.
      const second = await producer.enqueue({ name: 'charge', scope: 'acme', key: 'entity-1', data: { cents: 2 }, coalesce: true });
      await waitForJobState(queue, second.jobId, ['completed']);
      await forget(worker, 'acme', 'entity-1#1');

      const report = await sweeper({ action: 'reenqueue' }).runOnce();
      expect(report.recoveries).toMatchObject([{ key: 'entity-1#1', action: 'reenqueued', jobId: first!.jobId }]);
      const job = await queue.getJob(first!.jobId);
      expect(job?.data).toEqual({ idempotencyKey: 'entity-1', scope: 'acme', payload: { cents: 1 }, coalesce: true });

      const events: WorkerEvent[] = [];
      startWorker(events);
      await waitForJobState(queue, first!.jobId, ['completed'], 30_000);
      // Generation 1 ran again (taken over) and then its successor, generation 2, with the newest payload.
      await waitFor('the successor to complete', async () => (await keys.get('acme', 'entity-1#2'))?.status === 'completed');
      expect(await keys.get('acme', 'entity-1#1')).toMatchObject({ status: 'completed', result: { charged: 1, fence: 2 } });
      expect(await keys.get('acme', 'entity-1#2')).toMatchObject({ status: 'completed', result: { charged: 2, fence: 1 } });
    });
  });

  it('is recovered end to end by a worker process: lost job found and re-run under the advisory-locked sweeper', async () => {
    const lost = await loseJob('order-9');
    const proc = await startWorkerProcess({
      config: loadEnvConfig({
        DATABASE_URL: env.databaseUrl,
        REDIS_URL: env.redisUrl,
        REDIS_PREFIX: env.redisPrefix,
        SCHEMA: env.schema,
        QUEUE,
        MIGRATE: 'false',
        SWEEP_AFTER_MS: '60000',
        SWEEPER_INTERVAL_MS: '200',
        JANITOR_ENABLED: 'false',
        CONCURRENCY: '2',
        LOG_LEVEL: 'silent',
      }),
      handler: async (ctx: { data: { cents: number }; fence: number }) => ({ charged: ctx.data.cents, fence: ctx.fence }),
      handleSignals: false,
      logger: silent,
    });
    closers.push(() => proc.stop());
    const { job } = await waitForJobState(queue, lost.jobId, ['completed']);
    expect(job.returnvalue).toEqual({ charged: 100, fence: 2 });
    await waitFor('the key to complete', async () => (await keys.get('acme', 'order-9'))?.status === 'completed');
  });
});
