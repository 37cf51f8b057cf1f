/**
 * Property tests of the schedules' invariants (docs/architecture.md, "Invariants", "Schedules")
 * against Postgres, the database's clock held at generated instants (./support/database-clock.ts),
 * and a reference model that walks real instants with `Intl` (./support/cron-reference.ts):
 * random 5- and 6-field expressions, zones whose clocks change (odd offsets, changes at
 * midnight, a 30-minute and a 2-hour change), windows around their changes of 2019–2030.
 *
 * `PROPERTY_RUNS` runs of each property (default 20; nightly, more), `FC_SEED` to reproduce a run.
 */
import fc from 'fast-check';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { IdempotencyKeys, Schedules, isHeld, type ScheduleOptions } from '../src/index.js';
import { Scheduler, type SchedulerReport, type ScheduledTick, type TickEnqueuer } from '../src/process/index.js';
import { MAX_COUNTED_SKIPS } from '../src/ops/schedule-ticks.js';
import { changesOf, cron5, dailyFixedTime, scheduleWindow, windowAround, zoneChange, ZONES } from './support/cron-arbitraries.js';
import { localTimeOf, referenceTicks } from './support/cron-reference.js';
import { createDatabaseClock, type DatabaseClock } from './support/database-clock.js';
import { createEffectsTable, insertEffect } from './support/protocol-fixtures.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const RUNS = Number(process.env.PROPERTY_RUNS ?? 20);
const SEED = Number(process.env.FC_SEED ?? Math.floor(Math.random() * 2 ** 31));
const HOUR = 3_600_000;
const DAY = 24 * HOUR;
const silent = pino({ level: 'silent' });

let env: TestEnv;
let clock: DatabaseClock;
let schedules: Schedules;
let keys: IdempotencyKeys;

beforeAll(async () => {
  console.log(`schedule properties: fast-check seed ${SEED} (reproduce with FC_SEED=${SEED}), ${RUNS} runs each (PROPERTY_RUNS)`);
  env = await createTestEnv('schedule_props');
  await createEffectsTable(env.db, env.schema);
  clock = await createDatabaseClock(env.db, env.databaseDirectUrl, env.schema);
  schedules = new Schedules({ db: clock.db, schema: env.schema });
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 60_000 });
  // Each zone's changes, found once before the properties draw from them.
  for (const zone of ZONES) changesOf(zone);
}, 120_000);
afterAll(async () => {
  await clock?.close();
  await env?.teardown();
});

const options = { seed: SEED, numRuns: RUNS, endOnFailure: true } as const;
/** A property's time limit, grown with the runs asked for (a property that went on past its limit would move the clock under the next one). */
const timeout = (perRunMs: number) => ({ timeout: 60_000 + RUNS * perRunMs });
let run = 0;

/** A scheduler over the clocked sessions that records what it enqueues. */
function recordingScheduler(): { scheduler: Scheduler; ticks: ScheduledTick[] } {
  const ticks: ScheduledTick[] = [];
  const enqueuer: TickEnqueuer = { enqueue: async (tick) => (ticks.push(tick), 'added') };
  return { scheduler: new Scheduler({ db: clock.db, schema: env.schema, enqueuer, logger: silent }), ticks };
}

/** Adds the schedule (a fresh name) with its cursor at `cursor`; returns the name. */
async function addSchedule(schedule: Omit<ScheduleOptions, 'name' | 'queue'>, cursor: number): Promise<string> {
  const name = `p${++run}`;
  await clock.set(new Date(cursor));
  await schedules.upsert({ name, queue: 'q', ...schedule });
  await sql`update ${sql.id(env.schema, 'schedules')} set cursor = ${new Date(cursor)} where name = ${name}`.execute(env.db);
  return name;
}

/** One round by `scheduler` with the database's clock at `at`: its ticks of schedule `name` (ms) and its report. */
async function roundAt(name: string, at: number, recording = recordingScheduler()): Promise<{ ticks: number[]; report: SchedulerReport }> {
  await clock.set(new Date(at));
  const report = await recording.scheduler.runOnce();
  const ticks = recording.ticks.filter((tick) => tick.schedule === name).map((tick) => tick.tick.getTime());
  recording.ticks.length = 0;
  return { ticks, report };
}

const iso = (ticks: readonly number[]) => ticks.map((t) => new Date(t).toISOString());

