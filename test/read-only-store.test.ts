// @module-tag redis
/**
 * A process never claims on a server that takes no writes. At start — worker, HTTP server,
 * outbox relay, maintenance (janitor + sweeper) — a `DATABASE_URL` that reaches a standby (the
 * private Patroni cluster's replica port, a reader endpoint) or a database whose
 * `default_transaction_read_only` is on (a role of this file's own on the shared Postgres) is
 * refused with a `ReadOnlyStoreError` naming the variable and the fix, whether or not the
 * process migrates: a read-only setting at once, a standby once `STARTUP_WAIT_MS` has passed
 * (during a failover a URL may reach the demoted primary for a few seconds). At run time, when a switchover demotes the server under a worker's URL,
 * the same 25006 is a transient fault: the job is deferred, the pool replaces its connections,
 * and once the server takes writes again the job completes; nothing failed. A primary that
 * acknowledges commits without a synchronous standby while a standby streams from it is warned
 * about at start.
 */
import { randomBytes } from 'node:crypto';
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino, type Logger } from 'pino';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { ConfigError, ReadOnlyStoreError } from '../src/index.js';
import { loadEnvConfig, loadHttpEnvConfig, startHttpServerProcess, startMaintenanceProcess, startOutboxRelayProcess, startWorkerProcess } from '../src/process/index.js';
import { acknowledgesWithoutStandby } from '../src/runtime/writable-store.js';
import { PatroniCluster } from './support/patroni-cluster.js';
import { waitForJobState } from './support/queue-helpers.js';
import { systemToolForTests } from './support/system-tools.js';
import { createTestEnv, deleteKeysWithPrefix, type TestEnv } from './support/test-env.js';

const silent = pino({ level: 'silent' });

/** A logger that keeps its warnings, each a JSON line (the message and the error's description in it). */
function recordingLogger(): { logger: Logger; warnings: string[] } {
  const warnings: string[] = [];
  const logger = pino({ level: 'warn' }, { write: (line: string) => void warnings.push(line) });
  return { logger, warnings };
}

/** The rejection of `start`, or a failure saying that it started. */
async function refusal(start: () => Promise<{ stop(): Promise<void> }>): Promise<unknown> {
  let started: { stop(): Promise<void> } | undefined;
  try {
    started = await start();
  } catch (error) {
    return error;
  }
  await started.stop();
  throw new Error('the process started on a server that takes no writes');
}

describe('start-up on a database whose default_transaction_read_only is on', () => {
  let env: TestEnv;
  let readOnlyUrl: string;
  const role = `ij_read_only_${randomBytes(4).toString('hex')}`;

  beforeAll(async () => {
    env = await createTestEnv('read-only-store');
    await sql`create role ${sql.id(role)} login`.execute(env.db);
    await sql`alter role ${sql.id(role)} set default_transaction_read_only = on`.execute(env.db);
    await sql`grant usage on schema ${sql.id(env.schema)} to ${sql.id(role)}`.execute(env.db);
    await sql`grant all on all tables in schema ${sql.id(env.schema)} to ${sql.id(role)}`.execute(env.db);
    const url = new URL(env.databaseDirectUrl);
    url.username = role;
    url.password = '';
    readOnlyUrl = url.toString();
  });
  afterAll(async () => {
    await sql`drop owned by ${sql.id(role)}`.execute(env.db);
    await sql`drop role if exists ${sql.id(role)}`.execute(env.db);
    await env?.teardown();
  });

  const common = () => ({
    DATABASE_URL: readOnlyUrl,
    DATABASE_DIRECT_URL: readOnlyUrl,
    REDIS_URL: env.redisUrl,
    REDIS_PREFIX: env.redisPrefix,
    SCHEMA: env.schema,
    // Were the refusal a fault to wait out, the start would give up after this with another error.
    STARTUP_WAIT_MS: '3000',
  });

  function expectReadOnlySetting(error: unknown) {
    expect(error).toBeInstanceOf(ReadOnlyStoreError);
    expect(error).toBeInstanceOf(ConfigError);
    expect(error).toMatchObject({ code: 'CONFIG_INVALID', inRecovery: false });
    expect((error as Error).message).toMatch(/default_transaction_read_only is on/);
    expect((error as Error).message).toMatch(/Point DATABASE_(DIRECT_)?URL at a server that takes writes/);
  }

  it.each(['true', 'false'])('a worker (MIGRATE=%s) is refused with a ReadOnlyStoreError naming DATABASE_URL', async (migrate) => {
    const error = await refusal(() =>
      startWorkerProcess({
        config: loadEnvConfig({ ...common(), MIGRATE: migrate, QUEUE: 'read-only', SWEEPER_ENABLED: 'false', JANITOR_ENABLED: 'false' }),
        handler: async () => 'ran',
        logger: silent,
        handleSignals: false,
      }),
    );
    expectReadOnlySetting(error);
    expect((error as ReadOnlyStoreError).variable).toBe('DATABASE_URL');
  });

  it('the HTTP server is refused', async () => {
    const error = await refusal(() =>
      startHttpServerProcess({ config: loadHttpEnvConfig({ ...common(), MIGRATE: 'false', HTTP_PORT: '0', HTTP_QUEUES: 'read-only' }), handleSignals: false, logger: silent }),
    );
    expectReadOnlySetting(error);
  });

  it('the outbox relay is refused', async () => {
    expectReadOnlySetting(await refusal(() => startOutboxRelayProcess({ config: loadEnvConfig({ ...common(), MIGRATE: 'false' }), handleSignals: false, logger: silent })));
  });

  it('the maintenance process (janitor and sweeper) is refused', async () => {
    expectReadOnlySetting(await refusal(() => startMaintenanceProcess({ config: loadEnvConfig({ ...common(), MIGRATE: 'true' }), handleSignals: false, logger: silent })));
  });
});

