/**
 * The `--dst-schedulers` key-feature profile: racing schedulers on the days the clock changes.
 *
 * Cron schedules in Europe/Paris, Europe/London and Europe/Helsinki (fixed times inside the hour
 * that is skipped or repeated, daily ones, an hourly and a quarter-hourly one, one with seconds),
 * ticked by 3 maintenance processes that are killed and restarted at seeded times, their wall
 * clocks off as in `--racing-schedulers`. What crosses the changes is the schedulers' notion of
 * the database's `now()`: their sessions connect with a `search_path` that finds the `now()` of
 * schema `dst_clock` before `pg_catalog.now()` (`test/support/database-clock.ts`), a clock that
 * runs fast through 90 minutes around the fall-back of 25 October 2026 (01:00 UTC) in the first
 * half of the chaos phase, then jumps to 90 minutes around the spring-forward of 28 March 2027
 * in the second half (every missed tick between, enqueued at once: `missed: 'all'`). The workers
 * and the harness keep Postgres's own clock. The checker (`dst-schedule-checks.ts`) compares each
 * schedule's effects with the reference model's ticks (`test/support/cron-reference.ts`).
 */
import { sql, type Kysely } from 'kysely';
import { Schedules, scheduleScope } from '../../src/index.js';
import { clockedUrl, createClockSchema, setClockPieces, type ClockPiece } from '../support/database-clock.js';
import { referenceTicks } from '../support/cron-reference.js';
import { checkDstSchedulers, clockAtReal, type DstScheduleHistory } from './dst-schedule-checks.js';
import type { KeyFeatureCheck } from './key-feature-checks.js';
import type { ExecutionRow } from './checker.js';
import { MaintenanceFleet } from './maintenance-fleet.js';

const MINUTE = 60_000;

/** The profile's clock, schedules and schedulers. */
export const DST_PROFILE = {
  clockSchema: 'dst_clock',
  schedulers: 3,
  /** The changes the clock runs through: Europe's fall-back of 2026 and spring-forward of 2027, both at 01:00 UTC. */
  changes: [Date.UTC(2026, 9, 25, 1), Date.UTC(2027, 2, 28, 1)],
  /** The clock's time around each change (half before it, half after). */
  windowMs: 90 * MINUTE,
  payload: { n: -1, workMs: 20 },
  schedules: [
    // Daily at a fixed time in the hour the clock repeats or skips: once every local day.
    { name: 'dst-daily-paris', cron: '30 2 * * *', timezone: 'Europe/Paris', daily: true },
    { name: 'dst-daily-london', cron: '30 1 * * *', timezone: 'Europe/London', daily: true },
    // Any hour or minute, on Sundays of March and October: every instant that matches.
    { name: 'dst-hourly-paris', cron: '0 * * 3,10 0', timezone: 'Europe/Paris', daily: false },
    { name: 'dst-quarter-helsinki', cron: '*/15 * * 3,10 0', timezone: 'Europe/Helsinki', daily: false },
    // Seconds of a fixed minute in the changed hour: once each on the fall-back day, one tick for all on the spring-forward day.
    { name: 'dst-seconds-paris', cron: '*/20 30 2 * 3,10 0', timezone: 'Europe/Paris', daily: false },
  ],
} as const;

/** The schedulers' clock: held at the first window's start until the chaos phase, then the two windows. */
export function dstClockPieces(realStart: Date, chaosMs: number): ClockPiece[] {
  const [fall, spring] = DST_PROFILE.changes;
  const half = chaosMs / 2;
  const rate = DST_PROFILE.windowMs / half;
  return [
    { fromReal: realStart, clockAt: new Date(fall! - DST_PROFILE.windowMs / 2), rate },
    { fromReal: new Date(realStart.getTime() + half), clockAt: new Date(spring! - DST_PROFILE.windowMs / 2), rate },
  ];
}

/** The profile during a run (its part of `KeyFeatureRun`). */
export class DstSchedulesRun {
  readonly #db: Kysely<any>;
  readonly #schema: string;
  readonly #queue: string;
  readonly #fleet: MaintenanceFleet;
  #pieces: ClockPiece[] = [];
  readonly #start = new Date(DST_PROFILE.changes[0]! - DST_PROFILE.windowMs / 2);

