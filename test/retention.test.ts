// @module-tag redis
/**
 * Retention's edge: a key's record has expired and been deleted, but BullMQ still keeps the
 * key's finished job under the same deterministic id. A new request with that key and another
 * payload must run, once, and be reported with its own result; never be dropped as a
 * duplicate of the old job nor be shown the old job's result.
 */
import { randomBytes } from 'node:crypto';
import { Queue, Worker } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { IdempotencyKeys, IdempotentProducer, KeyReusedError, KeySettledListener, OutboxRelay, createHttpApi, createPostgresDb, jobIdFor, type HttpApi, type IdempotentWorker } from '../src/index.js';
import { Janitor } from '../src/process/index.js';
import { readStoredJob, removeFinishedJob } from '../src/bullmq/finished-job-removal.js';
import { insertOutboxRows } from '../src/store/sql/outbox.js';
import { createEffectsTable, effectsOf } from './support/protocol-fixtures.js';
import { httpClient } from './support/http-client.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { startTestHandlerWorker, type TestPayload } from './support/test-handler.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const TOKEN = 'tok_acme_0123456789abcdef';
const silent = pino({ level: 'silent' });

let env: TestEnv;
const workers: IdempotentWorker<any, any>[] = [];
const closers: Array<() => Promise<unknown>> = [];

beforeAll(async () => {
  env = await createTestEnv('retention');
  await createEffectsTable(env.db, env.schema);
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((worker) => worker.close({ force: true })));
});
afterAll(async () => {
  for (const close of closers.reverse()) await close();
  await env?.teardown();
});