describe('acknowledgesWithoutStandby', () => {
  const role = { inRecovery: false, transactionReadOnly: false, defaultTransactionReadOnly: false, synchronousCommit: 'on' } as const;
  it('is true only when a standby streams and a commit need not wait for one', () => {
    expect(acknowledgesWithoutStandby({ ...role, replicas: 1, synchronousStandbyNames: '' })).toBe(true);
    expect(acknowledgesWithoutStandby({ ...role, replicas: 2, synchronousStandbyNames: 'ANY 1 (*)', synchronousCommit: 'local' })).toBe(true);
    expect(acknowledgesWithoutStandby({ ...role, replicas: 1, synchronousStandbyNames: 'ANY 1 (*)', synchronousCommit: 'off' })).toBe(true);
    expect(acknowledgesWithoutStandby({ ...role, replicas: 1, synchronousStandbyNames: '"pg2"' })).toBe(false);
    expect(acknowledgesWithoutStandby({ ...role, replicas: 1, synchronousStandbyNames: '"pg2"', synchronousCommit: 'remote_apply' })).toBe(false);
    expect(acknowledgesWithoutStandby({ ...role, replicas: 0, synchronousStandbyNames: '' })).toBe(false);
  });
});

const programs = [systemToolForTests('patroni'), systemToolForTests('etcd'), systemToolForTests('haproxy')];

describe.skipIf(programs.includes(undefined))('a Patroni cluster (asynchronous replication): the replica, a demoted primary', () => {
  let cluster: PatroniCluster;
  let redisUrl: string;
  const prefix = `ijtest-read-only-patroni-${randomBytes(4).toString('hex')}`;
  const schema = `t_read_only_patroni`;

  beforeAll(async () => {
    redisUrl = inject('redisUrl');
    cluster = await PatroniCluster.start({ synchronous: false });
  }, PatroniCluster.START_HOOK_TIMEOUT_MS);
  afterAll(async () => {
    await cluster?.stop();
    const redis = new Redis(redisUrl);
    await deleteKeysWithPrefix(redis, prefix).finally(() => redis.disconnect());
  });

  const workerConfig = (url: string, extra: Record<string, string> = {}) =>
    loadEnvConfig({ DATABASE_URL: url, REDIS_URL: redisUrl, REDIS_PREFIX: prefix, SCHEMA: schema, QUEUE: 'demoted', STARTUP_WAIT_MS: '3000', SWEEPER_ENABLED: 'false', ...extra });

  it('a worker on the replica port (a reader endpoint) waits, as during a failover, then is refused: the server is in recovery', async () => {
    const { logger, warnings } = recordingLogger();
    const error = await refusal(() => startWorkerProcess({ config: workerConfig(cluster.replicaUrl), handler: async () => 'ran', logger, handleSignals: false }));
    // Each try said why it waits: the server is a standby.
    expect(warnings.map((line) => JSON.parse(line)).some((line) => /not reachable yet/.test(line.msg) && /standby in recovery/.test(line.error))).toBe(true);
    expect(error).toBeInstanceOf(ReadOnlyStoreError);
    expect(error).toMatchObject({ inRecovery: true, variable: 'DATABASE_URL' });
    expect((error as Error).message).toMatch(/standby in recovery.*Point DATABASE_URL at the primary/);
  });

  it('a worker on the leader is warned that commits are acknowledged without a synchronous standby', async () => {
    const { logger, warnings } = recordingLogger();
    const worker = await startWorkerProcess({ config: workerConfig(cluster.url), handler: async () => 'ran', logger, handleSignals: false });
    await worker.stop();
    expect(warnings.some((line) => /acknowledges commits before any standby has them, while 1 standby\(s\) stream from it/.test(line))).toBe(true);
  });

  it('a switchover demotes the server under a worker\'s URL: its job is deferred, not failed, and completes once that server leads again', async () => {
    const leader = (await cluster.leader())!;
    const worker = await startWorkerProcess({
      config: workerConfig(cluster.memberUrl(leader), { CONCURRENCY: '1', STORE_RETRY_MAX_MS: '500', DEFER_MAX_MS: '1000' }),
      handler: async (ctx) => ({ key: ctx.key }),
      logger: silent,
      handleSignals: false,
    });
    const queue = new Queue('demoted', { connection: { url: redisUrl }, prefix });
    try {
      const before = await queue.add('charge', { idempotencyKey: 'before', payload: {} });
      expect((await waitForJobState(queue, before.id!, ['completed', 'failed'])).state).toBe('completed');
      await cluster.switchover();
      await cluster.waitForHealthy();
      const during = await queue.add('charge', { idempotencyKey: 'during', payload: {} });
      // The worker's URL now reaches a standby: every claim there answers 25006.
      await new Promise((resolve) => setTimeout(resolve, 3_000));
      expect(['waiting', 'delayed', 'active']).toContain(await queue.getJobState(during.id!));
      await cluster.switchover(leader);
      await cluster.waitForHealthy();
      const done = await waitForJobState(queue, during.id!, ['completed', 'failed'], 60_000);
      expect(done.state).toBe('completed');
      expect(done.job.failedReason).toBeFalsy();
    } finally {
      await queue.close();
      await worker.stop();
    }
  }, 120_000);
});