  constructor(options: {
    readonly db: Kysely<any>;
    readonly schema: string;
    readonly queue: string;
    /** The maintenance processes' environment (`DATABASE_URL` is clocked here). */
    readonly env: Readonly<Record<string, string>>;
    readonly clockSkewsMs: readonly number[];
  }) {
    this.#db = options.db;
    this.#schema = options.schema;
    this.#queue = options.queue;
    this.#fleet = new MaintenanceFleet({
      count: DST_PROFILE.schedulers,
      env: { ...options.env, DATABASE_URL: clockedUrl(options.env.DATABASE_URL!, DST_PROFILE.clockSchema), JANITOR_ENABLED: 'false', SCHEDULER_INTERVAL_MS: '200' },
      clockSkewsMs: options.clockSkewsMs,
    });
  }

  get fleet(): MaintenanceFleet {
    return this.#fleet;
  }

  /** The clock held at the first window's start, the schedules with their cursors there, the schedulers started. */
  async start(): Promise<void> {
    await createClockSchema(this.#db, DST_PROFILE.clockSchema);
    this.#pieces = [{ fromReal: await this.#realNow(), clockAt: this.#start, rate: 0 }];
    await setClockPieces(this.#db, DST_PROFILE.clockSchema, this.#pieces);
    const schedules = new Schedules({ db: this.#db, schema: this.#schema });
    for (const schedule of DST_PROFILE.schedules) {
      await schedules.upsert({ name: schedule.name, cron: schedule.cron, timezone: schedule.timezone, queue: this.#queue, data: DST_PROFILE.payload, missed: 'all', maxMissed: 10_000 });
    }
    await sql`update ${sql.id(this.#schema, 'schedules')} set cursor = ${this.#start} where name like 'dst-%'`.execute(this.#db);
    this.#fleet.start();
    await this.#fleet.ready();
  }

  /**
   * Runs the clock through the first window, then jumps to the second: at half the chaos phase,
   * or later if the schedulers have not yet moved every cursor past the first window's change
   * (schedulers killed together take tens of seconds to start again on a busy machine), until
   * `giveUp`.
   */
  async runClock(chaosMs: number, giveUp: AbortSignal): Promise<void> {
    const [first, second] = dstClockPieces(await this.#realNow(), chaosMs);
    this.#pieces = [this.#pieces[0]!, first!];
    await setClockPieces(this.#db, DST_PROFILE.clockSchema, this.#pieces);
    await sleep(chaosMs / 2, giveUp);
    await this.#cursorsPast(DST_PROFILE.changes[0]! + DST_PROFILE.windowMs / 4, giveUp);
    this.#pieces = [...this.#pieces, { ...second!, fromReal: await this.#realNow() }];
    await setClockPieces(this.#db, DST_PROFILE.clockSchema, this.#pieces);
  }

  /** After the chaos phase: waits (until `giveUp`) for the schedulers to move every cursor past the second change, then stops them. */
  async stop(giveUp: AbortSignal): Promise<void> {
    await this.#cursorsPast(DST_PROFILE.changes[1]! + DST_PROFILE.windowMs / 4, giveUp);
    await this.#fleet.stop();
  }

  /** Waits until every schedule's cursor is past `clockTime` (or `giveUp`). */
  async #cursorsPast(clockTime: number, giveUp: AbortSignal): Promise<void> {
    while (!giveUp.aborted) {
      const { rows } = await sql<{ cursor: Date }>`
        select min(cursor) as cursor from ${sql.id(this.#schema, 'schedules')} where name like 'dst-%'`
        .execute(this.#db)
        .catch(() => ({ rows: [] as Array<{ cursor: Date }> }));
      if (rows[0] && rows[0].cursor.getTime() > clockTime) return;
      await sleep(1_000, giveUp);
    }
  }

  /** Whether an effect row is one of the profile's ticks. */
  owns(row: ExecutionRow): boolean {
    return DST_PROFILE.schedules.some((schedule) => row.scope === scheduleScope(schedule.name));
  }

  /** Each schedule's effects against the reference model's ticks from the first window's start to its cursor. */
  async check(effects: readonly ExecutionRow[]): Promise<KeyFeatureCheck> {
    const histories: DstScheduleHistory[] = [];
    for (const schedule of DST_PROFILE.schedules) {
      const scope = scheduleScope(schedule.name);
      const { rows } = await sql<{ cursor: Date }>`select cursor from ${sql.id(this.#schema, 'schedules')} where name = ${schedule.name}`.execute(this.#db);
      const own = effects.filter((row) => row.scope === scope);
      // Up to the cursor, or the newest tick that ran if later (a scheduler killed after enqueuing it, before moving the cursor).
      const end = Math.max(rows[0]!.cursor.getTime(), ...own.map((row) => Date.parse(row.key)).filter(Number.isFinite));
      const { rows: claimed } = await sql<{ key: string; at: number }>`
        select key, extract(epoch from created_at)::float8 * 1000 as at from ${sql.id(this.#schema, 'idempotency_keys')} where scope = ${scope}`.execute(this.#db);
      const firstSeenReal = new Map<string, number>();
      for (const { key, at } of [...claimed, ...own.map((row) => ({ key: row.key, at: row.at }))]) firstSeenReal.set(key, Math.min(firstSeenReal.get(key) ?? Infinity, Number(at)));
      histories.push({
        name: schedule.name,
        cron: schedule.cron,
        timezone: schedule.timezone,
        daily: schedule.daily,
        from: this.#start.getTime(),
        to: end,
        expectedTicks: referenceTicks(schedule.cron, schedule.timezone, this.#start.getTime(), end).map((t) => new Date(t).toISOString()),
        effects: own,
        firstSeenOnClock: new Map([...firstSeenReal].map(([key, real]) => [key, clockAtReal(this.#pieces, real)])),
      });
    }
    return checkDstSchedulers({ schedules: histories, changes: DST_PROFILE.changes, pieces: this.#pieces, kills: this.#fleet.kills, starts: this.#fleet.starts });
  }

  async #realNow(): Promise<Date> {
    // The harness's pool: a fault of the nemesis may have closed its connection; the next query opens one.
    const { rows } = await sql<{ now: Date }>`select pg_catalog.now() as now`.execute(this.#db);
    return rows[0]!.now;
  }
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => (clearTimeout(timer), resolve()), { once: true });
  });
}