it('a round enqueues the reference model\'s ticks after the cursor, the latest maxMissed of them, and counts the rest as skipped', timeout(1_000), async () => {
  const policy = fc.oneof(
    fc.constant({ missed: 'latest' as const, maxMissed: 1 }),
    fc.integer({ min: 1, max: 10_000 }).map((maxMissed) => ({ missed: 'all' as const, maxMissed })),
    fc.constant({ missed: 'all' as const, maxMissed: 10_000 }),
  );
  await fc.assert(
    fc.asyncProperty(scheduleWindow, policy, async ({ zone, spec, from, lengthMs }, { missed, maxMissed }) => {
      const name = await addSchedule({ cron: spec, timezone: zone, missed, maxMissed }, from);
      const { ticks, report } = await roundAt(name, from + lengthMs);
      await schedules.remove(name);
      const expected = referenceTicks(spec, zone, from, from + lengthMs);
      const due = expected.slice(-maxMissed);
      expect(iso(ticks), `${spec} in ${zone}, (${iso([from])}, ${iso([from + lengthMs])}]`).toEqual(iso(due));
      const round = report.schedules.find((s) => s.schedule === name)!;
      expect(round.skipped).toBe(Math.min(expected.length - due.length, MAX_COUNTED_SKIPS));
    }),
    options,
  );
});

it('rounds at later and later instants enqueue every tick of the reference model once, in order, and nothing else', timeout(2_000), async () => {
  const plan = zoneChange.chain(({ zone, change, hours }) =>
    fc.record({
      zone: fc.constant(zone),
      spec: cron5(hours),
      from: windowAround(change, 24 * HOUR).map((window) => window.from),
      gaps: fc.array(fc.integer({ min: 0, max: (12 * HOUR) / 1000 }).map((s) => s * 1000), { minLength: 1, maxLength: 8 }),
    }),
  );
  await fc.assert(
    fc.asyncProperty(plan, async ({ zone, spec, from, gaps }) => {
      const name = await addSchedule({ cron: spec, timezone: zone, missed: 'all', maxMissed: 10_000 }, from);
      const recording = recordingScheduler();
      const enqueued: number[] = [];
      let now = from;
      for (const gap of gaps) {
        now += gap;
        enqueued.push(...(await roundAt(name, now, recording)).ticks);
      }
      await schedules.remove(name);
      expect(iso(enqueued), `${spec} in ${zone} from ${iso([from])}`).toEqual(iso(referenceTicks(spec, zone, from, now)));
    }),
    options,
  );
});

it('the next tick a listing shows is the first tick a later round enqueues, and the reference model\'s next tick', timeout(1_500), async () => {
  await fc.assert(
    fc.asyncProperty(scheduleWindow, fc.integer({ min: 0, max: 7_200 }), async ({ zone, spec, from }, lateSeconds) => {
      const name = await addSchedule({ cron: spec, timezone: zone, missed: 'latest' }, from);
      const shown = (await schedules.get(name))!.nextTick?.getTime() ?? null;
      const reference = referenceTicks(spec, zone, from, from + 3 * DAY)[0];
      const where = `${spec} in ${zone} after ${iso([from])}`;
      if (reference !== undefined) expect(shown === null ? null : iso([shown]), where).toEqual(iso([reference]));
      else expect(shown === null || shown > from + 3 * DAY, where).toBe(true);
      if (shown !== null) {
        // A round at the tick or later, before the tick after it: with 'latest' it enqueues exactly the tick shown.
        const following = referenceTicks(spec, zone, shown, shown + lateSeconds * 1000 + 1)[0];
        const at = following === undefined ? shown + lateSeconds * 1000 : Math.min(shown + lateSeconds * 1000, following - 1);
        expect(iso((await roundAt(name, at)).ticks), where).toEqual(iso([shown]));
      }
      await schedules.remove(name);
    }),
    options,
  );
});

