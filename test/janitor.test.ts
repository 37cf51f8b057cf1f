// @module-tag redis
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { sql, type Kysely } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { ValidationError } from '../src/index.js';
import { Janitor, Maintenance } from '../src/process/index.js';
import { retryHorizonMs } from '../src/ops/maintenance-options.js';
import { withMaintenanceLock } from '../src/store/maintenance-lock.js';
import { sleep, waitFor } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
const silent = pino({ level: 'silent' });

beforeAll(async () => {
  env = await createTestEnv('janitor');
});
afterAll(async () => {
  await env?.teardown();
});
beforeEach(async () => {
  // cascade: the keys' step records (job_steps) go too.
  await sql`truncate ${sql.id(env.schema, 'idempotency_keys')}, ${sql.id(env.schema, 'outbox')} cascade`.execute(env.db);
});

const keysTable = () => sql.id(env.schema, 'idempotency_keys');

/** Inserts `count` keys named `<prefix>-<n>` in one statement. */
async function insertKeys(
  prefix: string,
  count: number,
  row: { status: 'processing' | 'completed' | 'failed'; expiresIn: string | null; lockedIn?: string },
): Promise<void> {
  const expires = row.expiresIn === null ? sql`null::timestamptz` : sql`now() + ${row.expiresIn}::interval`;
  const locked = row.lockedIn ? sql`now() + ${row.lockedIn}::interval` : sql`null::timestamptz`;
  const completedAt = row.status === 'processing' ? sql`null::timestamptz` : sql`now() - interval '2 days'`;
  await sql`
    insert into ${keysTable()} (scope, key, fingerprint, status, owner, locked_until, completed_at, expires_at)
    select 'janitor', ${prefix} || '-' || n, 'fp', ${row.status},
           case when ${row.status} = 'processing' then gen_random_uuid() end, ${locked}, ${completedAt}, ${expires}
      from generate_series(1, ${count}) as n`.execute(env.db);
}

async function remainingKeys(): Promise<Set<string>> {
  const { rows } = await sql<{ key: string }>`select key from ${keysTable()}`.execute(env.db);
  return new Set(rows.map((r) => r.key));
}

