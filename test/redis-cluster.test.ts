// @module-tag redis
/**
 * The system on a Redis Cluster of its own (3 masters, one replica each; test/support/redis-cluster.ts):
 * workers (in-process and the runnable), the producer, the outbox relay, the HTTP API, the
 * sweeper's look-ups, a failover under a running worker, and the refusal of a prefix
 * without a hash tag. Postgres is the test file's own schema on the shared server.
 */
import { randomBytes } from 'node:crypto';
import { Queue } from 'bullmq';
import { Cluster } from 'ioredis';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, IdempotencyKeys, IdempotentProducer, OutboxRelay, createIdempotentWorker, jobIdFor } from '../src/index.js';
import { BullmqJobLookup, hashTagOf, loadEnvConfig, loadHttpEnvConfig, openRedisConnection, startWorkerProcess, type RedisConnection } from '../src/process/index.js';
import { httpClient } from './support/http-client.js';
import { startHttpServerChild, type HttpServerChild } from './support/http-server-child.js';
import { createEffectsTable, effectsOf } from './support/protocol-fixtures.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { RedisCluster } from './support/redis-cluster.js';
import { testHandler } from './support/test-handler.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';
import { startWorkerChild, stopChildren, type WorkerChild } from './support/worker-child.js';

const QUEUE = 'payments';
const TOKEN = 'cluster-test-token-0123456789';
const silent = pino({ level: 'silent' });

let cluster: RedisCluster;
let env: TestEnv;
let prefix: string;
let redis: RedisConnection;
let queue: Queue;
let keys: IdempotencyKeys;
const closers: Array<() => Promise<unknown>> = [];
const children: WorkerChild[] = [];

beforeAll(async () => {
  cluster = await RedisCluster.start({ masters: 3 });
  env = await createTestEnv('cluster');
  await createEffectsTable(env.db, env.schema);
  // Every key of every queue under this prefix hashes by its tag to one slot.
  prefix = `{ijtest-cluster-${randomBytes(3).toString('hex')}}`;
  redis = openRedisConnection({ url: 'redis://unused.invalid:1', clusterNodes: cluster.nodesSetting });
  queue = new Queue(QUEUE, { connection: redis.connection, prefix });
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
}, 120_000);
afterEach(async () => {
  await stopChildren(children.splice(0));
  for (const close of closers.splice(0).reverse()) await close();
}, 120_000);
afterAll(async () => {
  await queue?.close();
  await redis?.close();
  await env?.teardown();
  await cluster?.stop();
});

/** The environment of a process on the cluster. */
function clusterEnv(extra: Record<string, string> = {}): Record<string, string> {
  return {
    DATABASE_URL: env.databaseUrl,
    DATABASE_DIRECT_URL: env.databaseDirectUrl,
    REDIS_CLUSTER_NODES: cluster.nodesSetting,
    REDIS_PREFIX: prefix,
    SCHEMA: env.schema,
    QUEUE,
    MIGRATE: 'false',
    CONCURRENCY: '4',
    JANITOR_ENABLED: 'false',
    SWEEPER_ENABLED: 'false',
    STATS_INTERVAL_MS: '0',
    LOG_LEVEL: 'silent',
    ...extra,
  };
}

/**
 * Kills another shard's master and replica, so the whole cluster reports `fail` (every slot
 * answers CLUSTERDOWN); keeps it so for longer than BullMQ's blocking read (5 s at most) and its
 * watchdog (1 s after it), which then resets a worker's blocking client while the cluster is
 * down; then starts both again and waits until the cluster is healthy.
 */
async function takeClusterDownLongerThanABlockingRead(): Promise<void> {
  const queueShard = await cluster.shardOf(`${prefix}:${QUEUE}:wait`);
  const nodes = await cluster.nodes();
  const downMaster = nodes.find((n) => n.role === 'master' && n.port !== queueShard.master)!;
  const downReplica = nodes.find((n) => n.masterId === downMaster.id)!;
  await cluster.kill(downReplica.port);
  await cluster.kill(downMaster.port);
  await waitFor('the cluster to report its state as fail', async () => (await cluster.state(queueShard.master)) === 'fail', 30_000, 200);
  await new Promise((resolve) => setTimeout(resolve, 10_000));
  await cluster.startNode(downMaster.port);
  await cluster.startNode(downReplica.port);
  await cluster.waitUntilHealthy(60_000);
}

