// @module-tag redis
/**
 * Schedules: each tick is the idempotency key `schedule:<name>` / `<tick time>`, so racing,
 * restarted and re-added schedulers enqueue each tick's job once and its effect commits once;
 * the database's clock decides which ticks are due.
 */
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import {
  IdempotencyKeys,
  Schedules,
  ValidationError,
  createIdempotentWorker,
  jobIdFor,
  scheduleScope,
  tickKey,
  type IdempotentWorker,
} from '../src/index.js';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import {
  BullmqTickEnqueuer,
  Scheduler,
  loadEnvConfig,
  startMaintenanceProcess,
  instrumentScheduler,
  MAX_SCHEDULE_LABELS,
  type ScheduledTick,
  type SchedulerEvents,
  type TickEnqueuer,
} from '../src/process/index.js';
import { EventEmitter } from 'node:events';
import { register } from 'prom-client';
import { dueTicks, hashSeedOf, nextTick } from '../src/ops/schedule-ticks.js';
import { CronTicks } from '../src/ops/cron-ticks.js';
import { createEffectsTable, createGate } from './support/protocol-fixtures.js';
import { waitFor } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const MINUTE = 60_000;
const HOUR = 3_600_000;
const silent = pino({ level: 'silent' });

let env: TestEnv;
let schedules: Schedules;
const closers: Array<() => Promise<unknown>> = [];

beforeAll(async () => {
  env = await createTestEnv('scheduler');
  await createEffectsTable(env.db, env.schema);
  schedules = new Schedules({ db: env.db, schema: env.schema });
});
afterEach(async () => {
  vi.useRealTimers();
  await Promise.all(closers.splice(0).map((close) => close()));
});
afterAll(async () => {
  await env?.teardown();
});