describe('Janitor', () => {
  it('deletes each expired row exactly once across concurrent instances, skips locked rows, and never deletes a live key', async () => {
    await insertKeys('expired-completed', 1500, { status: 'completed', expiresIn: '-1 hour' });
    await insertKeys('expired-failed', 700, { status: 'failed', expiresIn: '-1 second' });
    await insertKeys('live-completed', 400, { status: 'completed', expiresIn: '1 hour' });
    await insertKeys('live-failed', 200, { status: 'failed', expiresIn: '1 hour' });
    await insertKeys('live-processing', 200, { status: 'processing', expiresIn: null, lockedIn: '30 seconds' });
    await insertKeys('lease-expired-processing', 100, { status: 'processing', expiresIn: null, lockedIn: '-1 hour' });
    // Not a state the protocol produces; a processing key is live whatever its expires_at says.
    await insertKeys('processing-with-old-expiry', 100, { status: 'processing', expiresIn: '-1 hour', lockedIn: '-1 hour' });
    const live = [...(await remainingKeys())].filter((k) => !k.startsWith('expired-'));
    const expiredCount = 2200;
    // Step records of multi-step jobs are deleted with their key (foreign key, on delete cascade).
    await sql`insert into ${sql.id(env.schema, 'job_steps')} (scope, key, name, position, fence)
              values ('janitor', 'expired-completed-1', 'charge', 1, 1), ('janitor', 'expired-failed-7', 'charge', 1, 1),
                     ('janitor', 'live-completed-1', 'charge', 1, 1), ('janitor', 'live-processing-1', 'charge', 1, 1)`.execute(env.db);

    // A transaction holds 20 expired rows locked while the janitors run: they must skip them, not wait.
    let releaseHolder!: () => void;
    const holderGate = new Promise<void>((resolve) => (releaseHolder = resolve));
    let holderLocked!: () => void;
    const holderReady = new Promise<void>((resolve) => (holderLocked = resolve));
    const holder = env.db.transaction().execute(async (tx) => {
      await sql`select 1 from ${keysTable()} where key like 'expired-completed-%' order by key limit 20 for update`.execute(tx);
      holderLocked();
      await holderGate;
    });
    await holderReady;

    const pools = Array.from({ length: 4 }, () => env.openDb(2));
    // Connected up front, so that all four start deleting at the same moment.
    await Promise.all(pools.map((pool) => sql`select 1`.execute(pool)));
    const janitors = pools.map(
      (pool) => new Janitor({ db: pool, schema: env.schema, batchSize: 25, maxBatchesPerRun: 1_000, logger: silent }),
    );
    const reports = await Promise.all(janitors.map((janitor) => janitor.runOnce()));
    const firstRound = reports.reduce((sum, r) => sum + r.keysDeleted, 0);
    expect(firstRound).toBe(expiredCount - 20);
    // More than one instance did real work, i.e. they ran side by side.
    expect(reports.filter((r) => r.keysDeleted > 0).length).toBeGreaterThan(1);

    releaseHolder();
    await holder;
    const again = await Promise.all(janitors.map((janitor) => janitor.runOnce()));
    expect(again.reduce((sum, r) => sum + r.keysDeleted, 0)).toBe(20);

    const remaining = await remainingKeys();
    expect([...remaining].filter((k) => k.startsWith('expired-'))).toEqual([]);
    expect([...remaining].sort()).toEqual(live.sort());
    const { rows: steps } = await sql<{ key: string }>`select key from ${sql.id(env.schema, 'job_steps')} order by key`.execute(env.db);
    expect(steps.map((s) => s.key)).toEqual(['live-completed-1', 'live-processing-1']);
  });

  it('deletes a released key whose expiry passed (a request key nobody retried), leaving no tombstone; never a key with an owner, whatever its lease and expiry', async () => {
    const row = (key: string, owner: 'none' | 'some', lockedIn: string, expiresIn: string | null) =>
      sql`insert into ${keysTable()} (scope, key, fingerprint, status, owner, locked_until, expires_at)
          values ('request:orders:acme', ${key}, 'fp', 'processing', ${owner === 'some' ? sql`gen_random_uuid()` : sql`null`},
                  now() + ${lockedIn}::interval, ${expiresIn === null ? sql`null` : sql`now() + ${expiresIn}::interval`})`.execute(env.db);
    await row('released-expired', 'none', '-1 hour', '-1 minute');
    await row('released-on-full-disk-expired', 'none', '1 minute', '-1 minute');
    await row('released-not-yet-expired', 'none', '-1 hour', '1 hour');
    // A job's released key has no expiry: its queue retries it.
    await row('released-without-expiry', 'none', '-1 hour', null);
    // Held by its claim's token, live lease or not (a stalled owner may still complete it): never deleted.
    await row('held-expired', 'some', '1 minute', '-1 minute');
    await row('lease-ended-expired', 'some', '-1 hour', '-1 minute');
    await insertKeys('expired-completed', 1, { status: 'completed', expiresIn: '-1 minute' });
    const report = await new Janitor({ db: env.db, schema: env.schema, tombstoneMs: 3 * 86_400_000, batchSize: 2, logger: silent }).runOnce();
    expect(report.keysDeleted).toBe(3);
    expect([...(await remainingKeys())].sort()).toEqual(['held-expired', 'lease-ended-expired', 'released-not-yet-expired', 'released-without-expiry']);
    // Only the finished key leaves a tombstone: a released one never answered, so nothing of it is to be refused.
    const { rows } = await sql<{ scope: string; key_hash: Buffer }>`
      select scope, key_hash from ${sql.id(env.schema, 'key_tombstones')} where scope in ('janitor', 'request:orders:acme')`.execute(env.db);
    expect(rows.map((r) => [r.scope, r.key_hash.toString('hex')])).toEqual([['janitor', createHash('sha256').update('expired-completed-1').digest('hex')]]);
    await sql`delete from ${sql.id(env.schema, 'key_tombstones')} where scope = 'janitor'`.execute(env.db);
  });

  it('bounds one run by maxBatchesPerRun and reports that more is left', async () => {
    await insertKeys('expired', 30, { status: 'completed', expiresIn: '-1 minute' });
    const janitor = new Janitor({ db: env.db, schema: env.schema, batchSize: 10, maxBatchesPerRun: 2, logger: silent });
    const deletedPerRun: number[] = [];
    for (let more = true; more && deletedPerRun.length < 50; ) {
      const report = await janitor.runOnce();
      deletedPerRun.push(report.keysDeleted);
      more = report.more;
    }
    expect(deletedPerRun.reduce((a, b) => a + b, 0)).toBe(30);
    expect(Math.max(...deletedPerRun)).toBeLessThanOrEqual(20);
    // A plain table: two full batches, then the rest. A partitioned one (TEST_KEYS_PARTITIONS)
    // spends a batch per partition, sharing the same budget of two per run.
    if (env.keysPartitions === 0) expect(deletedPerRun).toEqual([20, 10]);
    else expect(deletedPerRun.length).toBeGreaterThan(2);
  });

  it("deletes the records of a key's concurrency key once older than the retention, unless the key is still processing", async () => {
    const limits = sql.id(env.schema, 'key_concurrency_limits');
    const keysTable = sql.id(env.schema, 'idempotency_keys');
    await sql`insert into ${keysTable} (scope, key, fingerprint, status, locked_until) values ('cl', 'running', 'f', 'processing', now() - interval '3 hours')`.execute(env.db);
    await sql`
      insert into ${limits} (scope, key, group_key, concurrency_limit, recorded_at)
      values ('cl', 'running', 'tenant:a', 2, now() - interval '3 hours'),
             ('cl', 'finished-long-ago', 'tenant:a', 2, now() - interval '3 hours'),
             ('cl', 'recent', 'tenant:a', 2, now())`.execute(env.db);
    const janitor = new Janitor({ db: env.db, schema: env.schema, retentionMs: 3_600_000, batchSize: 7, logger: silent });
    expect((await janitor.runOnce()).concurrencyRecordsDeleted).toBe(1);
    const { rows } = await sql<{ key: string }>`select key from ${limits} where scope = 'cl' order by key`.execute(env.db);
    expect(rows.map((r) => r.key)).toEqual(['recent', 'running']);
    await sql`delete from ${keysTable} where scope = 'cl'`.execute(env.db);
  });

  it('purges sent outbox rows older than the retention, and keeps recent and unsent ones', async () => {
    const outbox = sql.id(env.schema, 'outbox');
    await sql`
      insert into ${outbox} (queue, job_name, job_id, data, created_at, sent_at)
      select 'q', 'old-sent', 'old-' || n, '{}'::jsonb, now() - interval '3 hours', now() - interval '2 hours' from generate_series(1, 30) n
      union all
      select 'q', 'recent-sent', 'recent-' || n, '{}'::jsonb, now(), now() - interval '1 minute' from generate_series(1, 5) n
      union all
      select 'q', 'old-unsent', 'unsent-' || n, '{}'::jsonb, now() - interval '3 hours', null from generate_series(1, 5) n`.execute(env.db);
    const janitor = new Janitor({ db: env.db, schema: env.schema, retentionMs: 3_600_000, batchSize: 7, logger: silent });
    const report = await janitor.runOnce();
    expect(report.outboxRowsDeleted).toBe(30);
    const { rows } = await sql<{ job_name: string; n: string }>`
      select job_name, count(*) as n from ${outbox} group by job_name order by job_name`.execute(env.db);
    expect(rows.map((r) => [r.job_name, Number(r.n)])).toEqual([
      ['old-unsent', 5],
      ['recent-sent', 5],
    ]);
  });

  it('warns when a queue retry horizon exceeds the retention', () => {
    const warnings: string[] = [];
    const logger = pino({ level: 'warn' }, { write: (line: string) => warnings.push(JSON.parse(line).msg) });
    const janitor = new Janitor({
      db: env.db,
      schema: env.schema,
      retentionMs: 60_000,
      retryPolicies: {
        payments: { attempts: 10, backoff: { type: 'exponential', delayMs: 1_000 } },
        emails: { attempts: 5, backoff: { type: 'fixed', delayMs: 10_000 } },
      },
      logger,
    });
    const found = janitor.checkRetention();
    expect(found.map((w) => [w.queue, w.retryHorizonMs])).toEqual([['payments', 511_000]]);
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(/Queue "payments".*511000 ms.*retention of 60000 ms/);
  });

  it('computes retry horizons for fixed and exponential backoff', () => {
    expect(retryHorizonMs({})).toBe(0);
    expect(retryHorizonMs({ attempts: 3 })).toBe(0);
    expect(retryHorizonMs({ attempts: 4, backoff: { type: 'fixed', delayMs: 500 } })).toBe(1_500);
    expect(retryHorizonMs({ attempts: 4, backoff: { type: 'exponential', delayMs: 500 } })).toBe(3_500);
  });

  it('refuses invalid options with the option named', () => {
    expect(() => new Janitor({ db: env.db, batchSize: 0 })).toThrow(ValidationError);
    expect(() => new Janitor({ db: env.db, batchSize: 0 })).toThrow(/batchSize/);
    expect(() => new Janitor({ db: env.db, schema: 'Bad-Schema' })).toThrow(/schema/);
  });
});

