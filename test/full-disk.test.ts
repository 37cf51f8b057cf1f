// @module-tag redis
/**
 * Postgres out of disk under a running worker: a private Postgres whose tables live on a small
 * filesystem (test/support/small-disk.ts; mounting needs root) fills up mid-run. Writes fail
 * with 53100 while reads work: the jobs are deferred, none fails; the worker's `/healthz` says
 * what is wrong (`postgres-writes`: the 53100 and "No space left on device") although
 * `select 1` still passes; once space is freed every job completes, each effect once, and the
 * check passes again.
 */
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { createPostgresDb } from '../src/index.js';
import { loadEnvConfig, startWorkerProcess, type WorkerProcess } from '../src/process/index.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { startPostgresOnSmallDisk, type PostgresOnSmallDisk } from './support/small-disk.js';
import { inCi, systemToolForTests } from './support/system-tools.js';
import { deleteKeysWithPrefix } from './support/test-env.js';
import { Redis } from 'ioredis';

const MKFS_EXT4 = systemToolForTests('mkfsExt4');
// Mounting needs root: outside CI a non-root run skips the file with one line, under CI=true it fails.
const ROOT = process.getuid?.() === 0;
if (!ROOT && inCi()) throw new Error('test/full-disk.test.ts fails under CI=true: mounting a filesystem needs root');
if (!ROOT) console.log('[tests] test/full-disk.test.ts skipped: mounting a filesystem needs root');

const QUEUE = 'disk';
const SCHEMA = 'full_disk';
const prefix = `ijtest-full-disk-${process.pid}`;

describe.skipIf(MKFS_EXT4 === undefined || !ROOT)('a full disk under a running worker', () => {
  let running: PostgresOnSmallDisk;
  let worker: WorkerProcess<any, any>;
  let queue: Queue;
  let db: ReturnType<typeof createPostgresDb>;

  beforeAll(async () => {
    running = await startPostgresOnSmallDisk({ sizeMb: 64, placement: 'data' });
    db = createPostgresDb({ connectionString: running.postgres.url, maxConnections: 2 }, () => {});
    worker = await startWorkerProcess({
      config: loadEnvConfig({
        DATABASE_URL: running.postgres.url,
        REDIS_URL: inject('redisUrl'),
        REDIS_PREFIX: prefix,
        SCHEMA,
        QUEUE,
        CONCURRENCY: '4',
        METRICS_PORT: '0',
        STORE_RETRY_MAX_MS: '500',
        SWEEPER_ENABLED: 'false',
        JANITOR_ENABLED: 'false',
      }),
      handler: async (ctx) =>
        ctx.transaction(async (tx) => {
          // About 2 KB a row: the ledger needs new pages every few jobs.
          await sql`insert into full_disk_ledger (key, pad) values (${ctx.key}, repeat('x', 2000))`.execute(tx);
          return { booked: ctx.key };
        }),
      logger: pino({ level: 'silent' }),
      handleSignals: false,
    });
    await sql`create table public.full_disk_ledger (id bigint generated always as identity primary key, key text not null, pad text not null)`.execute(db);
    await sql`alter table public.full_disk_ledger alter column pad set storage plain`.execute(db);
    queue = new Queue(QUEUE, { connection: { url: inject('redisUrl') }, prefix });
  }, 120_000);
  afterAll(async () => {
    await worker?.stop();
    await queue?.close();
    await db?.destroy();
    await running?.stop();
    const redis = new Redis(inject('redisUrl'));
    await deleteKeysWithPrefix(redis, prefix).finally(() => redis.disconnect());
  });

  const health = async () => {
    const response = await fetch(`http://127.0.0.1:${worker.metricsServer!.port}/healthz`);
    return { status: response.status, body: (await response.json()) as { checks: Record<string, unknown> } };
  };
  const ledgerCount = async () => Number((await sql<{ n: string }>`select count(*) as n from public.full_disk_ledger`.execute(db)).rows[0]!.n);

  it('defers the jobs while the disk is full, says so in /healthz, and completes them all once space is freed', async () => {
    const first = await queue.add('book', { idempotencyKey: 'before', payload: {} });
    expect((await waitForJobState(queue, first.id!, ['completed', 'failed'])).state).toBe('completed');
    expect((await health()).status).toBe(200);

    expect(running.disk.fill()).toBeGreaterThan(0);
    const jobs = await Promise.all(Array.from({ length: 40 }, (_, i) => queue.add('book', { idempotencyKey: `full-${i}`, payload: {} })));
    const unhealthy = await waitFor('the health check to say the disk is full', async () => {
      const answer = await health();
      return answer.status === 503 ? answer : undefined;
    }, 60_000);
    expect(JSON.stringify(unhealthy.body.checks['postgres-writes'])).toMatch(/53100 .*No space left on device/);
    // Reads still work: the plain check passes.
    expect(JSON.stringify(unhealthy.body.checks.postgres)).not.toMatch(/No space/);
    expect(await queue.getJobCounts('failed')).toEqual({ failed: 0 });
    expect(await ledgerCount()).toBeLessThan(41);

    running.disk.free();
    for (const job of jobs) expect((await waitForJobState(queue, job.id!, ['completed', 'failed'], 120_000)).state).toBe('completed');
    expect(await ledgerCount()).toBe(41);
    expect(await queue.getJobCounts('failed')).toEqual({ failed: 0 });
    // The next jobs through clear the check.
    const after = await queue.add('book', { idempotencyKey: 'after', payload: {} });
    expect((await waitForJobState(queue, after.id!, ['completed', 'failed'])).state).toBe('completed');
    expect((await health()).status).toBe(200);
  }, 240_000);
});