async function startClusterWorker(extra: Record<string, string> = {}) {
  const config = loadEnvConfig(clusterEnv(extra));
  const proc = await startWorkerProcess({ config, handler: testHandler(env.schema, 'cluster-in-process'), handleSignals: false, logger: silent });
  closers.push(() => proc.stop());
  return proc;
}

function openProducer(): IdempotentProducer {
  const producer = new IdempotentProducer({ queue: QUEUE, connection: redis.connection, prefix, schema: env.schema });
  closers.push(() => producer.close());
  return producer;
}

describe('Redis Cluster', () => {
  it('runs on a cluster of 3 masters with a replica each, the queue on one shard', async () => {
    const nodes = await cluster.nodes();
    expect(nodes.filter((n) => n.role === 'master')).toHaveLength(3);
    expect(nodes.filter((n) => n.role === 'replica')).toHaveLength(3);
    const shard = await cluster.shardOf(`${prefix}:${QUEUE}:wait`);
    expect(shard.replicas).toHaveLength(1);
    // BullMQ's keys of the queue and a job's keys share the slot.
    expect(await cluster.shardOf(`${prefix}:${QUEUE}:${jobIdFor('acme', 'k')}`)).toEqual(shard);
  });

  it('refuses a prefix without a hash tag at start, naming the fix', async () => {
    expect(hashTagOf('{ij}:payments:wait')).toBe('ij');
    expect(hashTagOf('bull:payments:wait')).toBeUndefined();
    expect(hashTagOf('{}:payments:{x}')).toBeUndefined();
    const start = () => loadEnvConfig(clusterEnv({ REDIS_PREFIX: 'bull' }));
    expect(start).toThrow(ConfigError);
    expect(start).toThrow(/REDIS_PREFIX "bull" has no hash tag.*REDIS_PREFIX=\{bull\}/s);
    expect(() => loadHttpEnvConfig(clusterEnv({ REDIS_PREFIX: 'ij' }))).toThrow(/REDIS_PREFIX=\{ij\}/);
    expect(() => loadEnvConfig(clusterEnv({ REDIS_CLUSTER_NODES: '127.0.0.1' }))).toThrow(/REDIS_CLUSTER_NODES: "127.0.0.1" is not host:port/);
    // Single-server Redis takes any prefix.
    expect(loadEnvConfig({ REDIS_PREFIX: 'bull' }).REDIS_PREFIX).toBe('bull');
    // The library refuses it too, whoever built the cluster client.
    expect(() => new IdempotentProducer({ queue: QUEUE, connection: redis.connection, prefix: 'bull' })).toThrow(ConfigError);
    expect(() =>
      createIdempotentWorker({ queue: QUEUE, connection: redis.connection, prefix: 'ij', keys, handler: async () => null, logger: silent }),
    ).toThrow(/has no hash tag/);
    // The runnable worker exits at start with the error instead of failing every job (the wait
    // ends at its exit; the timeout only bounds a slow start on a busy machine).
    await expect(startWorkerChild('./test-worker.ts', { ...clusterEnv({ REDIS_PREFIX: 'bull' }), LOG_LEVEL: 'info' }, { readyTimeoutMs: 90_000 })).rejects.toThrow(
      /has no hash tag/,
    );
  }, 120_000);

  it('worker processes and the producer: duplicates enqueued by many requests run one effect each', async () => {
    await startClusterWorker();
    children.push(await startWorkerChild('./test-worker.ts', { ...clusterEnv(), LOG_LEVEL: 'info' }));
    const producer = openProducer();
    const requests = Array.from({ length: 60 }, (_, i) => ({ name: 'charge', scope: 'shop', key: `w-${i % 20}`, data: { value: i % 20 } }));
    const results = await Promise.all(requests.map((request) => producer.enqueue(request)));
    expect(results.filter((r) => r.status === 'added').length).toBeGreaterThanOrEqual(20);
    for (let i = 0; i < 20; i++) await waitForJobState(queue, jobIdFor('shop', `w-${i}`), ['completed'], 30_000);
    const { rows } = await sql<{ key: string; n: number }>`
      select key, count(*)::int as n from ${sql.id(env.schema, 'effects')} where scope = 'shop' and key like 'w-%' group by key`.execute(env.db);
    expect(rows).toHaveLength(20);
    expect(rows.every((r) => r.n === 1)).toBe(true);
  });

  it('outbox relay: a committed enqueue reaches the cluster and runs once', async () => {
    await startClusterWorker();
    const producer = openProducer();
    await env.db.transaction().execute(async (tx) => {
      for (let i = 0; i < 5; i++) await producer.enqueue({ name: 'charge', scope: 'shop', key: `o-${i}`, data: { value: i } }, { tx });
    });
    const relay = new OutboxRelay({ db: env.db, schema: env.schema, connection: redis.connection, prefix, logger: silent, pollIntervalMs: 50 });
    closers.push(() => relay.stop());
    relay.start();
    for (let i = 0; i < 5; i++) await waitForJobState(queue, jobIdFor('shop', `o-${i}`), ['completed'], 30_000);
    // Relayed again (a relay that crashed before marking them sent): BullMQ keeps the job, the key replays.
    expect(await relay.relayOnce()).toBe(0);
    for (let i = 0; i < 5; i++) expect(await effectsOf(env.db, env.schema, 'shop', `o-${i}`)).toHaveLength(1);
  });

  it('HTTP API: submit, the worker completes the job, the job view says so', async () => {
    await startClusterWorker();
    let server: HttpServerChild | undefined = await startHttpServerChild({
      ...clusterEnv(),
      LOG_LEVEL: 'info',
      PG_POOL_SIZE: '4',
      HTTP_PORT: '0',
      HTTP_QUEUES: QUEUE,
      HTTP_TOKENS: `${TOKEN}=acme`,
    });
    closers.push(async () => {
      server?.process.kill('SIGTERM');
      await server?.exited;
      server = undefined;
    });
    const client = httpClient(server.url);
    const submitted = await client.post(`/v1/queues/${QUEUE}/jobs`, { token: TOKEN, key: 'h-1', json: { value: 'via-http' }, headers: { prefer: 'wait=20' } });
    expect(submitted.status).toBe(200);
    expect(submitted.body).toMatchObject({ state: 'completed', result: { value: 'via-http', worker: 'cluster-in-process' } });
    const again = await client.post(`/v1/queues/${QUEUE}/jobs`, { token: TOKEN, key: 'h-1', json: { value: 'via-http' } });
    expect(again.status).toBe(200);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    const read = await client.get(`/v1/queues/${QUEUE}/jobs/h-1`, { token: TOKEN });
    expect(read.body).toMatchObject({ state: 'completed' });
    expect(await effectsOf(env.db, env.schema, 'acme', 'h-1')).toHaveLength(1);
    server.process.kill('SIGTERM');
    expect(await server.exited).toBe(0);
    server = undefined;
  });

  it("sweeper: looks up jobs on the cluster, and re-enqueues a processing key's lost job", async () => {
    const lookup = new BullmqJobLookup({ connection: redis.connection, prefix });
    closers.push(() => lookup.close());
    expect(await lookup.presence(QUEUE, [jobIdFor('acme', 'never-added')])).toBe('missing');
    // A key whose job vanished from Redis while it was processing (a failover lost it, say).
    const payload = { value: 'swept' };
    const claimed = await keys.claim('acme', 's-1', keys.fingerprint({ name: 'charge', payload }), { jobId: jobIdFor('acme', 's-1'), queue: QUEUE, jobName: 'charge', payload });
    expect(claimed.kind).toBe('claimed');
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 hour' where scope = 'acme' and key = 's-1'`.execute(env.db);
    await startClusterWorker({ SWEEPER_ENABLED: 'true', SWEEPER_INTERVAL_MS: '200', SWEEP_AFTER_MS: '1000' });
    const { job } = await waitForJobState(queue, jobIdFor('acme', 's-1'), ['completed'], 30_000);
    expect(job.returnvalue).toMatchObject({ value: 'swept', fence: 2 });
    expect(await lookup.presence(QUEUE, [jobIdFor('acme', 's-1')])).toBe('finished');
  });

  // The cluster is down (a shard with no live node, so every slot refuses with CLUSTERDOWN) for
  // longer than BullMQ's blocking read and its watchdog, which then reconnects the worker's
  // blocking client while the cluster is down. With ioredis's ready check on, that reconnect never
  // ends and the worker takes no job again (see openRedisConnection).
  it('a shard down with its replica: the worker waits out the cluster being down, then takes jobs again', { timeout: 240_000 }, async () => {
    await startClusterWorker();
    const producer = openProducer();
    await producer.enqueue({ name: 'charge', scope: 'shop', key: 'd-0', data: { value: 0 } });
    await waitForJobState(queue, jobIdFor('shop', 'd-0'), ['completed'], 30_000);
    await takeClusterDownLongerThanABlockingRead();
    await producer.enqueue({ name: 'charge', scope: 'shop', key: 'd-1', data: { value: 1 } });
    await waitForJobState(queue, jobIdFor('shop', 'd-1'), ['completed'], 60_000);
    expect(await effectsOf(env.db, env.schema, 'shop', 'd-1')).toHaveLength(1);
  });

  it("a hand-built cluster client with ioredis's ready check: the worker warns at start, and its close ends though BullMQ's loop is stuck", { timeout: 240_000 }, async () => {
    // The options openRedisConnection gives, but the ready check's: ioredis's default.
    const handBuilt = new Cluster(
      cluster.ports.map((port) => ({ host: '127.0.0.1', port })),
      { redisOptions: { maxRetriesPerRequest: null }, maxRedirections: 100, retryDelayOnClusterDown: 300, retryDelayOnMoved: 100, retryDelayOnTryAgain: 300 },
    );
    handBuilt.on('error', () => {});
    closers.push(async () => handBuilt.disconnect());
    const warnings: string[] = [];
    const logger = pino({ level: 'warn' }, { write: (line: string) => warnings.push(JSON.parse(line).msg) });
    const worker = createIdempotentWorker({ queue: QUEUE, connection: handBuilt, prefix, keys, handler: async () => 'done', logger, shutdownTimeoutMs: 1_000 });
    expect(warnings.filter((warning) => warning.includes('enableReadyCheck: false'))).toHaveLength(1);
    await worker.waitUntilReady();
    // The ready check fails while the cluster is down, and BullMQ's reconnect of the blocking
    // client never ends: the graceful close waits for it, then the forced close gives up on it.
    await takeClusterDownLongerThanABlockingRead();
    const closed = await Promise.race([worker.close().then(() => 'closed'), new Promise((resolve) => setTimeout(resolve, 60_000, 'still closing'))]);
    expect(closed).toBe('closed');
    // The caller's client may be shared: the worker disconnected only BullMQ's duplicate of it.
    expect(await handBuilt.ping()).toBe('PONG');
  });

  // Its waits, each with its own deadline and message, add up to more than the default timeout:
  // a slow step on a loaded machine then fails naming itself, not as a test timeout.
  it("failover: the queue's master is killed under a running worker; its replica takes over and jobs keep completing", { timeout: 240_000 }, async () => {
    await startClusterWorker();
    const producer = openProducer();
    const before = await cluster.shardOf(`${prefix}:${QUEUE}:wait`);
    for (let i = 0; i < 10; i++) await producer.enqueue({ name: 'charge', scope: 'shop', key: `f-${i}`, data: { value: i } });
    for (let i = 0; i < 10; i++) await waitForJobState(queue, jobIdFor('shop', `f-${i}`), ['completed'], 30_000);
    // The replica has every write so far, so this failover loses nothing acknowledged.
    await cluster.waitForReplicas(before.master, `${prefix}:sync-mark`);
    await cluster.kill(before.master);
    const after = await waitFor('the replica to take the slots', async () => {
      const shard = await cluster.shardOf(`${prefix}:${QUEUE}:wait`).catch(() => undefined);
      return shard && shard.master !== before.master ? shard : undefined;
    }, 30_000, 200);
    expect(after.master).toBe(before.replicas[0]);
    for (let i = 10; i < 20; i++) await producer.enqueue({ name: 'charge', scope: 'shop', key: `f-${i}`, data: { value: i } });
    for (let i = 0; i < 20; i++) await waitForJobState(queue, jobIdFor('shop', `f-${i}`), ['completed'], 60_000);
    for (let i = 0; i < 20; i++) expect(await effectsOf(env.db, env.schema, 'shop', `f-${i}`)).toHaveLength(1);
    // The old master comes back as a replica of the new one.
    await cluster.startNode(before.master);
    await cluster.waitUntilHealthy(60_000);
    expect((await cluster.nodes()).find((n) => n.port === before.master)?.role).toBe('replica');
  });
});