describe('Maintenance', () => {
  it('runs the janitor only while no other process holds its advisory lock', async () => {
    await insertKeys('expired', 5, { status: 'completed', expiresIn: '-1 minute' });
    const maintenance = new Maintenance({
      db: env.openDb(2),
      schema: env.schema,
      janitor: new Janitor({ db: env.db, schema: env.schema, logger: silent }),
      logger: silent,
    });
    const other: Kysely<any> = env.openDb(1);
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let held!: () => void;
    const holding = new Promise<void>((resolve) => (held = resolve));
    const holder = withMaintenanceLock(other, env.schema, 'janitor', async () => {
      held();
      await gate;
    });
    await holding;
    expect(await maintenance.runJanitor()).toEqual({ ran: false });
    expect((await remainingKeys()).size).toBe(5);
    // Another task's lock, or the same task in another schema, does not contend.
    expect((await maintenance.refreshStats()).ran).toBe(true);
    release();
    expect(await holder).toEqual({ ran: true, result: undefined });
    expect(await maintenance.runJanitor()).toEqual({ ran: true, result: { keysDeleted: 5, tombstonesDeleted: 0, outboxRowsDeleted: 0, concurrencyRecordsDeleted: 0, concurrencySlotsDeleted: 0, coalescingKeysDeleted: 0, coalescingArrivalsDeleted: 0, more: false } });
  });

  it('runs the janitor periodically once started, emits its reports, and stops cleanly', async () => {
    const janitor = new Janitor({ db: env.db, schema: env.schema, logger: silent });
    const maintenance = new Maintenance({ db: env.db, schema: env.schema, janitor, janitorIntervalMs: 100, statsIntervalMs: 0, logger: silent });
    let deleted = 0;
    maintenance.on('janitor', (report) => (deleted += report.keysDeleted));
    maintenance.start();
    try {
      await insertKeys('expired', 12, { status: 'failed', expiresIn: '-1 minute' });
      await waitFor('the janitor to delete 12 keys', async () => deleted === 12);
      expect((await remainingKeys()).size).toBe(0);
    } finally {
      await maintenance.stop();
    }
  });

  it('reports statistics: counts by status, expired leases and keys, the oldest processing key', async () => {
    await insertKeys('done', 3, { status: 'completed', expiresIn: '1 hour' });
    await insertKeys('gone', 2, { status: 'completed', expiresIn: '-1 hour' });
    await insertKeys('bad', 1, { status: 'failed', expiresIn: '1 hour' });
    await insertKeys('stuck', 2, { status: 'processing', expiresIn: null, lockedIn: '-5 minutes' });
    await insertKeys('busy', 1, { status: 'processing', expiresIn: null, lockedIn: '5 minutes' });
    await sql`update ${keysTable()} set created_at = now() - interval '1 day' where key = 'stuck-2'`.execute(env.db);
    const maintenance = new Maintenance({ db: env.db, schema: env.schema, logger: silent });
    const run = await maintenance.refreshStats();
    expect(run.ran && run.result).toMatchObject({
      processing: 3,
      completed: 5,
      failed: 1,
      expiredLeases: 2,
      expiredKeys: 2,
      oldestProcessing: { scope: 'janitor', key: 'stuck-2' },
      outboxUnsent: 0,
      oldestUnsentAgeMs: null,
    });
    expect(run.ran && run.result.oldestProcessing!.ageMs).toBeGreaterThanOrEqual(86_400_000);
  });
});