function bullQueue(name: string): Queue {
  const queue = new Queue(name, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  closers.push(() => queue.close());
  return queue;
}

function producerFor(queue: string): IdempotentProducer {
  const producer = new IdempotentProducer({ queue, connection: { url: env.redisUrl }, prefix: env.redisPrefix, schema: env.schema });
  closers.push(() => producer.close());
  return producer;
}

function relayFor(options: Partial<ConstructorParameters<typeof OutboxRelay>[0]> = {}): OutboxRelay {
  const relay = new OutboxRelay({
    db: env.db,
    schema: env.schema,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    heldRowRetryMs: 0,
    logger: silent,
    ...options,
  });
  closers.push(() => relay.stop());
  return relay;
}

function startWorker(queue: string): IdempotentWorker<TestPayload, unknown> {
  const worker = startTestHandlerWorker(env, queue);
  workers.push(worker);
  return worker;
}

/** Runs whatever waits in `queue` through a plain BullMQ worker (no idempotency), until `jobId` completed. */
async function completeWithPlainWorker(queue: Queue, jobId: string): Promise<void> {
  const worker = new Worker(queue.name, async () => 'done', { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  try {
    await waitForJobState(queue, jobId, ['completed']);
  } finally {
    await worker.close();
  }
}

/** Lets every record of `key` expire (any scope) and runs the janitor once, which deletes them. */
async function expireAndCollect(key: string, tombstoneMs = 0): Promise<void> {
  const { numAffectedRows } = await sql`
    update ${sql.id(env.schema, 'idempotency_keys')} set expires_at = now() - interval '1 second'
     where key = ${key} and status <> 'processing'`.execute(env.db);
  expect(Number(numAffectedRows)).toBeGreaterThan(0);
  const report = await new Janitor({ db: env.db, schema: env.schema, tombstoneMs, logger: silent }).runOnce();
  expect(report.keysDeleted).toBe(Number(numAffectedRows));
}

async function unsentOutboxRows(): Promise<number> {
  const { rows } = await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, 'outbox')} where sent_at is null`.execute(env.db);
  return Number(rows[0]!.n);
}

describe('a key past its retention, inside its tombstone window', () => {
  it('a worker acknowledges a duplicate as "completed, result expired" without running it, and refuses another payload as reused', { timeout: 30_000 }, async () => {
    const queue = bullQueue('tombstone');
    const worker = startWorker('tombstone');
    const events: string[] = [];
    worker.on('event', (event: { kind: string; key?: string }) => {
      if (event.key === 'T') events.push(event.kind);
    });
    const data = (value: string) => ({ idempotencyKey: 'T', scope: 's', payload: { value } });
    await queue.add('charge', data('A'), { jobId: 'tomb-first' });
    await waitForJobState(queue, 'tomb-first', ['completed']);
    await expireAndCollect('T', 3_600_000);

    await queue.add('charge', data('A'), { jobId: 'tomb-duplicate' });
    await waitForJobState(queue, 'tomb-duplicate', ['completed']);
    expect((await queue.getJob('tomb-duplicate'))?.returnvalue).toBeNull();
    await queue.add('charge', data('B'), { jobId: 'tomb-other' });
    await waitForJobState(queue, 'tomb-other', ['failed']);
    expect((await queue.getJob('tomb-other'))?.failedReason).toMatch(/different|reused/i);

    expect(await effectsOf(env.db, env.schema, 's', 'T')).toHaveLength(1);
    expect(events).toEqual(['claimed', 'completed', 'result-expired', 'key-reused']);
  });
});

describe('a key reused after its record expired', () => {
  it('over HTTP: POST B after A expired runs B once, and GET shows B, never A', { timeout: 30_000 }, async () => {
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
    const listener = new KeySettledListener({ connectionString: env.databaseDirectUrl, schema: env.schema });
    closers.push(() => listener.close());
    const api: HttpApi = await createHttpApi({
      keys,
      connection: { url: env.redisUrl },
      prefix: env.redisPrefix,
      queues: ['http'],
      tokens: { [TOKEN]: 'acme' },
      listener,
      relayPollIntervalMs: 50,
      logger: silent,
    });
    // Closed at the end of this test: its relay would otherwise take the other tests' outbox rows.
    onTestFinished(() => api.close());
    const client = httpClient(await api.listen({ host: '127.0.0.1', port: 0 }));
    const path = '/v1/queues/http/jobs?name=charge';

    startWorker('http');
    const first = await client.post(path, { token: TOKEN, key: 'K', json: { value: 'A' }, headers: { prefer: 'wait=5' } });
    expect(first.body).toMatchObject({ state: 'completed', result: { value: 'A' } });
    await Promise.all(workers.splice(0).map((worker) => worker.close()));
    await expireAndCollect('K');

    // No worker runs: B is accepted and queued, not reported as A's completed job.
    const second = await client.post(path, { token: TOKEN, key: 'K', json: { value: 'B' } });
    expect(second.status).toBe(202);
    expect(second.body.state).toBe('queued');
    expect(second.body).not.toHaveProperty('result');
    expect((await client.get('/v1/queues/http/jobs/K', { token: TOKEN })).body.state).toBe('queued');

    startWorker('http');
    const read = await client.get('/v1/queues/http/jobs/K', { token: TOKEN, headers: { prefer: 'wait=10' } });
    expect(read.body).toMatchObject({ state: 'completed', result: { value: 'B' } });
    const replay = await client.post(path, { token: TOKEN, key: 'K', json: { value: 'B' } });
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.body).toMatchObject({ state: 'completed', result: { value: 'B' } });
    // A ran once, B ran once.
    expect(await effectsOf(env.db, env.schema, 'acme', 'K')).toHaveLength(2);
    const job = await bullQueue('http').getJob(jobIdFor('acme', 'K'));
    expect(job?.data.payload).toEqual({ value: 'B' });
  });

  it('through IdempotentProducer: B replaces the finished A and runs once; a true duplicate of B is kept as is', { timeout: 30_000 }, async () => {
    const producer = producerFor('direct');
    const queue = bullQueue('direct');
    const jobId = jobIdFor('s', 'K');
    startWorker('direct');
    expect((await producer.enqueue({ name: 'charge', scope: 's', key: 'K', data: { value: 'A' } })).status).toBe('added');
    await waitForJobState(queue, jobId, ['completed']);
    await expireAndCollect('K');

    expect((await producer.enqueue({ name: 'charge', scope: 's', key: 'K', data: { value: 'B' } })).status).toBe('added');
    const done = await waitFor('B to complete', async () => {
      const job = await queue.getJob(jobId);
      return job?.finishedOn && job.data.payload.value === 'B' ? job : undefined;
    });
    expect(done.returnvalue).toMatchObject({ value: 'B' });
    // Finished with B's own payload: a duplicate, left as it is (its claim would replay).
    expect((await producer.enqueue({ name: 'charge', scope: 's', key: 'K', data: { value: 'B' } })).status).toBe('duplicate');
    expect((await queue.getJob(jobId))?.finishedOn).toBe(done.finishedOn);
    expect(await effectsOf(env.db, env.schema, 's', 'K')).toHaveLength(2);
  });

  it('through IdempotentProducer, racing: of two producers replacing one finished job, exactly one adds, the other is refused', async () => {
    const queue = bullQueue('race');
    const producers = [producerFor('race'), producerFor('race')];
    for (let round = 0; round < 10; round++) {
      const key = `race-${round}`;
      const jobId = jobIdFor('s', key);
      await producers[0]!.enqueue({ name: 'charge', scope: 's', key, data: { value: 'old' } });
      await completeWithPlainWorker(queue, jobId);
      expect(await queue.getJobState(jobId)).toBe('completed');

      const outcomes = await Promise.allSettled(
        producers.map((producer, i) => producer.enqueue({ name: 'charge', scope: 's', key, data: { value: `new-${i}` } })),
      );
      const added = outcomes.filter((o) => o.status === 'fulfilled');
      expect(added.map((o) => (o as PromiseFulfilledResult<{ status: string }>).value.status)).toEqual(['added']);
      const refused = outcomes.find((o) => o.status === 'rejected') as PromiseRejectedResult;
      expect(refused.reason).toBeInstanceOf(KeyReusedError);
      const winner = outcomes.indexOf(added[0]!);
      expect(await queue.getJobState(jobId)).toBe('waiting');
      expect((await queue.getJob(jobId))?.data.payload).toEqual({ value: `new-${winner}` });
    }
  });

  it('through the outbox relay: the row of B replaces the finished A, runs once, and the row is marked sent', { timeout: 30_000 }, async () => {
    const producer = producerFor('relayed');
    const queue = bullQueue('relayed');
    const relay = relayFor();
    const jobId = jobIdFor('s', 'R');
    const outbox = (value: string) => env.db.transaction().execute((tx) => producer.enqueue({ name: 'charge', scope: 's', key: 'R', data: { value } }, { tx }));
    startWorker('relayed');
    await outbox('A');
    expect(await relay.relayOnce()).toBe(1);
    await waitForJobState(queue, jobId, ['completed']);
    await expireAndCollect('R');

    await outbox('B');
    expect(await relay.relayOnce()).toBe(1);
    expect(await unsentOutboxRows()).toBe(0);
    const done = await waitFor('B to complete', async () => {
      const job = await queue.getJob(jobId);
      return job?.finishedOn && job.data.payload.value === 'B' ? job : undefined;
    });
    expect(done.returnvalue).toMatchObject({ value: 'B' });
    expect(await effectsOf(env.db, env.schema, 's', 'R')).toHaveLength(2);
  });

  it('through the outbox relay: a row whose id is held by a pending job with another payload waits, then is added once that job finished', { timeout: 30_000 }, async () => {
    const producer = producerFor('held');
    const queue = bullQueue('held');
    const relay = relayFor();
    const jobId = jobIdFor('s', 'H');
    await producer.enqueue({ name: 'charge', scope: 's', key: 'H', data: { value: 'first' } });
    await env.db.transaction().execute((tx) => producer.enqueue({ name: 'charge', scope: 's', key: 'H', data: { value: 'second' } }, { tx }));
    // Waiting with another payload: not dropped, not marked sent.
    expect(await relay.relayOnce()).toBe(0);
    expect(await unsentOutboxRows()).toBe(1);

    startWorker('held');
    await waitForJobState(queue, jobId, ['completed']);
    expect(await relay.relayOnce()).toBe(1);
    expect(await unsentOutboxRows()).toBe(0);
    // Added: the key's record (first's) is still kept, so the worker refuses second as reused.
    const refused = await waitForJobState(queue, jobId, ['failed']);
    expect(refused.job.data.payload).toEqual({ value: 'second' });
    expect(refused.job.failedReason).toMatch(/already used with a different payload/);
    expect(await effectsOf(env.db, env.schema, 's', 'H')).toHaveLength(1);
  });
});

describe('removeFinishedJob', () => {
  it('removes only the finished job it read: a job that replaced it meanwhile is left alone', async () => {
    const queue = bullQueue('guard');
    const jobId = jobIdFor('s', 'G');
    await queue.add('charge', { idempotencyKey: 'G', scope: 's', payload: 1 }, { jobId });
    expect(await removeFinishedJob(queue, (await readStoredJob(queue, jobId))!)).toBe('pending');
    await completeWithPlainWorker(queue, jobId);
    const stale = (await readStoredJob(queue, jobId))!;
    // Someone else replaces it first.
    expect(await removeFinishedJob(queue, stale)).toBe('removed');
    await queue.add('charge', { idempotencyKey: 'G', scope: 's', payload: 2 }, { jobId });
    // The second remover's read is stale: it must not remove the waiting replacement.
    expect(await removeFinishedJob(queue, stale)).toBe('changed');
    expect(await queue.getJobState(jobId)).toBe('waiting');
    expect((await queue.getJob(jobId))?.data.payload).toBe(2);
  });
});

describe('the outbox relay under transient faults', () => {
  it('keeps every row when its database connections are cut, between batches and mid-batch, and sends each on a later run', { timeout: 30_000 }, async () => {
    // A pool of the relay's own, named so that exactly its backends can be terminated.
    const applicationName = `test:retention-relay-${randomBytes(4).toString('hex')}`;
    const db = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 2, applicationName }, () => {});
    closers.push(() => db.destroy());
    const cutRelayConnections = async () => {
      // Two statements: the pids first, so that nothing but this pool's backends is ever terminated.
      const { rows } = await sql<{ pid: number }>`select pid from pg_stat_activity where application_name = ${applicationName}`.execute(env.db);
      const pids = rows.map((row) => row.pid);
      if (pids.length > 0) await sql`select pg_terminate_backend(pid) from unnest(${pids}::int[]) as pid`.execute(env.db);
      return pids.length;
    };
    const logged: Array<Record<string, unknown>> = [];
    const logger = pino({ level: 'warn' }, { write: (line: string) => void logged.push(JSON.parse(line)) });
    let midBatchCuts = 0;
    const relay = relayFor({
      db,
      batchSize: 10,
      pollIntervalMs: 20,
      logger,
      // Cut the relay's connections twice after BullMQ took a batch and before the batch is marked sent.
      faultHook: async (point) => {
        if (point === 'relay-after-add' && midBatchCuts < 2) {
          midBatchCuts++;
          expect(await cutRelayConnections()).toBeGreaterThan(0);
        }
      },
    });
    const producer = producerFor('faults');
    const queue = bullQueue('faults');
    const requests = Array.from({ length: 25 }, (_, i) => ({ name: 'charge', scope: 'f', key: `k${i}`, data: { i } }));
    await env.db.transaction().execute((tx) => producer.enqueueBulk(requests, { tx }));

    // Between batches: the pool's idle connection is cut.
    await sql`select 1`.execute(db);
    expect(await cutRelayConnections()).toBe(1);
    relay.start();
    await waitFor('every outbox row sent', async () => (await unsentOutboxRows()) === 0);
    expect(midBatchCuts).toBe(2);
    // Each failed batch was logged as a connection fault and retried: the two cut mid-batch, and
    // the first one too if it ran before the pool had noticed its idle connection was cut.
    expect(logged.filter((line) => /connection fault/.test(String(line.msg))).length).toBeGreaterThanOrEqual(2);
    // Every request is in BullMQ, once.
    expect(await queue.getJobCounts('wait')).toEqual({ wait: 25 });
    for (const request of requests) {
      expect((await queue.getJob(jobIdFor('f', request.key)))?.data.payload).toEqual(request.data);
    }
    await relay.stop();
  });

  it('keeps every row when its Redis connection is killed between batches and between an add and its commit, and sends each once', { timeout: 30_000 }, async () => {
    const queueName = 'redis-faults';
    // The relay's own Redis connection (BullMQ shares a connection it is given), so that the
    // test kills exactly it, from another connection, as a server restart or a proxy would.
    const relayConnection = env.openRedis();
    const admin = env.openRedis();
    const killRelayConnections = async () => {
      const id = await relayConnection.client('ID');
      await admin.client('KILL', 'ID', String(id));
      return 1;
    };
    let kills = 0;
    const relay = relayFor({
      connection: relayConnection,
      batchSize: 10,
      pollIntervalMs: 20,
      faultHook: async (point) => {
        if (point === 'relay-after-add' && kills < 2) {
          kills++;
          expect(await killRelayConnections()).toBeGreaterThan(0);
        }
      },
    });
    const rows = Array.from({ length: 25 }, (_, i) => ({
      queue: queueName,
      jobName: 'charge',
      jobId: jobIdFor('r', `k${i}`),
      data: { idempotencyKey: `k${i}`, scope: 'r', payload: { i } },
      opts: {},
    }));
    await insertOutboxRows(env.db, env.schema, rows.slice(0, 5));
    expect(await relay.relayOnce()).toBe(5);
    expect(await killRelayConnections()).toBeGreaterThan(0);
    await insertOutboxRows(env.db, env.schema, rows.slice(5));
    relay.start();
    await waitFor('every outbox row sent', async () => (await unsentOutboxRows()) === 0);
    expect(kills).toBe(2);
    const queue = bullQueue(queueName);
    expect(await queue.getJobCounts('wait')).toEqual({ wait: 25 });
    for (const row of rows) expect((await queue.getJob(row.jobId))?.data).toEqual(row.data);
    await relay.stop();
  });
});
