/**
 * Schedules on the days a zone's clock changes, by the rule of docs/guide.md#schedules: a local
 * time that a fixed-time expression names fires once, at its first occurrence, or at the first
 * instant after the gap when the clock skips it; an expression whose minute or hour field starts
 * with `*` fires at every instant whose local time matches. The scheduler runs against Postgres
 * with the database's clock held at chosen instants (./support/database-clock.ts).
 */
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Schedules, type ScheduleOptions } from '../src/index.js';
import { Scheduler, type ScheduledTick, type TickEnqueuer } from '../src/process/index.js';
import { createDatabaseClock, type DatabaseClock } from './support/database-clock.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const silent = pino({ level: 'silent' });
let env: TestEnv;
let clock: DatabaseClock;
let schedules: Schedules;

beforeAll(async () => {
  env = await createTestEnv('schedule_dst');
  clock = await createDatabaseClock(env.db, env.databaseDirectUrl, env.schema);
  schedules = new Schedules({ db: clock.db, schema: env.schema });
});
afterAll(async () => {
  await clock?.close();
  await env?.teardown();
});

const at = (iso: string) => new Date(iso);

/** A scheduler over the clocked sessions, recording the ticks it enqueues. */
function recordingScheduler(): { scheduler: Scheduler; ticks: ScheduledTick[] } {
  const ticks: ScheduledTick[] = [];
  const enqueuer: TickEnqueuer = {
    async enqueue(tick) {
      ticks.push(tick);
      return 'added';
    },
  };
  return { scheduler: new Scheduler({ db: clock.db, schema: env.schema, enqueuer, logger: silent }), ticks };
}

/** Adds the schedule with its cursor at `from`, runs one round at `to`, and gives the ticks enqueued. */
async function ticksBetween(options: ScheduleOptions, from: Date, to: Date): Promise<string[]> {
  await clock.set(from);
  await schedules.upsert({ missed: 'all', maxMissed: 10_000, ...options });
  await sql`update ${sql.id(env.schema, 'schedules')} set cursor = ${from} where name = ${options.name}`.execute(env.db);
  await clock.set(to);
  const { scheduler, ticks } = recordingScheduler();
  await scheduler.runOnce();
  await schedules.remove(options.name);
  return ticks.filter((tick) => tick.schedule === options.name).map((tick) => tick.tick.toISOString());
}

/** The ticks per local day (`YYYY-MM-DD` in `timeZone`). */
function perLocalDay(ticks: readonly string[], timeZone: string): Map<string, string[]> {
  const day = new Intl.DateTimeFormat('en-CA', { timeZone, year: 'numeric', month: '2-digit', day: '2-digit' });
  const days = new Map<string, string[]>();
  for (const tick of ticks) {
    const key = day.format(at(tick));
    days.set(key, [...(days.get(key) ?? []), tick]);
  }
  return days;
}

describe('a daily cron at a fixed time commits once per local day, DST days included', () => {
  it("the guide's '0 2 * * *' in Europe/Paris from a cursor months back: one tick each day, at 03:00 on the spring-forward day, at the first 02:00 on the fall-back day", async () => {
    const ticks = await ticksBetween({ name: 'paris-nightly', cron: '0 2 * * *', timezone: 'Europe/Paris', queue: 'reports' }, at('2026-01-01T00:00:00Z'), at('2026-12-01T00:00:00Z'));
    const days = perLocalDay(ticks, 'Europe/Paris');
    expect(days.size).toBe(334);
    expect([...days.values()].filter((list) => list.length !== 1)).toEqual([]);
    expect(days.get('2026-03-29')).toEqual(['2026-03-29T01:00:00.000Z']);
    expect(days.get('2026-10-25')).toEqual(['2026-10-25T00:00:00.000Z']);
  });

  it('in America/New_York: 03:00 EDT on 2026-03-08 (02:00 skipped), 02:00 EST once on 2026-11-01', async () => {
    const ticks = await ticksBetween({ name: 'ny-nightly', cron: '0 2 * * *', timezone: 'America/New_York', queue: 'reports' }, at('2026-02-01T00:00:00Z'), at('2026-11-30T00:00:00Z'));
    const days = perLocalDay(ticks, 'America/New_York');
    expect([...days.values()].filter((list) => list.length !== 1)).toEqual([]);
    expect(days.get('2026-03-08')).toEqual(['2026-03-08T07:00:00.000Z']);
    expect(days.get('2026-11-01')).toEqual(['2026-11-01T07:00:00.000Z']);
  });

  it('a fixed time inside the repeated hour fires at its first occurrence only (01:30 in New York, 02:30 in Paris)', async () => {
    expect(await ticksBetween({ name: 'ny-0130', cron: '30 1 * * *', timezone: 'America/New_York', queue: 'q' }, at('2026-10-31T12:00:00Z'), at('2026-11-01T12:00:00Z'))).toEqual([
      '2026-11-01T05:30:00.000Z',
    ]);
    expect(await ticksBetween({ name: 'paris-0230', cron: '30 2 * * *', timezone: 'Europe/Paris', queue: 'q' }, at('2026-10-24T12:00:00Z'), at('2026-10-25T12:00:00Z'))).toEqual([
      '2026-10-25T00:30:00.000Z',
    ]);
  });

  it('zones with odd offsets: Lord Howe (a 30-minute change), Kathmandu (+05:45), Chatham (+12:45/+13:45)', async () => {
    // Lord Howe: 2026-04-05 02:00 (+11) back to 01:30 (+10:30); 2026-10-04 02:00 (+10:30) on to 02:30 (+11).
    expect(await ticksBetween({ name: 'lh-0145', cron: '45 1 * * *', timezone: 'Australia/Lord_Howe', queue: 'q' }, at('2026-04-04T00:00:00Z'), at('2026-04-05T12:00:00Z'))).toEqual([
      '2026-04-04T14:45:00.000Z',
    ]);
    expect(await ticksBetween({ name: 'lh-0200', cron: '0 2 * * *', timezone: 'Australia/Lord_Howe', queue: 'q' }, at('2026-10-03T00:00:00Z'), at('2026-10-04T12:00:00Z'))).toEqual([
      '2026-10-03T15:30:00.000Z',
    ]);
    expect(await ticksBetween({ name: 'ktm', cron: '0 2 * * *', timezone: 'Asia/Kathmandu', queue: 'q' }, at('2026-06-01T00:00:00Z'), at('2026-06-02T00:00:00Z'))).toEqual([
      '2026-06-01T20:15:00.000Z',
    ]);
    // Chatham: 2026-09-27 02:45 (+12:45) on to 03:45 (+13:45): 03:00 is skipped.
    expect(await ticksBetween({ name: 'chatham', cron: '0 3 * * *', timezone: 'Pacific/Chatham', queue: 'q' }, at('2026-09-25T00:00:00Z'), at('2026-09-27T12:00:00Z'))).toEqual([
      '2026-09-25T14:15:00.000Z',
      '2026-09-26T14:00:00.000Z',
    ]);
  });
});