describe('standalone maintenance process (workers/janitor.ts)', () => {
  it('deletes expired keys on its interval, serves /healthz, and exits 0 on SIGTERM', async () => {
    await insertKeys('expired', 7, { status: 'completed', expiresIn: '-1 minute' });
    await insertKeys('live', 3, { status: 'completed', expiresIn: '1 hour' });
    const { child, exited, lines } = startMaintenanceProcess({ DATABASE_URL: env.databaseUrl, METRICS_PORT: '0' });
    try {
      const ready = await waitFor('the maintenance process to be ready', async () => lines.find((l) => l.msg === 'maintenance ready'), 30_000);
      expect(ready).toMatchObject({ janitor: true, sweeper: true });
      await waitFor('expired keys to be deleted', async () => (await remainingKeys()).size === 3);
      expect([...(await remainingKeys())].sort()).toEqual(['live-1', 'live-2', 'live-3']);
      const health = await fetch(`http://127.0.0.1:${ready.metricsPort as number}/healthz`);
      expect(await health.json()).toEqual({ status: 'ok', checks: { postgres: { ok: true } } });
      child.kill('SIGTERM');
      const [code] = await exited;
      expect(code).toBe(0);
    } finally {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGKILL');
        await exited;
      }
    }
  });

  it('survives Postgres going away mid-run and coming back: each failed run is logged, the next period runs normally', async () => {
    const proxy = await startTcpProxy(new URL(env.databaseUrl));
    const url = new URL(env.databaseUrl);
    url.host = `127.0.0.1:${proxy.port}`;
    const { child, exited, lines } = startMaintenanceProcess({ DATABASE_URL: url.toString(), SWEEPER_QUEUES: '*' });
    try {
      await waitFor('the maintenance process to be ready', async () => lines.some((l) => l.msg === 'maintenance ready'), 30_000);
      await insertKeys('first', 2, { status: 'completed', expiresIn: '-1 minute' });
      await waitFor('the first expired keys to be deleted', async () => (await remainingKeys()).size === 0);

      // Postgres goes away: connections cut, new ones refused.
      await proxy.close();
      const closedAt = lines.length;
      await waitFor('janitor and sweeper runs to fail and be logged', async () => {
        const failed = lines.slice(closedAt).filter(isFailedRun);
        return failed.some((l) => l.task === 'janitor') && failed.some((l) => l.task === 'sweeper');
      });
      // Still running, although the outage closed every connection it had.
      await sleep(500);
      expect(child.exitCode).toBeNull();

      // It comes back: the next periods run normally.
      await insertKeys('second', 3, { status: 'failed', expiresIn: '-1 minute' });
      await proxy.open();
      await waitFor('the second expired keys to be deleted', async () => (await remainingKeys()).size === 0);
      const recovered = lines.length;
      await insertKeys('third', 1, { status: 'failed', expiresIn: '-1 minute' });
      await waitFor('the third expired key to be deleted', async () => (await remainingKeys()).size === 0);
      expect(lines.slice(recovered).filter(isFailedRun)).toEqual([]);
      expect(child.exitCode).toBeNull();
      child.kill('SIGTERM');
      const [code] = await exited;
      expect(code).toBe(0);
    } finally {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGKILL');
        await exited;
      }
      await proxy.close();
    }
  });
});

