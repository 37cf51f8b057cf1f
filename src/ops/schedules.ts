import type { Kysely } from 'kysely';
import { ScheduleStore } from '../store/schedule-store.js';
import type { MissedTicksPolicy, ScheduleKind, ScheduleRow } from '../store/records.js';
import { assertScheduleName, toScheduleInput, type ScheduleOptions } from './schedule-spec.js';
import { nextTickInZone } from './schedule-ticks.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** A stored schedule, as {@link Schedules.list} shows it. */
export interface ScheduleInfo {
  /** The schedule's name; its ticks' scope is `schedule:<name>`. */
  readonly name: string;
  /** `'cron'` or `'interval'`. */
  readonly kind: ScheduleKind;
  /** The cron expression, or the interval in milliseconds as text. */
  readonly spec: string;
  /** The IANA time zone the cron expression is read in. */
  readonly timezone: string;
  /** The BullMQ queue of each tick's job. */
  readonly queue: string;
  /** The job name of each tick's job. */
  readonly jobName: string;
  /** The payload of each tick's job. */
  readonly data: unknown;
  /** What a round does with ticks missed while no scheduler ran. */
  readonly missed: MissedTicksPolicy;
  /** With `missed: 'all'`, the most missed ticks enqueued (1 with `'latest'`). */
  readonly maxMissed: number;
  /** The latest tick enqueued; null before the first. */
  readonly lastTick: Date | null;
  /**
   * The next tick to enqueue (after the later of the cursor and the database's now); null when a
   * cron expression has no more. The tick a round enqueues when it comes due: on the days the
   * zone's clock changes too (docs/guide.md#schedules, "Clock changes").
   */
  readonly nextTick: Date | null;
  /** The next tick as the schedule's zone's clock reads it, `2026-03-29T03:00:00+02:00` (`+00:00` for an interval); null with no next tick. */
  readonly nextTickLocal: string | null;
  /**
   * When the next tick stands for a local time the zone's clock skips (a fixed-time expression's
   * time inside a spring-forward gap, fired at the first instant after it), that local time,
   * `2026-03-29T02:00:00`; otherwise null.
   */
  readonly nextTickSkippedLocalTime: string | null;
}

/** The idempotency scope of a schedule's ticks: `schedule:<name>`. Each tick's key is its time in ISO 8601 (UTC, milliseconds). */
export function scheduleScope(name: string): string {
  return `schedule:${name}`;
}

/** The idempotency key of a tick: its time in ISO 8601, `2026-12-02T04:00:00.000Z`. */
export function tickKey(tick: Date): string {
  return tick.toISOString();
}

/** Options of {@link Schedules}. */
export interface SchedulesOptions {
  /** The database holding the `schedules` table (migration `020_schedules`). */
  readonly db: Kysely<any>;
  /** Postgres schema of the tables. @defaultValue `'idempotent_jobs'` */
  readonly schema?: string;
}

/**
 * Adds, changes, removes and lists schedules, stored in Postgres. A scheduler (`Scheduler` of
 * `idempotent-jobs/process`, run by the maintenance process) enqueues each tick's job with the idempotency key
 * `schedule:<name>` / `<tick time>`, so a tick's effect commits once however many schedulers run.
 *
 * @example
 * ```ts
 * import { Schedules } from 'idempotent-jobs';
 *
 * const schedules = new Schedules({ db });
 * await schedules.upsert({ name: 'nightly-report', cron: '0 2 * * *', timezone: 'Europe/Paris', queue: 'reports' });
 * await schedules.upsert({ name: 'poll-rates', every: 60_000, queue: 'rates', missed: 'all', maxMissed: 10 });
 * for (const s of await schedules.list()) console.log(s.name, s.lastTick, s.nextTick);
 * await schedules.remove('poll-rates');
 * ```
 */
export class Schedules {
  readonly #store: ScheduleStore;

  constructor(options: SchedulesOptions) {
    refuseUnknownOptions(options, optionNames<SchedulesOptions>()(['db', 'schema']), 'new Schedules(options)');
    this.#store = new ScheduleStore(options.db, options.schema ?? 'idempotent_jobs');
  }

  /**
   * Creates the schedule, or changes it (keeping the ticks already enqueued: a tick is never
   * enqueued again because its schedule changed, or was removed and added again). Its first tick
   * is the first after the database's `now()`. Throws `ValidationError` (`INVALID_OPTIONS`) for a
   * bad cron expression, interval, time zone or policy, before anything is stored.
   */
  async upsert(options: ScheduleOptions): Promise<ScheduleInfo> {
    return toScheduleInfo(await this.#store.upsert(toScheduleInput(options)));
  }

  /** Removes a schedule; false if there was none of that name. Adding it again later does not repeat its past ticks. */
  async remove(name: string): Promise<boolean> {
    return this.#store.remove(assertScheduleName(name));
  }

  /** The schedules, by name, with their last and next ticks. */
  async list(): Promise<ScheduleInfo[]> {
    return (await this.#store.list()).map(toScheduleInfo);
  }

  /** One schedule, or undefined. */
  async get(name: string): Promise<ScheduleInfo | undefined> {
    const [row] = await this.#store.list(assertScheduleName(name));
    return row ? toScheduleInfo(row) : undefined;
  }
}

/** A stored row as the API shows it. */
export function toScheduleInfo(row: ScheduleRow): ScheduleInfo {
  const after = row.cursor > row.db_now ? row.cursor : row.db_now;
  const next = nextTickInZone(row, after);
  return {
    name: row.name,
    kind: row.kind,
    spec: row.spec,
    timezone: row.timezone,
    queue: row.queue,
    jobName: row.job_name,
    data: row.payload,
    missed: row.missed,
    maxMissed: row.max_missed,
    lastTick: row.last_tick,
    nextTick: next?.at ?? null,
    nextTickLocal: next?.localTime ?? null,
    nextTickSkippedLocalTime: next?.skippedLocalTime ?? null,
  };
}
