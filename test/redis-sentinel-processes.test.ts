// @module-tag redis
/**
 * Redis Sentinel for every process (`REDIS_SENTINELS`, `REDIS_SENTINEL_MASTER`): the worker, the
 * producer, the HTTP server (and the outbox relay in it), the standalone relay and the
 * maintenance process (its sweeper re-enqueues through BullMQ) find the master through a private
 * Sentinel set-up (test/support/redis-sentinel.ts), never through `REDIS_URL` (here a port where
 * nothing listens), and follow its failovers: a requested `SENTINEL FAILOVER` and a crash of the
 * master. Every job sent before, between and after completes; none fails.
 */
import { Queue } from 'bullmq';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotentProducer } from '../src/index.js';
import {
  loadEnvConfig,
  loadHttpEnvConfig,
  openRedisConnection,
  redisSettingsFromEnv,
  startHttpServerProcess,
  startMaintenanceProcess,
  startOutboxRelayProcess,
  startWorkerProcess,
  type RedisConnection,
} from '../src/process/index.js';
import { httpClient } from './support/http-client.js';
import { waitForJobState } from './support/queue-helpers.js';
import { RedisSentinelSet } from './support/redis-sentinel.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const QUEUE = 'sentinel';
const silent = pino({ level: 'silent' });

describe('REDIS_SENTINELS in the configuration', () => {
  it('is read with the master name (default mymaster), and refused with REDIS_CLUSTER_NODES or with an entry that is not host:port', () => {
    expect(redisSettingsFromEnv(loadEnvConfig({ REDIS_SENTINELS: '127.0.0.1:26379,127.0.0.1:26380' }))).toMatchObject({
      sentinels: '127.0.0.1:26379,127.0.0.1:26380',
      sentinelMaster: 'mymaster',
    });
    expect(redisSettingsFromEnv(loadEnvConfig({ REDIS_SENTINELS: 'a:1', REDIS_SENTINEL_MASTER: 'queues' })).sentinelMaster).toBe('queues');
    expect(() => loadEnvConfig({ REDIS_SENTINELS: 'a:1', REDIS_CLUSTER_NODES: 'b:2', REDIS_PREFIX: '{ij}' })).toThrow(/REDIS_SENTINELS: set with REDIS_CLUSTER_NODES/);
    expect(() => loadEnvConfig({ REDIS_SENTINELS: 'a' })).toThrow(/REDIS_SENTINELS: "a" is not host:port/);
  });

  it('gives ioredis the sentinels, the master name, the sentinels\' credentials and the master\'s password and database from REDIS_URL', () => {
    const { connection } = openRedisConnection({ url: 'redis://:secret@ignored:6379/2', sentinels: 'redis://watch:word@127.0.0.1:26379', sentinelMaster: 'queues' });
    expect(connection).toMatchObject({
      sentinels: [{ host: '127.0.0.1', port: 26379 }],
      name: 'queues',
      sentinelUsername: 'watch',
      sentinelPassword: 'word',
      password: 'secret',
      db: 2,
      failoverDetector: true,
    });
  });
});

describe('every process on a master that Sentinel names, through its failovers', () => {
  let env: TestEnv;
  let set: RedisSentinelSet;
  let redis: RedisConnection;
  let queue: Queue;
  let producer: IdempotentProducer;
  const stops: Array<() => Promise<void>> = [];

  const common = () => ({
    DATABASE_URL: env.databaseUrl,
    DATABASE_DIRECT_URL: env.databaseDirectUrl,
    // Nothing listens there: only the sentinels say where Redis is.
    REDIS_URL: 'redis://127.0.0.1:1',
    REDIS_SENTINELS: set.sentinelsSetting,
    REDIS_SENTINEL_MASTER: set.masterName,
    REDIS_PREFIX: env.redisPrefix,
    SCHEMA: env.schema,
    QUEUE,
    STARTUP_WAIT_MS: '20000',
  });

  beforeAll(async () => {
    env = await createTestEnv('redis-sentinel-processes');
    set = await RedisSentinelSet.start({ replicas: 1, sentinels: 3 });
    const worker = await startWorkerProcess({ config: loadEnvConfig({ ...common(), CONCURRENCY: '2' }), handler: async (ctx) => ({ key: ctx.key }), logger: silent, handleSignals: false });
    stops.push(() => worker.stop());
    const http = await startHttpServerProcess({ config: loadHttpEnvConfig({ ...common(), HTTP_PORT: '0', HTTP_QUEUES: QUEUE }), logger: silent, handleSignals: false });
    stops.push(() => http.stop());
    const relay = await startOutboxRelayProcess({ config: loadEnvConfig(common()), logger: silent, handleSignals: false });
    stops.push(() => relay.stop());
    const maintenance = await startMaintenanceProcess({ config: loadEnvConfig({ ...common(), SWEEPER_QUEUES: QUEUE }), logger: silent, handleSignals: false });
    stops.push(() => maintenance.stop());
    redis = openRedisConnection(redisSettingsFromEnv(loadEnvConfig(common())));
    producer = new IdempotentProducer({ queue: QUEUE, connection: redis.connection, prefix: env.redisPrefix, schema: env.schema });
    queue = new Queue(QUEUE, { connection: redis.connection, prefix: env.redisPrefix });
    // A connection lost in a failover is reported to the listeners; the test checks the jobs.
    queue.on('error', () => {});
    httpUrl = http.url;
  }, 120_000);
  let httpUrl: string;

  afterAll(async () => {
    for (const stop of stops.reverse()) await stop().catch(() => {});
    await producer?.close();
    await queue?.close();
    await redis?.close();
    await set?.stop();
    await env?.teardown();
  });

  /** Sends one job each way (the producer, the outbox and the standalone relay, the HTTP API) and waits until all three completed. */
  async function sendAndComplete(round: string) {
    const direct = await producer.enqueue({ name: 'charge', key: `${round}-direct`, data: { round } });
    await env.db.transaction().execute(async (tx) => {
      await producer.enqueue({ name: 'charge', key: `${round}-outbox`, data: { round } }, { tx });
    });
    const posted = await httpClient(httpUrl).post(`/v1/queues/${QUEUE}/jobs?name=charge`, { key: `${round}-http`, json: { round } });
    expect(posted.status).toBe(202);
    const direct1 = await waitForJobState(queue, direct.jobId, ['completed', 'failed'], 60_000);
    expect(direct1.state).toBe('completed');
    for (const key of [`${round}-outbox`, `${round}-http`]) {
      await expect.poll(async () => (await env.db.selectFrom(`${env.schema}.idempotency_keys`).select('status').where('key', '=', key).executeTakeFirst())?.status, { timeout: 60_000 }).toBe('completed');
    }
  }

  it('runs jobs from the producer, the outbox relay and the HTTP API on the master', async () => {
    await sendAndComplete('before');
  }, 90_000);

  it('after SENTINEL FAILOVER every process follows the new master; nothing failed', async () => {
    const change = await set.failover();
    expect(change.to).not.toBe(change.from);
    await sendAndComplete('after-failover');
    await set.waitForHealthy(60_000);
    expect(await queue.getJobCounts('failed')).toEqual({ failed: 0 });
  }, 120_000);

  it('after a crash of the master every process follows the promoted replica; nothing failed', async () => {
    const change = await set.crashMaster();
    await sendAndComplete('after-crash');
    await set.restartNode(change.from);
    await set.waitForHealthy(60_000);
    expect(await queue.getJobCounts('failed')).toEqual({ failed: 0 });
  }, 120_000);
});