it('a daily expression at a fixed time enqueues one tick on each local day, on the days the clock changes too', timeout(1_000), async () => {
  const plan = zoneChange.chain(({ zone, change, hours }) =>
    fc.integer({ min: 2, max: 6 }).chain((days) =>
      fc.record({ zone: fc.constant(zone), spec: dailyFixedTime(hours), from: windowAround(change, days * DAY).map((window) => window.from), days: fc.constant(days) }),
    ),
  );
  await fc.assert(
    fc.asyncProperty(plan, async ({ zone, spec, from, days }) => {
      const to = from + days * DAY;
      const name = await addSchedule({ cron: spec, timezone: zone, missed: 'all', maxMissed: 100 }, from);
      const { ticks } = await roundAt(name, to);
      await schedules.remove(name);
      const dayOf = (t: number) => new Date(localTimeOf(t, zone)).toISOString().slice(0, 10);
      const perDay = new Map<string, string[]>();
      for (const tick of ticks) perDay.set(dayOf(tick), [...(perDay.get(dayOf(tick)) ?? []), iso([tick])[0]!]);
      // Every local day wholly inside the window (not `from`'s, not `to`'s) has one tick; no day has two.
      const whole = new Set<string>();
      for (let t = from; t <= to; t += HOUR) whole.add(dayOf(t));
      whole.delete(dayOf(from));
      whole.delete(dayOf(to));
      const where = `${spec} in ${zone}, (${iso([from])}, ${iso([to])}]`;
      for (const day of whole) expect(perDay.get(day)?.length ?? 0, `${where} on ${day}: ${iso(ticks).join(', ')}`).toBe(1);
      expect([...perDay].filter(([, list]) => list.length > 1), where).toEqual([]);
    }),
    options,
  );
});

it('racing schedulers, their rounds read at instants the clock moves through, commit every tick of the reference model once and nothing else', timeout(4_000), async () => {
  const steps = fc.array(fc.record({ scheduler: fc.integer({ min: 0, max: 2 }), advanceMs: fc.integer({ min: 0, max: 3 * HOUR / 1000 }).map((s) => s * 1000), release: fc.nat(4) }), {
    minLength: 2,
    maxLength: 8,
  });
  const plan = zoneChange.chain(({ zone, change, hours }) =>
    fc.record({ zone: fc.constant(zone), spec: cron5(hours), from: windowAround(change, 12 * HOUR).map((window) => window.from), steps }),
  );
  await fc.assert(
    fc.asyncProperty(fc.scheduler(), plan, async (s, { zone, spec, from, steps: plan }) => {
      const to = from + plan.reduce((sum, step) => sum + step.advanceMs, 0);
      const expected = referenceTicks(spec, zone, from, to);
      fc.pre(expected.length <= 150);
      const name = await addSchedule({ cron: spec, timezone: zone, missed: 'all', maxMissed: 10_000 }, from);
      const scope = `schedule:${name}`;
      // Each scheduler's enqueuer says when its round has read the schedules (its first enqueue).
      const hasRead: Array<() => void> = [() => {}, () => {}, () => {}];
      const committing = (index: number): TickEnqueuer => ({
        async enqueue(tick) {
          hasRead[index]!();
          await s.schedule(Promise.resolve(`scheduler ${index} enqueues ${tick.key}`));
          const outcome = await keys.claim(tick.scope, tick.key, keys.fingerprint(tick.data));
          if (!isHeld(outcome)) return 'duplicate';
          await keys.runEffect(outcome, (tx) => insertEffect(tx, env.schema, { scope: tick.scope, key: tick.key, fence: outcome.fence, worker: `s${index}` }));
          return 'added';
        },
      });
      const schedulers = [0, 1, 2].map((index) => new Scheduler({ db: clock.db, schema: env.schema, enqueuer: committing(index), logger: silent }));
      const rounds: Array<Promise<unknown>> = [Promise.resolve(), Promise.resolve(), Promise.resolve()];
      let now = from;
      for (const step of plan) {
        // One round at a time per scheduler; rounds of different schedulers overlap, each reading the clock where the step moved it.
        await s.waitFor(rounds[step.scheduler]!);
        now += step.advanceMs;
        await clock.set(new Date(now));
        const read = new Promise<void>((resolve) => (hasRead[step.scheduler] = resolve));
        const round = schedulers[step.scheduler]!.runOnce();
        rounds[step.scheduler] = round;
        await Promise.race([read, round]);
        for (let n = 0; n < step.release && s.count() > 0; n++) await s.waitOne();
      }
      await s.waitFor(Promise.all(rounds));
      // A last round at the end of the window enqueues what the racing ones left.
      await clock.set(new Date(to));
      await s.waitFor(schedulers[0]!.runOnce());
      await schedules.remove(name);
      const { rows } = await sql<{ key: string; n: number }>`
        select key, count(*)::int as n from ${sql.id(env.schema, 'effects')} where scope = ${scope} group by key order by key`.execute(env.db);
      const report = s.report().map((task) => task.label).join(' > ');
      expect(rows.filter((row) => row.n !== 1), report).toEqual([]);
      expect(rows.map((row) => row.key).sort(), `${spec} in ${zone} from ${iso([from])}: ${report}`).toEqual(iso(expected).sort());
    }),
    { ...options, numRuns: Math.max(1, Math.ceil(RUNS / 2)) },
  );
});