function enqueuer(): BullmqTickEnqueuer {
  const e = new BullmqTickEnqueuer({ connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  closers.push(() => e.close());
  return e;
}

function scheduler(tickEnqueuer: TickEnqueuer = enqueuer()): Scheduler {
  return new Scheduler({ db: env.db, schema: env.schema, enqueuer: tickEnqueuer, logger: silent });
}

function queue(name: string): Queue {
  const q = new Queue(name, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  closers.push(() => q.close());
  return q;
}

/** Moves a schedule's cursor back `count` whole intervals before the interval's current tick, by the database's clock. */
async function backdate(name: string, intervalMs: number, count: number): Promise<void> {
  await sql`update ${sql.id(env.schema, 'schedules')}
               set cursor = to_timestamp((floor(extract(epoch from now()) * 1000 / ${intervalMs}) - ${count}) * ${intervalMs} / 1000.0)
             where name = ${name}`.execute(env.db);
}

async function jobIds(q: Queue): Promise<string[]> {
  const jobs = await q.getJobs(['waiting', 'delayed', 'active', 'completed', 'failed', 'prioritized']);
  return jobs.map((job) => job.id!).sort();
}

/** The `count` ticks of an interval schedule ending at its last tick, as job ids. */
function expectedJobIds(name: string, lastTick: Date, intervalMs: number, count: number): string[] {
  return Array.from({ length: count }, (_, k) => jobIdFor(scheduleScope(name), tickKey(new Date(lastTick.getTime() - k * intervalMs)))).sort();
}

/** Holds each enqueue on a gate until opened, then hands it on. */
function gatedEnqueuer(inner: TickEnqueuer) {
  const gate = createGate();
  const reached = createGate();
  return {
    gate,
    reached,
    enqueuer: {
      async enqueue(tick: ScheduledTick) {
        reached.open();
        await gate.wait;
        return inner.enqueue(tick);
      },
    } satisfies TickEnqueuer,
  };
}

describe('tick rules', () => {
  const at = (iso: string) => new Date(iso);

  it('interval ticks are the multiples of the interval since the epoch, after the cursor and at or before now', () => {
    const rule = { name: 'minutes', kind: 'interval' as const, spec: String(MINUTE), timezone: 'UTC', missed: 'all' as const, maxMissed: 100 };
    expect(dueTicks(rule, at('2026-01-01T00:00:30Z'), at('2026-01-01T00:03:00Z')).map(tickKey)).toEqual([
      '2026-01-01T00:01:00.000Z',
      '2026-01-01T00:02:00.000Z',
      '2026-01-01T00:03:00.000Z',
    ]);
    // A tick at the cursor itself is done already.
    expect(dueTicks(rule, at('2026-01-01T00:03:00Z'), at('2026-01-01T00:03:59Z'))).toEqual([]);
    expect(nextTick(rule, at('2026-01-01T00:03:00Z'))).toEqual(at('2026-01-01T00:04:00Z'));
  });

  it("missed: 'latest' gives only the latest due tick; 'all' the latest maxMissed, oldest first", () => {
    const base = { name: 'hourly', kind: 'cron' as const, spec: '0 * * * *', timezone: 'UTC' };
    const from = at('2026-01-01T00:30:00Z');
    const to = at('2026-01-01T10:00:00Z');
    expect(dueTicks({ ...base, missed: 'latest', maxMissed: 1 }, from, to).map(tickKey)).toEqual(['2026-01-01T10:00:00.000Z']);
    expect(dueTicks({ ...base, missed: 'all', maxMissed: 3 }, from, to).map(tickKey)).toEqual([
      '2026-01-01T08:00:00.000Z',
      '2026-01-01T09:00:00.000Z',
      '2026-01-01T10:00:00.000Z',
    ]);
    expect(dueTicks({ ...base, missed: 'all', maxMissed: 100 }, from, to)).toHaveLength(10);
  });

  it("draws H in a cron expression from the schedule's name: every scheduler and every round compute the same ticks", () => {
    const rule = { name: 'hashed', kind: 'cron' as const, spec: 'H H * * *', timezone: 'UTC' };
    const first = nextTick(rule, at('2026-01-01T00:00:00Z'))!;
    expect(nextTick(rule, first)!.getTime() - first.getTime()).toBe(24 * HOUR);
    expect(new CronTicks(rule.spec, rule.timezone, hashSeedOf(rule.name)).next(Date.parse('2026-01-01T00:00:00Z'))).toBe(first.getTime());
  });

  it('reads a cron expression in its time zone', () => {
    const rule = { name: 'nine', kind: 'cron' as const, spec: '0 9 * * *', timezone: 'Europe/Paris' };
    expect(nextTick(rule, at('2026-01-01T00:00:00Z'))).toEqual(at('2026-01-01T08:00:00Z'));
    expect(nextTick(rule, at('2026-07-01T00:00:00Z'))).toEqual(at('2026-07-01T07:00:00Z'));
  });
});

describe('schedule validation', () => {
  const bad: Array<[string, Record<string, unknown>, RegExp]> = [
    ['an out-of-range cron field', { cron: '61 * * * *' }, /cron "61 \* \* \* \*" is not a valid expression/],
    ['a cron expression of 3 fields', { cron: '* * *' }, /has 3 fields; give 5/],
    ['an empty cron expression', { cron: '' }, /non-empty cron expression/],
    ['cron and every both', { cron: '* * * * *', every: 60_000 }, /either cron or every, not both/],
    ['neither cron nor every', {}, /give a cron expression/],
    ['an interval under a second', { every: 10 }, /at least 1000/],
    ['a fractional interval', { every: 1500.5 }, /whole number of milliseconds/],
    ['an unknown time zone', { cron: '* * * * *', timezone: 'Mars/Olympus' }, /not an IANA time zone/],
    ['an unknown missed policy', { every: 60_000, missed: 'some' }, /missed must be 'latest' or 'all'/],
    ['maxMissed 0', { every: 60_000, missed: 'all', maxMissed: 0 }, /maxMissed must be a whole number from 1/],
    ['no queue', { every: 60_000, queue: '' }, /queue must be a non-empty string/],
  ];
  it.each(bad)('refuses %s with INVALID_OPTIONS, storing nothing', async (_, options, message) => {
    const error = await schedules.upsert({ name: 'invalid', queue: 'q', ...options } as any).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ValidationError);
    expect((error as ValidationError).code).toBe('INVALID_OPTIONS');
    expect((error as ValidationError).message).toMatch(message);
    expect(await schedules.get('invalid')).toBeUndefined();
  });

  it('refuses an empty or over-long name', async () => {
    await expect(schedules.upsert({ name: '', every: 60_000, queue: 'q' })).rejects.toThrow(/needs a name/);
    await expect(schedules.remove('x'.repeat(201))).rejects.toThrow(/at most 200/);
  });
});

describe('schedules in Postgres', () => {
  it('lists a schedule with its next tick; a new schedule has no due tick before its creation', async () => {
    const info = await schedules.upsert({ name: 'listed', every: HOUR, queue: 'listed', data: { report: 'x' } });
    expect(info).toMatchObject({ name: 'listed', kind: 'interval', spec: String(HOUR), queue: 'listed', jobName: 'listed', missed: 'latest', lastTick: null, data: { report: 'x' } });
    expect(info.nextTick!.getTime() % HOUR).toBe(0);
    const report = await scheduler().runOnce();
    expect((await schedules.get('listed'))!.lastTick).toBeNull();
    expect(report.enqueued).toBe(0);
    expect(await jobIds(queue('listed'))).toEqual([]);
    await schedules.remove('listed');
  });

  it('two schedulers racing over the same due ticks enqueue each tick once, and a worker commits each tick once', async () => {
    const name = 'race';
    await schedules.upsert({ name, every: MINUTE, queue: 'race', missed: 'all', maxMissed: 5 });
    await backdate(name, MINUTE, 10);
    // A reads the schedule and stops before its first enqueue; B runs a whole round; then A goes on.
    const a = gatedEnqueuer(enqueuer());
    const roundA = scheduler(a.enqueuer).runOnce();
    await a.reached.wait;
    const reportB = await scheduler().runOnce();
    a.gate.open();
    const reportA = await roundA;
    expect(reportB).toMatchObject({ enqueued: 5, duplicates: 0, failed: 0 });
    expect(reportA).toMatchObject({ enqueued: 5, duplicates: 5, failed: 0 });
    const { lastTick } = (await schedules.get(name))!;
    const q = queue('race');
    expect(await jobIds(q)).toEqual(expectedJobIds(name, lastTick!, MINUTE, 5));

    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
    const worker: IdempotentWorker<any, any> = createIdempotentWorker({
      queue: 'race',
      connection: { url: env.redisUrl },
      prefix: env.redisPrefix,
      keys,
      concurrency: 4,
      logger: silent,
      handler: async (ctx) =>
        ctx.transaction(async (tx) => {
          await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, 'w')`.execute(tx);
          return ctx.key;
        }),
    });
    closers.push(() => worker.close({ force: true }));
    await waitFor('5 completed ticks', async () => (await q.getCompletedCount()) === 5 || undefined);
    // A third scheduler that read the old cursor (put back) enqueues the same ticks again: the finished jobs replay, nothing runs twice.
    await sql`update ${sql.id(env.schema, 'schedules')} set cursor = ${new Date(lastTick!.getTime() - 5 * MINUTE + 1)} where name = ${name}`.execute(env.db);
    const again = await scheduler().runOnce();
    expect(again.enqueued).toBeGreaterThanOrEqual(5);
    await waitFor('the queue drained', async () => ((await q.getWaitingCount()) + (await q.getActiveCount()) === 0 ? true : undefined));
    const { rows } = await sql<{ key: string; n: string }>`
      select key, count(*) as n from ${sql.id(env.schema, 'effects')} where scope = ${scheduleScope(name)} group by key order by key`.execute(env.db);
    expect(rows.filter((r) => Number(r.n) !== 1)).toEqual([]);
    expect(rows.map((r) => r.key).slice(0, 5)).toEqual(
      Array.from({ length: 5 }, (_, k) => tickKey(new Date(lastTick!.getTime() - (4 - k) * MINUTE))),
    );
    await schedules.remove(name);
  });

  it('a scheduler stopped between enqueuing and moving the cursor is repeated by the next one, each tick once', async () => {
    const name = 'restart';
    await schedules.upsert({ name, every: MINUTE, queue: 'restart', missed: 'all', maxMissed: 10 });
    await backdate(name, MINUTE, 4);
    const real = enqueuer();
    let calls = 0;
    const dying: TickEnqueuer = {
      async enqueue(tick) {
        if (++calls === 3) throw new Error('process killed');
        return real.enqueue(tick);
      },
    };
    expect(await scheduler(dying).runOnce()).toMatchObject({ enqueued: 0, failed: 1 });
    expect((await schedules.get(name))!.lastTick).toBeNull();
    const restarted = await scheduler().runOnce();
    expect(restarted).toMatchObject({ failed: 0, duplicates: 2 });
    expect(restarted.enqueued).toBeGreaterThanOrEqual(4);
    const { lastTick } = (await schedules.get(name))!;
    expect(await jobIds(queue('restart'))).toEqual(expectedJobIds(name, lastTick!, MINUTE, restarted.enqueued));
    await schedules.remove(name);
  });

  it('remove and re-add keeps the ticks already fired from firing again, and skips the ticks missed while removed', async () => {
    const name = 'readd';
    await schedules.upsert({ name, every: MINUTE, queue: 'readd', missed: 'all', maxMissed: 3 });
    await backdate(name, MINUTE, 3);
    expect((await scheduler().runOnce()).enqueued).toBe(3);
    const fired = (await schedules.get(name))!.lastTick;
    expect(await schedules.remove(name)).toBe(true);
    expect(await schedules.remove(name)).toBe(false);
    expect((await schedules.list()).map((s) => s.name)).not.toContain(name);
    expect((await scheduler().runOnce()).enqueued).toBe(0);
    // Re-added at once, and again after a (simulated) long removal: no tick before the re-add is due.
    const readded = await schedules.upsert({ name, every: MINUTE, queue: 'readd', missed: 'all', maxMissed: 3 });
    expect(readded.lastTick).toEqual(fired);
    await schedules.remove(name);
    await sql`update ${sql.id(env.schema, 'schedules')} set cursor = cursor - interval '1 hour' where name = ${name}`.execute(env.db);
    await schedules.upsert({ name, every: MINUTE, queue: 'readd', missed: 'all', maxMissed: 3 });
    const report = await scheduler().runOnce();
    // A tick may fall between the re-add and the round (a minute boundary); never one at or before the re-add.
    expect(report.enqueued).toBeLessThanOrEqual(1);
    expect(report.duplicates).toBe(0);
    expect((await jobIds(queue('readd'))).length).toBe(3 + report.enqueued);
    await schedules.remove(name);
  });

  it("missed: 'latest' enqueues only the latest tick after downtime; 'all' the latest maxMissed", async () => {
    await schedules.upsert({ name: 'latest', every: HOUR, queue: 'missed-latest' });
    await schedules.upsert({ name: 'all', every: HOUR, queue: 'missed-all', missed: 'all', maxMissed: 3 });
    await backdate('latest', HOUR, 6);
    await backdate('all', HOUR, 6);
    await scheduler().runOnce();
    const latest = (await schedules.get('latest'))!.lastTick!;
    const all = (await schedules.get('all'))!.lastTick!;
    expect(await jobIds(queue('missed-latest'))).toEqual(expectedJobIds('latest', latest, HOUR, 1));
    expect(await jobIds(queue('missed-all'))).toEqual(expectedJobIds('all', all, HOUR, 3));
    // The skipped ticks stay skipped.
    expect((await scheduler().runOnce()).enqueued).toBe(0);
    await schedules.remove('latest');
    await schedules.remove('all');
  });

  it('reports each schedule\'s round (enqueued, skipped by its missed-ticks policy, lag) and instrumentScheduler counts it by schedule', async () => {
    await schedules.upsert({ name: 'metered', every: HOUR, queue: 'metered', missed: 'all', maxMissed: 2 });
    await backdate('metered', HOUR, 5);
    const sched = scheduler();
    const stop = instrumentScheduler(sched, env.schema);
    try {
      const report = await sched.runOnce();
      const round = report.schedules.find((s) => s.schedule === 'metered')!;
      // Five ticks were missed (the cursor five intervals back): the latest two enqueued, three skipped.
      expect(round).toMatchObject({ enqueued: 2, duplicates: 0, skipped: 3, failed: false });
      expect(round.lagMs).toBe(report.databaseNow!.getTime() - round.latestTick!.getTime());
      const labels = `schema="${env.schema}",schedule="metered"`;
      const metrics = await register.metrics();
      expect(metrics).toContain(`idempotent_jobs_schedule_ticks_enqueued_total{${labels}} 2`);
      expect(metrics).toContain(`idempotent_jobs_schedule_ticks_skipped_total{${labels}} 3`);
      expect(metrics).toMatch(new RegExp(`idempotent_jobs_schedule_tick_lag_seconds\\{${labels}\\} ${round.lagMs! / 1000}\\b`));
      // The next round finds nothing due and skips nothing more.
      expect((await sched.runOnce()).schedules.find((s) => s.schedule === 'metered')).toMatchObject({ enqueued: 0, skipped: 0, lagMs: null });
      expect(await register.metrics()).toContain(`idempotent_jobs_schedule_ticks_skipped_total{${labels}} 3`);
    } finally {
      stop();
      await schedules.remove('metered');
    }
  });

  it(`gives at most ${MAX_SCHEDULE_LABELS} schedules a label of their own; the others count as "other"`, async () => {
    const emitter = new EventEmitter<SchedulerEvents>();
    const stop = instrumentScheduler(emitter, 'labels-test');
    try {
      const schedulesOfRound = Array.from({ length: MAX_SCHEDULE_LABELS + 5 }, (_, n) => ({
        schedule: `s-${n}`, enqueued: 1, duplicates: 0, skipped: 0, latestTick: null, lagMs: null, failed: false,
      }));
      emitter.emit('round', { enqueued: schedulesOfRound.length, duplicates: 0, failed: 0, nextTick: null, databaseNow: null, schedules: schedulesOfRound });
      const metrics = await register.metrics();
      expect(metrics).toContain('idempotent_jobs_schedule_ticks_enqueued_total{schema="labels-test",schedule="s-99"} 1');
      expect(metrics).not.toContain('schedule="s-100"');
      expect(metrics).toContain('idempotent_jobs_schedule_ticks_enqueued_total{schema="labels-test",schedule="other"} 5');
    } finally {
      stop();
    }
  });

  it("a scheduler whose clock is hours off enqueues exactly the ticks the database's clock makes due", async () => {
    const name = 'skew';
    await schedules.upsert({ name, every: HOUR, queue: 'skew', missed: 'all', maxMissed: 10 });
    await backdate(name, HOUR, 2);
    const { rows } = await sql<{ now: Date }>`select now() as now`.execute(env.db);
    const databaseNow = rows[0]!.now.getTime();
    const tickEnqueuer = enqueuer();
    vi.useFakeTimers({ toFake: ['Date'] });
    vi.setSystemTime(databaseNow + 5 * HOUR);
    const ahead = await scheduler(tickEnqueuer).runOnce();
    // Nor does the cursor move past the database's now (else the ticks of the next hours would be skipped).
    const cursorAhead = await sql<{ ahead: boolean }>`select cursor > now() as ahead from ${sql.id(env.schema, 'schedules')} where name = ${name}`.execute(env.db);
    expect(cursorAhead.rows[0]!.ahead).toBe(false);
    vi.setSystemTime(databaseNow - 5 * HOUR);
    const behind = await scheduler(tickEnqueuer).runOnce();
    vi.useRealTimers();
    // Two hourly ticks were due by the database (three if an hour began since it was read); none of the clock's.
    expect(ahead.enqueued).toBeGreaterThanOrEqual(2);
    expect(ahead.enqueued).toBeLessThanOrEqual(3);
    expect(behind.enqueued).toBe(0);
    const { lastTick } = (await schedules.get(name))!;
    expect(lastTick!.getTime()).toBeLessThanOrEqual(Date.now());
    expect(await jobIds(queue('skew'))).toEqual(expectedJobIds(name, lastTick!, HOUR, ahead.enqueued));
    await schedules.remove(name);
  });

  it('start() runs rounds until stop()', async () => {
    const name = 'loop';
    await schedules.upsert({ name, every: MINUTE, queue: 'loop' });
    await backdate(name, MINUTE, 1);
    const s = scheduler();
    s.start();
    await waitFor('a tick of the loop', async () => (await schedules.get(name))!.lastTick ?? undefined);
    await s.stop();
    expect((await jobIds(queue('loop'))).length).toBeGreaterThanOrEqual(1);
    await schedules.remove(name);
  });
});

describe('the maintenance process and the CLI', () => {
  it('two maintenance processes run schedulers side by side: each due tick is enqueued once', async () => {
    const name = 'maintained';
    await schedules.upsert({ name, every: MINUTE, queue: 'maintained', missed: 'all', maxMissed: 4 });
    await backdate(name, MINUTE, 4);
    const config = loadEnvConfig({
      DATABASE_URL: env.databaseUrl,
      SCHEMA: env.schema,
      REDIS_URL: env.redisUrl,
      REDIS_PREFIX: env.redisPrefix,
      QUEUE: 'maintained',
      JANITOR_ENABLED: 'false',
      SWEEPER_ENABLED: 'false',
      SCHEDULER_INTERVAL_MS: '100',
      MIGRATE: 'false',
      LOG_LEVEL: 'silent',
    });
    const processes = await Promise.all([1, 2].map(() => startMaintenanceProcess({ config, handleSignals: false, logger: silent })));
    closers.push(() => Promise.all(processes.map((p) => p.stop())));
    expect(processes.every((p) => p.scheduler !== undefined)).toBe(true);
    const lastTick = await waitFor('the ticks enqueued', async () => (await schedules.get(name))!.lastTick ?? undefined);
    const ids = await jobIds(queue('maintained'));
    expect(ids.length).toBeGreaterThanOrEqual(4);
    expect(ids).toEqual(expectedJobIds(name, lastTick, MINUTE, ids.length));
    await Promise.all(processes.map((p) => p.stop()));
    await schedules.remove(name);
  });

  it("the maintenance process gives each schedule's ticks its own queue's retry policy: QUEUE's, JOB_RETRY_POLICIES', else BullMQ's defaults", async () => {
    const names = ['policy-main', 'policy-other', 'policy-bare'];
    for (const name of names) {
      await schedules.upsert({ name, every: MINUTE, queue: name });
      await backdate(name, MINUTE, 1);
    }
    const config = loadEnvConfig({
      DATABASE_URL: env.databaseUrl,
      SCHEMA: env.schema,
      REDIS_URL: env.redisUrl,
      REDIS_PREFIX: env.redisPrefix,
      QUEUE: 'policy-main',
      JOB_ATTEMPTS: '5',
      JOB_BACKOFF_MS: '1000',
      JOB_BACKOFF_TYPE: 'exponential',
      JOB_RETRY_POLICIES: 'policy-other=3:fixed:250',
      JANITOR_ENABLED: 'false',
      SWEEPER_ENABLED: 'false',
      SCHEDULER_INTERVAL_MS: '100',
      MIGRATE: 'false',
      LOG_LEVEL: 'silent',
    });
    const maintenance = await startMaintenanceProcess({ config, handleSignals: false, logger: silent });
    closers.push(() => maintenance.stop());
    const optionsOf = async (name: string) => {
      const [job] = await queue(name).getJobs(['waiting', 'delayed', 'active', 'completed', 'failed', 'prioritized']);
      return job?.opts;
    };
    for (const name of names) await waitFor(`a tick of ${name}`, () => optionsOf(name));
    expect(await optionsOf('policy-main')).toMatchObject({ attempts: 5, backoff: { type: 'exponential', delay: 1000 } });
    expect(await optionsOf('policy-other')).toMatchObject({ attempts: 3, backoff: { type: 'fixed', delay: 250 } });
    const bare = (await optionsOf('policy-bare'))!;
    // BullMQ's default: one try (its opts say attempts 0).
    expect([undefined, 0, 1]).toContain(bare.attempts);
    expect(bare.backoff).toBeUndefined();
    await maintenance.stop();
    for (const name of names) await schedules.remove(name);
  });

  it('JOB_RETRY_POLICIES: a malformed entry, a queue named twice, or QUEUE itself is refused at start, naming what to write', () => {
    const base = { DATABASE_URL: env.databaseUrl, QUEUE: 'payments' };
    expect(() => loadEnvConfig({ ...base, JOB_RETRY_POLICIES: 'reports=0' })).toThrow(/JOB_RETRY_POLICIES: .*attempts at least 1/);
    expect(() => loadEnvConfig({ ...base, JOB_RETRY_POLICIES: 'reports=3:linear:10' })).toThrow(/JOB_RETRY_POLICIES: must look like reports=5:exponential:1000,rates=3/);
    expect(() => loadEnvConfig({ ...base, JOB_RETRY_POLICIES: 'reports=3,reports=4' })).toThrow(/each queue once/);
    expect(() => loadEnvConfig({ ...base, JOB_RETRY_POLICIES: 'reports=3,payments=2' })).toThrow(/names QUEUE \(payments\).*JOB_ATTEMPTS/);
    expect(loadEnvConfig({ ...base, JOB_RETRY_POLICIES: ' reports = 5:exponential:1000 , rates=3 ' }).JOB_RETRY_POLICIES).toBeDefined();
  });

  it('schedules list prints each schedule with its spec, policy, queue, last and next tick (table and JSON); get shows one; remove removes one', { timeout: 180_000 }, async () => {
    await schedules.upsert({ name: 'cli-cron', cron: '0 2 * * *', timezone: 'Europe/Paris', queue: 'reports', missed: 'all', maxMissed: 7 });
    await schedules.upsert({ name: 'cli-every', every: MINUTE, queue: 'rates' });
    // 02:00 on the last Sunday of March in Paris: the hour the clock skips every year.
    await schedules.upsert({ name: 'cli-dst', cron: '0 2 * 3 0L', timezone: 'Europe/Paris', queue: 'reports' });
    const bin = fileURLToPath(new URL('../bin/idempotent-jobs.js', import.meta.url));
    const run = (args: string[]) =>
      new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
        execFile(
          process.execPath,
          [bin, ...args],
          { env: { ...process.env, DATABASE_URL: env.databaseUrl, SCHEMA: env.schema, LOG_LEVEL: 'silent' }, timeout: 30_000 },
          (error, stdout, stderr) => resolve({ code: error ? (typeof error.code === 'number' ? error.code : -1) : 0, stdout, stderr }),
        );
      });
    const text = await run(['schedules', 'list']);
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(/^NAME\s+SPEC\s+MISSED\s+QUEUE\s+LAST TICK\s+NEXT TICK/m);
    expect(text.stdout).toMatch(/^cli-cron\s+0 2 \* \* \* \(Europe\/Paris\)\s+all \(max 7\)\s+reports\s+-\s+\d{4}-\d\d-\d\dT0[01]:00:00Z/m);
    expect(text.stdout).toMatch(/^cli-every\s+every 1m\s+latest\s+rates\s+-\s+\S+:00Z$/m);
    // The next tick shown is the one that fires, its local time beside it: for a skipped time, the end of the gap.
    expect(text.stdout).toMatch(/^cli-cron\s+.*\d\dT0[01]:00:00Z \(02:00\+0[12]:00 local\)$/m);
    expect(text.stdout).toMatch(/^cli-dst\s+0 2 \* 3 0L \(Europe\/Paris\)\s+latest\s+reports\s+-\s+\d{4}-03-\d\dT01:00:00Z \(03:00\+02:00 local, for 02:00 skipped\)$/m);
    const asJson = await run(['schedules', 'list', '--json']);
    const parsed = JSON.parse(asJson.stdout) as Array<Record<string, unknown>>;
    expect(parsed.map((s) => s.name)).toEqual(['cli-cron', 'cli-dst', 'cli-every']);
    expect(parsed[1]).toMatchObject({ nextTickLocal: expect.stringMatching(/^\d{4}-03-\d\dT03:00:00\+02:00$/), nextTickSkippedLocalTime: expect.stringMatching(/^\d{4}-03-\d\dT02:00:00$/) });
    expect((await run(['schedules', 'get', 'cli-dst'])).stdout).toMatch(/^next tick, local\s+\d{4}-03-\d\dT03:00:00\+02:00, for 02:00 skipped$/m);
    expect(parsed[0]).toMatchObject({ kind: 'cron', spec: '0 2 * * *', timezone: 'Europe/Paris', lastTick: null });
    const one = await run(['schedules', 'get', 'cli-cron']);
    expect(one.code).toBe(0);
    expect(one.stdout).toMatch(/^spec\s+0 2 \* \* \* \(Europe\/Paris\)$/m);
    expect(one.stdout).toMatch(/^next tick\s+\d{4}-\d\d-\d\dT0[01]:00:00Z$/m);
    expect(JSON.parse((await run(['schedules', 'get', 'cli-every', '--json'])).stdout)).toMatchObject({ name: 'cli-every', kind: 'interval', spec: '60000' });
    const removed = await run(['schedules', 'remove', 'cli-cron']);
    expect(removed.code).toBe(0);
    expect(removed.stdout).toMatch(/Removed schedule "cli-cron"/);
    expect(await schedules.get('cli-cron')).toBeUndefined();
    // Removing it again, or getting it, names what is missing (exit code 3); a name no schedule could have is a usage error (2).
    const again = await run(['schedules', 'remove', 'cli-cron']);
    expect(again.code).toBe(3);
    expect(again.stderr).toMatch(/No schedule "cli-cron"/);
    expect((await run(['schedules', 'get', 'cli-cron'])).code).toBe(3);
    const bad = await run(['schedules', 'remove', 'x'.repeat(300)]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/name/i);
    await schedules.remove('cli-every');
    await schedules.remove('cli-dst');
    expect((await run(['schedules', 'list'])).stdout).toMatch(/No schedules/);
  });
});
