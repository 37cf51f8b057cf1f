import { EventEmitter } from 'node:events';
import type { Kysely } from 'kysely';
import type { Logger } from 'pino';
import { ScheduleStore } from '../store/schedule-store.js';
import type { ScheduleRow } from '../store/records.js';
import { nextTick, ticksDue } from './schedule-ticks.js';
import { scheduleScope, tickKey } from './schedules.js';
import { defaultLogger } from '../default-logger.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** One tick's job, as the scheduler hands it to its {@link TickEnqueuer}. */
export interface ScheduledTick {
  /** The schedule's name. */
  readonly schedule: string;
  /** The tick's time (the database's clock decided it was due). */
  readonly tick: Date;
  /** The BullMQ queue. */
  readonly queue: string;
  /** The job name. */
  readonly name: string;
  /** The idempotency scope, `schedule:<name>`. */
  readonly scope: string;
  /** The idempotency key, the tick's time in ISO 8601. */
  readonly key: string;
  /** The schedule's payload. */
  readonly data: unknown;
}

/**
 * Where the scheduler's ticks go (`BullmqTickEnqueuer` adds them through `IdempotentProducer`).
 * Enqueuing the same tick twice must be harmless: the job id and key are the tick's own.
 */
export interface TickEnqueuer {
  /** Adds the tick's job under its deterministic id; `'duplicate'` when the queue already had it. */
  enqueue(tick: ScheduledTick): Promise<'added' | 'duplicate'>;
}

/** What one round did for one schedule. */
export interface ScheduleRoundReport {
  /** The schedule's name. */
  readonly schedule: string;
  /** Its due ticks handed to the enqueuer this round. */
  readonly enqueued: number;
  /** Of those, the ones the queue already had (another scheduler's). */
  readonly duplicates: number;
  /** Ticks since its cursor that its missed-ticks policy left out (counted up to 10,000 a round for a cron expression). */
  readonly skipped: number;
  /** The latest tick enqueued this round; null when none was due. */
  readonly latestTick: Date | null;
  /** How long after the latest tick's time it was enqueued, by the database's clock; null when none was due. */
  readonly lagMs: number | null;
  /** True when its enqueue failed (logged; retried next round). */
  readonly failed: boolean;
}

/** What one scheduler round did. */
export interface SchedulerReport {
  /** Ticks handed to the enqueuer (some may have been duplicates of another scheduler's). */
  readonly enqueued: number;
  /** Of those, the ones the queue already had. */
  readonly duplicates: number;
  /** Schedules whose round failed (logged); the next round tries them again. */
  readonly failed: number;
  /** The earliest next tick of any schedule, by the database's clock; null with no schedules. */
  readonly nextTick: Date | null;
  /** The database's `now()` when the round read the schedules. */
  readonly databaseNow: Date | null;
  /** Each schedule's part of the round, by name. */
  readonly schedules: readonly ScheduleRoundReport[];
}

/** Events of a {@link Scheduler}: `round` after each round that read the schedules (the metrics listen to it). */
export interface SchedulerEvents {
  /** A round ended: what it enqueued, skipped and failed. */
  round: [report: SchedulerReport];
}

/** Options of {@link Scheduler}. */
export interface SchedulerOptions {
  /** The database holding the `schedules` table. */
  readonly db: Kysely<any>;
  /** Postgres schema of the tables. @defaultValue `'idempotent_jobs'` */
  readonly schema?: string;
  /** Adds each due tick's job. */
  readonly enqueuer: TickEnqueuer;
  /** The longest wait between rounds (the scheduler also wakes for the next tick it knows of, and notices new schedules within this). @defaultValue `1_000` */
  readonly intervalMs?: number;
  /** Structured logger. @defaultValue pino at `LOG_LEVEL`, else `warn` */
  readonly logger?: Logger;
}

/**
 * Enqueues each schedule's due ticks: those after its cursor and at or before the database's
 * `now()` (never this process's clock), per its missed-ticks policy, each as a job with the
 * idempotency key `schedule:<name>` / `<tick time>`; then moves the cursor forward. Any number of
 * schedulers may run: they compute the same ticks, a tick enqueued twice is the same job
 * (deterministic job id) and the same key, so its effect commits once; a scheduler that stops
 * between enqueuing and moving the cursor is repeated by the next round, harmlessly.
 *
 * @example
 * ```ts
 * import { BullmqTickEnqueuer, Scheduler } from 'idempotent-jobs/process';
 *
 * const enqueuer = new BullmqTickEnqueuer({ connection: { url: 'redis://127.0.0.1:6379' } });
 * const scheduler = new Scheduler({ db, enqueuer });
 * scheduler.start();
 * // … on shutdown
 * await scheduler.stop();
 * await enqueuer.close();
 * ```
 */
export class Scheduler extends EventEmitter<SchedulerEvents> {
  readonly #store: ScheduleStore;
  readonly #enqueuer: TickEnqueuer;
  readonly #intervalMs: number;
  readonly #log: Logger;
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<unknown> | undefined;
  #stopped = false;

