import { ValidationError } from '../errors.js';
import { findJsonProblem, describeJsonProblem } from '../json-limits.js';
import type { MissedTicksPolicy, ScheduleInput, ScheduleKind } from '../store/records.js';
import { CronCalendar } from './cron-calendar.js';
import { hashSeedOf } from './schedule-ticks.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** The shortest interval a schedule may have: the scheduler looks for due ticks about once a second. */
export const MIN_SCHEDULE_INTERVAL_MS = 1_000;
/** The most missed ticks one round may enqueue for a schedule (`maxMissed`'s bound). */
export const MAX_MISSED_TICKS = 10_000;
/** The longest schedule name: its scope `schedule:<name>` must fit the 255 characters of a scope. */
export const MAX_SCHEDULE_NAME_LENGTH = 200;

/** A schedule: when its ticks are (`cron` or `every`) and the job each tick enqueues. */
export interface ScheduleOptions {
  /** The schedule's name, unique; each tick's idempotency scope is `schedule:<name>`. 1–200 characters. */
  readonly name: string;
  /**
   * A cron expression of 5 fields (minute first) or 6 (second first), as `cron-parser` reads it:
   * `'0 * * * *'` is every hour on the hour. Exactly one of `cron` and `every`.
   * @defaultValue none
   */
  readonly cron?: string;
  /**
   * A fixed interval in milliseconds (at least 1000). Ticks are the multiples of it since the
   * Unix epoch (`every: 60_000` ticks at each whole minute), so they do not depend on when the
   * schedule was added or which scheduler computes them. Exactly one of `cron` and `every`.
   * @defaultValue none
   */
  readonly every?: number;
  /** The IANA time zone the cron expression is read in. Ignored for `every`. @defaultValue `'UTC'` */
  readonly timezone?: string;
  /** The BullMQ queue each tick's job is added to. */
  readonly queue: string;
  /** The job name of each tick's job. @defaultValue the schedule's `name` */
  readonly jobName?: string;
  /** The payload of each tick's job (JSON). @defaultValue `null` */
  readonly data?: unknown;
  /**
   * Ticks missed while no scheduler ran: `'latest'` enqueues only the latest of them; `'all'`
   * enqueues each of them, the latest `maxMissed` if there are more.
   * @defaultValue `'latest'`
   */
  readonly missed?: MissedTicksPolicy;
  /** With `missed: 'all'`, at most this many missed ticks are enqueued (the latest ones); 1–10000. @defaultValue `100` */
  readonly maxMissed?: number;
}

const SCHEDULE_OPTION_NAMES = optionNames<ScheduleOptions>()(['name', 'cron', 'every', 'timezone', 'queue', 'jobName', 'data', 'missed', 'maxMissed']);

/** Checks a schedule's options and gives the row to store; throws `ValidationError` (`INVALID_OPTIONS`) saying what is wrong. */
export function toScheduleInput(options: ScheduleOptions): ScheduleInput {
  if (options === null || typeof options !== 'object') throw invalid('schedule', 'A schedule must be an object with a name, a queue and a cron or every.');
  const name = assertScheduleName(options.name);
  const where = `schedule "${name}"`;
  refuseUnknownOptions(options, SCHEDULE_OPTION_NAMES, where);
  const queue = nonEmptyText(options.queue, 'queue', where);
  const jobName = options.jobName === undefined ? name : nonEmptyText(options.jobName, 'jobName', where);
  const timezone = options.timezone ?? 'UTC';
  if (typeof timezone !== 'string' || !isTimeZone(timezone)) {
    throw invalid('timezone', `${where}: timezone ${JSON.stringify(timezone)} is not an IANA time zone (e.g. 'UTC', 'Europe/Paris').`);
  }
  let kind: ScheduleKind;
  let spec: string;
  if (options.cron !== undefined && options.every !== undefined) {
    throw invalid('cron', `${where}: give either cron or every, not both.`);
  } else if (options.cron !== undefined) {
    kind = 'cron';
    spec = options.cron;
    assertCron(spec, name, where);
  } else if (options.every !== undefined) {
    kind = 'interval';
    const every = options.every;
    if (!Number.isSafeInteger(every) || every < MIN_SCHEDULE_INTERVAL_MS) {
      throw invalid('every', `${where}: every must be a whole number of milliseconds, at least ${MIN_SCHEDULE_INTERVAL_MS}; got ${String(every)}.`);
    }
    spec = String(every);
  } else {
    throw invalid('cron', `${where}: give a cron expression (cron: '0 * * * *') or an interval (every: 60_000).`);
  }
  const missed = options.missed ?? 'latest';
  if (missed !== 'latest' && missed !== 'all') throw invalid('missed', `${where}: missed must be 'latest' or 'all'; got ${JSON.stringify(missed)}.`);
  const maxMissed = missed === 'latest' ? 1 : (options.maxMissed ?? 100);
  if (!Number.isSafeInteger(maxMissed) || maxMissed < 1 || maxMissed > MAX_MISSED_TICKS) {
    throw invalid('maxMissed', `${where}: maxMissed must be a whole number from 1 to ${MAX_MISSED_TICKS}; got ${String(options.maxMissed)}.`);
  }
  const data = options.data ?? null;
  const problem = findJsonProblem(data, { maxDepth: 64, allowNul: false });
  if (problem) throw invalid('data', `${where}: data ${describeJsonProblem(problem)}.`);
  return { name, kind, spec, timezone, queue, jobName, payloadJson: JSON.stringify(data), missed, maxMissed };
}

/** Checks a schedule name (used by remove as well as upsert). */
export function assertScheduleName(name: unknown): string {
  if (typeof name !== 'string' || name.length === 0) throw invalid('name', 'A schedule needs a name: a non-empty string.');
  if ([...name].length > MAX_SCHEDULE_NAME_LENGTH) {
    throw invalid('name', `Schedule name is ${[...name].length} characters long; at most ${MAX_SCHEDULE_NAME_LENGTH} are allowed.`);
  }
  if (name.includes('\u0000')) throw invalid('name', 'A schedule name must not contain NUL characters.');
  return name;
}

function assertCron(spec: unknown, name: string, where: string): void {
  if (typeof spec !== 'string' || spec.trim() === '') throw invalid('cron', `${where}: cron must be a non-empty cron expression such as '0 * * * *'.`);
  const fields = spec.trim().split(/\s+/).length;
  // cron-parser fills in missing fields (an empty text is every second): require 5 or 6 so that a typo is refused, not read as another schedule.
  if (fields !== 5 && fields !== 6) {
    throw invalid('cron', `${where}: cron ${JSON.stringify(spec)} has ${fields} fields; give 5 (minute hour day month weekday) or 6 (second first).`);
  }
  try {
    new CronCalendar(spec, hashSeedOf(name));
  } catch (error) {
    throw invalid('cron', `${where}: cron ${JSON.stringify(spec)} is not a valid expression: ${error instanceof Error ? error.message : String(error)}.`);
  }
}

function nonEmptyText(value: unknown, field: string, where: string): string {
  if (typeof value !== 'string' || value.trim() === '') throw invalid(field, `${where}: ${field} must be a non-empty string.`);
  return value;
}

function isTimeZone(zone: string): boolean {
  try {
    new Intl.DateTimeFormat('en', { timeZone: zone });
    return true;
  } catch {
    return false;
  }
}

function invalid(field: string, message: string): ValidationError {
  return new ValidationError('INVALID_OPTIONS', `schedule.${field}`, message);
}