describe('an expression whose minute or hour starts with * fires at every instant whose local time matches', () => {
  it("'0 * * * *' runs every real hour across both changes (the repeated 02:00 twice, the skipped 02:00 not at all)", async () => {
    expect(await ticksBetween({ name: 'hourly-fall', cron: '0 * * * *', timezone: 'Europe/Paris', queue: 'q' }, at('2026-10-24T22:30:00Z'), at('2026-10-25T03:00:00Z'))).toEqual([
      '2026-10-24T23:00:00.000Z',
      '2026-10-25T00:00:00.000Z',
      '2026-10-25T01:00:00.000Z',
      '2026-10-25T02:00:00.000Z',
      '2026-10-25T03:00:00.000Z',
    ]);
    expect(await ticksBetween({ name: 'hourly-spring', cron: '0 * * * *', timezone: 'Europe/Paris', queue: 'q' }, at('2026-03-28T22:30:00Z'), at('2026-03-29T02:00:00Z'))).toEqual([
      '2026-03-28T23:00:00.000Z',
      '2026-03-29T00:00:00.000Z',
      '2026-03-29T01:00:00.000Z',
      '2026-03-29T02:00:00.000Z',
    ]);
  });

  it("'*/30 2 * * *' has no tick on the spring-forward day (its 02:00 and 02:30 do not exist) and four on the fall-back day", async () => {
    const ticks = await ticksBetween({ name: 'half-hours', cron: '*/30 2 * * *', timezone: 'Europe/Paris', queue: 'q' }, at('2026-03-28T12:00:00Z'), at('2026-03-30T12:00:00Z'));
    expect(ticks).toEqual(['2026-03-30T00:00:00.000Z', '2026-03-30T00:30:00.000Z']);
    expect(await ticksBetween({ name: 'half-hours-fall', cron: '*/30 2 * * *', timezone: 'Europe/Paris', queue: 'q' }, at('2026-10-24T12:00:00Z'), at('2026-10-25T12:00:00Z'))).toEqual([
      '2026-10-25T00:00:00.000Z',
      '2026-10-25T00:30:00.000Z',
      '2026-10-25T01:00:00.000Z',
      '2026-10-25T01:30:00.000Z',
    ]);
  });
});

describe('seconds, and the next tick shown', () => {
  it('a 6-field expression at fixed minutes of a skipped hour collapses into one tick at the end of the gap', async () => {
    expect(await ticksBetween({ name: 'seconds', cron: '*/20 30 2 * * *', timezone: 'Europe/Paris', queue: 'q' }, at('2026-03-28T12:00:00Z'), at('2026-03-29T12:00:00Z'))).toEqual([
      '2026-03-29T01:00:00.000Z',
    ]);
  });

  it('the next tick schedules list shows on the eve of a change is the tick the next round enqueues', async () => {
    for (const [zone, eve, expected] of [
      ['Europe/Paris', '2026-03-28T12:00:00Z', '2026-03-29T01:00:00.000Z'],
      ['Europe/Paris', '2026-10-25T00:00:00Z', '2026-10-26T01:00:00.000Z'],
      ['America/New_York', '2026-03-07T12:00:00Z', '2026-03-08T07:00:00.000Z'],
    ] as const) {
      const name = `next-${zone}-${eve}`;
      await clock.set(at(eve));
      const shown = (await schedules.upsert({ name, cron: '0 2 * * *', timezone: zone, queue: 'q' })).nextTick!;
      expect(shown.toISOString()).toBe(expected);
      await clock.set(new Date(shown.getTime() + 30_000));
      const { scheduler, ticks } = recordingScheduler();
      await scheduler.runOnce();
      expect(ticks.filter((tick) => tick.schedule === name).map((tick) => tick.tick.toISOString())).toEqual([expected]);
      await schedules.remove(name);
    }
  });
});