/**
 * The standalone maintenance process (`workers/janitor.ts`) on this file's schema, janitor and
 * sweeper every 100 ms, logging JSON lines at info; `overrides` adds or replaces variables.
 */
function startMaintenanceProcess(overrides: Record<string, string>) {
  const script = fileURLToPath(new URL('../workers/janitor.ts', import.meta.url));
  const child = spawn(process.execPath, ['--import', 'tsx', script], {
    env: {
      ...process.env,
      REDIS_URL: env.redisUrl,
      REDIS_PREFIX: env.redisPrefix,
      SCHEMA: env.schema,
      MIGRATE: 'false',
      JANITOR_INTERVAL_MS: '100',
      SWEEPER_INTERVAL_MS: '100',
      LOG_LEVEL: 'info',
      ...overrides,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const exited = once(child, 'exit');
  const lines: Array<Record<string, unknown>> = [];
  createInterface({ input: child.stdout! }).on('line', (line) => lines.push(JSON.parse(line)));
  return { child, exited, lines };
}

/** A log line of a maintenance run that failed. */
function isFailedRun(line: Record<string, unknown>): boolean {
  return typeof line.msg === 'string' && /run failed/.test(line.msg);
}

/**
 * A TCP proxy to `target` on a port of its own: `close` cuts every connection and refuses new
 * ones (Postgres gone), `open` accepts them again on the same port (Postgres back).
 */
async function startTcpProxy(target: URL): Promise<{ port: number; close(): Promise<void>; open(): Promise<void> }> {
  const sockets = new Set<Socket>();
  let server: Server | undefined;
  let port = 0;
  const open = async () => {
    if (server) return;
    const listening = createServer((client) => {
      const upstream = connect(Number(target.port || 5432), target.hostname);
      for (const socket of [client, upstream]) {
        sockets.add(socket);
        socket.on('close', () => sockets.delete(socket));
        socket.on('error', () => {
          client.destroy();
          upstream.destroy();
        });
      }
      client.pipe(upstream).pipe(client);
    });
    listening.listen(port, '127.0.0.1');
    await once(listening, 'listening');
    port = (listening.address() as { port: number }).port;
    server = listening;
  };
  const close = async () => {
    const closing = server;
    server = undefined;
    for (const socket of sockets) socket.destroy();
    if (closing) await new Promise((resolve) => closing.close(resolve));
  };
  await open();
  return { port, open, close };
}
