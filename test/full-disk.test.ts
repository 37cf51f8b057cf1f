// @module-tag redis
/**
 * Postgres out of disk under a running worker: a private Postgres whose tables live on a small
 * filesystem (test/support/small-disk.ts; mounting needs root) fills up mid-run. Writes fail
 * with 53100 while reads work: the jobs are deferred, none fails; the worker's `/healthz` says
 * what is wrong (`postgres-writes`: the 53100 and "No space left on device") although
 * `select 1` still passes; once space is freed every job completes, each effect once, and the
 * check passes again.
 *
 * Jobs whose claims committed just before the disk filled meet it at their effect's write: each
 * is deferred without using an attempt, and its key is given back at once, although the full
 * release (a new row version and index entries) no longer fits: a redelivery takes the key over
 * as soon as there is room, instead of waiting out the lease.
 */
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { IdempotencyKeys, KeyedJobRunner, createPostgresDb, identityFromWireContract, migrate, resolveWorkerTiming, toWireJobData, type JobIdentity, type RunOutcome } from '../src/index.js';
import { loadEnvConfig, startWorkerProcess, type WorkerProcess } from '../src/process/index.js';
import { createGate } from './support/protocol-fixtures.js';
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

describe.skipIf(MKFS_EXT4 === undefined || !ROOT)('jobs claimed just before the disk filled', () => {
  const schema = 'claimed_before_full';
  let running: PostgresOnSmallDisk;
  let db: ReturnType<typeof createPostgresDb>;

  beforeAll(async () => {
    running = await startPostgresOnSmallDisk({ sizeMb: 64, placement: 'data' });
    db = createPostgresDb({ connectionString: running.postgres.url, maxConnections: 12 }, () => {});
    await migrate(db, { schema });
    await sql`create table ${sql.id(schema, 'ledger')} (id bigint generated always as identity primary key, key text not null, pad text not null)`.execute(db);
    await sql`alter table ${sql.id(schema, 'ledger')} alter column pad set storage plain`.execute(db);
  }, 120_000);
  afterAll(async () => {
    await db?.destroy();
    await running?.stop();
  });

  interface Message {
    readonly id: string;
    readonly data: unknown;
  }
  const JOBS = 40;
  // Far longer than the test: a key left to its lease would still be held when its job comes back.
  const LEASE_MS = 600_000;

  it('defers them without using an attempt and gives their keys back at once; their redeliveries run as soon as there is room', async () => {
    const keys = new IdempotencyKeys({ db, schema, leaseMs: LEASE_MS, groupCommit: false });
    const gate = createGate();
    const runner = new KeyedJobRunner<unknown, unknown, Message>({
      keys,
      timing: resolveWorkerTiming({ storeRetryMinMs: 10, storeRetryMaxMs: 100 }, LEASE_MS),
      identityOf: (message) => identityFromWireContract({ id: message.id, name: 'book', data: message.data }) as JobIdentity<unknown>,
      handler: async (ctx) => {
        await gate.wait;
        return ctx.transaction(async (tx) => {
          await sql`insert into ${sql.id(schema, 'ledger')} (key, pad) values (${ctx.key}, repeat('x', 2000))`.execute(tx);
          return { booked: ctx.key };
        });
      },
      logger: pino({ level: 'silent' }),
    });
    const deliver = (n: number) => {
      const id = String(n);
      return { message: { id, data: toWireJobData('disk', `job-${n}`, { n }) }, id, label: `Job ${id}`, queue: 'q', name: 'book', lastAttempt: true, deferrals: 0 };
    };
    const heldKeys = async () =>
      (await sql<{ key: string; owner: string | null }>`select key, owner from ${sql.id(schema, 'idempotency_keys')} where scope = 'disk' order by key`.execute(db)).rows;

    const firstRuns = Array.from({ length: JOBS }, (_, n) => runner.run(deliver(n)));
    await waitFor('every job to have claimed its key', async () => (await heldKeys()).filter((k) => k.owner !== null).length === JOBS);

    // The disk fills, and other claims take what room the keys table had left.
    expect(running.disk.fill()).toBeGreaterThan(0);
    const filler = new IdempotencyKeys({ db, schema, leaseMs: LEASE_MS });
    for (let n = 0; ; n++) {
      const refused = await filler.claim('filler', `filler-${n}`, 'f').then(() => undefined, (error: unknown) => error);
      if (refused) {
        expect(JSON.stringify((refused as Error).cause ?? refused)).toMatch(/53100/);
        break;
      }
    }

    // Each effect's first write meets the full disk.
    gate.open();
    const outcomes: RunOutcome[] = await Promise.all(firstRuns);
    expect(outcomes.map((o) => o.kind)).toEqual(Array(JOBS).fill('store-unavailable'));
    // No key is left to its lease: each is given back, although the disk is still full (the
    // releases that found no room while all of them wrote at once go through when tried again).
    await waitFor('every key to be given back', async () => (await heldKeys()).every((k) => k.owner === null), 60_000);

    running.disk.free();
    // Each redelivery takes its key over and runs at once (a key still held would defer it for the lease).
    const again = await Promise.all(Array.from({ length: JOBS }, (_, n) => runner.run(deliver(n))));
    expect(again.map((o) => o.kind)).toEqual(Array(JOBS).fill('completed'));
    const { rows } = await sql<{ n: string }>`select count(*) as n from ${sql.id(schema, 'ledger')}`.execute(db);
    expect(Number(rows[0]!.n)).toBe(JOBS);
  }, 180_000);
});