  constructor(options: SchedulerOptions) {
    super();
    refuseUnknownOptions(options, optionNames<SchedulerOptions>()(['db', 'schema', 'enqueuer', 'intervalMs', 'logger']), 'new Scheduler(options)');
    const schema = options.schema ?? 'idempotent_jobs';
    this.#store = new ScheduleStore(options.db, schema);
    this.#enqueuer = options.enqueuer;
    this.#intervalMs = options.intervalMs ?? 1_000;
    if (!Number.isFinite(this.#intervalMs) || this.#intervalMs <= 0) {
      throw new RangeError(`Scheduler intervalMs must be a positive number of milliseconds; got ${this.#intervalMs}.`);
    }
    this.#log = (options.logger ?? defaultLogger()).child({ component: 'scheduler', schema });
  }

  /** Runs a round now, then again at the next tick or after `intervalMs`, whichever is sooner, until {@link stop}. */
  start(): void {
    if (this.#timer || this.#running || this.#stopped) return;
    this.#loop();
  }

  /** Stops the rounds and waits for one in progress. */
  async stop(): Promise<void> {
    this.#stopped = true;
    clearTimeout(this.#timer);
    this.#timer = undefined;
    await this.#running;
  }

  /**
   * One round over every schedule: each one's due ticks enqueued, then every cursor moved in one
   * statement. A schedule whose enqueue fails is logged, keeps its cursor, and is retried next round.
   */
  async runOnce(): Promise<SchedulerReport> {
    const rows = await this.#store.list();
    let earliest: Date | null = null;
    const schedules: ScheduleRoundReport[] = [];
    const done: Array<{ name: string; cursor: Date; lastTick: Date | null }> = [];
    for (const row of rows) {
      try {
        const round = await this.#enqueueDue(row);
        schedules.push(round);
        // Up to the database's now even when no tick was due: the missed ticks a policy skipped are skipped for good.
        done.push({ name: row.name, cursor: row.db_now, lastTick: round.latestTick });
      } catch (error) {
        schedules.push({ schedule: row.name, enqueued: 0, duplicates: 0, skipped: 0, latestTick: null, lagMs: null, failed: true });
        this.#log.warn({ err: error, schedule: row.name }, 'schedule round failed; the next round enqueues its due ticks again (same keys)');
      }
      const next = nextTick(row, row.db_now);
      if (next && (!earliest || next < earliest)) earliest = next;
    }
    // Only after the ticks: a round cut short repeats them next time, never skips one.
    await this.#store.advance(done);
    const report: SchedulerReport = {
      enqueued: sum(schedules, (s) => s.enqueued),
      duplicates: sum(schedules, (s) => s.duplicates),
      failed: schedules.filter((s) => s.failed).length,
      nextTick: earliest,
      databaseNow: rows[0]?.db_now ?? null,
      schedules,
    };
    this.emit('round', report);
    return report;
  }

  async #enqueueDue(row: ScheduleRow): Promise<ScheduleRoundReport> {
    const { ticks, skipped } = ticksDue({ ...row, maxMissed: row.max_missed }, row.cursor, row.db_now);
    let duplicates = 0;
    for (const tick of ticks) {
      const outcome = await this.#enqueuer.enqueue({
        schedule: row.name,
        tick,
        queue: row.queue,
        name: row.job_name,
        scope: scheduleScope(row.name),
        key: tickKey(tick),
        data: row.payload,
      });
      if (outcome === 'duplicate') duplicates += 1;
    }
    if (ticks.length > 0) this.#log.debug({ schedule: row.name, ticks: ticks.map(tickKey), duplicates, skipped }, 'ticks enqueued');
    if (skipped > 0) this.#log.info({ schedule: row.name, skipped, missed: row.missed }, 'missed ticks left out by the schedule\'s missed-ticks policy');
    const latestTick = ticks.at(-1) ?? null;
    return {
      schedule: row.name,
      enqueued: ticks.length,
      duplicates,
      skipped,
      latestTick,
      lagMs: latestTick ? row.db_now.getTime() - latestTick.getTime() : null,
      failed: false,
    };
  }

  #loop(): void {
    const round = this.runOnce().then(
      (report) => {
        // Wake for the next tick by the database's clock (its distance from the database's now), never by comparing with this process's clock.
        const untilNext = report.nextTick && report.databaseNow ? report.nextTick.getTime() - report.databaseNow.getTime() : Infinity;
        return Math.max(10, Math.min(this.#intervalMs, untilNext));
      },
      (error: unknown) => {
        this.#log.warn({ err: error }, 'scheduler round failed (schedules unreadable); retrying');
        return this.#intervalMs;
      },
    );
    this.#running = round.then((delayMs) => {
      this.#running = undefined;
      if (this.#stopped) return;
      this.#timer = setTimeout(() => {
        this.#timer = undefined;
        this.#loop();
      }, delayMs);
      this.#timer.unref();
    });
  }
}

function sum<T>(items: readonly T[], of: (item: T) => number): number {
  return items.reduce((total, item) => total + of(item), 0);
}
