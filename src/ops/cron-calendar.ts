import { CronExpressionParser, type CronExpression } from 'cron-parser';

/**
 * A cron expression's matching wall-clock times, with no zone: each a *local time* written as
 * milliseconds since the epoch as if it were UTC (2026-03-29 02:00 is `Date.UTC(2026, 2, 29, 2)`
 * whatever the zone). Which days match (month, day of month, day of week, `L`, `#`, `H`) is
 * `cron-parser`'s reading, asked in UTC, where no clock changes; the times of a matching day
 * come from the expression's second, minute and hour values. `cron-ticks.ts` turns local times
 * into instants in a zone.
 */

const DAY_SECONDS = 86_400;
const DAY_MS = 86_400_000;
/** Days looked at one by one before `cron-parser`'s own search takes over (a day rarer than yearly: 29 February, a fifth Monday of February). */
const SCANNED_DAYS = 400;
/** Days whose match is remembered (a walk over ten thousand daily ticks looks at each day once). */
const REMEMBERED_DAYS = 4_096;

/** The local times of a cron expression (5 fields, minute first, or 6, second first). */
export class CronCalendar {
  readonly #expression: CronExpression;
  readonly #seconds: readonly number[];
  readonly #minutes: readonly number[];
  readonly #hours: readonly number[];
  readonly #months: ReadonlySet<number>;
  /** The first matching time of any day, in seconds since midnight: a day matches if this time of it does. */
  readonly #firstOfDay: number;
  readonly #days = new Map<number, boolean>();
  /**
   * True when neither the minute nor the hour field starts with `*` (`0 2 * * *`, `30 1,13 * * *`):
   * the expression names fixed times of day, each fired once per day however the clock changes.
   * False for `0 * * * *` or `* 2 * * *`: it fires at every instant whose local time matches.
   * (The rule of Vixie cron and cronie for jobs at fixed times and "wildcard" jobs.)
   */
  readonly fixedTime: boolean;

  /** Parses `spec`; `hashSeed` makes `H` the same value for every scheduler (the schedule's name). Throws `cron-parser`'s error. */
  constructor(spec: string, hashSeed: string) {
    this.#expression = CronExpressionParser.parse(spec, { tz: 'UTC', hashSeed });
    const fields = this.#expression.fields;
    this.#seconds = numbers(fields.second.values);
    this.#minutes = numbers(fields.minute.values);
    this.#hours = numbers(fields.hour.values);
    this.#months = new Set(numbers(fields.month.values));
    this.#firstOfDay = this.#hours[0]! * 3600 + this.#minutes[0]! * 60 + this.#seconds[0]!;
    const words = spec.trim().split(/\s+/);
    const [minute, hour] = words.length === 6 ? words.slice(1, 3) : words.slice(0, 2);
    this.fixedTime = !minute!.startsWith('*') && !hour!.startsWith('*');
  }

  /** The first matching local time strictly after `local`; null when there is none. */
  after(local: number): number | null {
    const from = Math.floor(local / 1000) + 1;
    let day = Math.floor(from / DAY_SECONDS);
    let time = from - day * DAY_SECONDS;
    for (let scanned = 0; scanned < SCANNED_DAYS; scanned++, day++, time = 0) {
      if (!this.#matchesDay(day)) continue;
      const at = this.#timeAtOrAfter(time);
      if (at !== null) return (day * DAY_SECONDS + at) * 1000;
    }
    return this.#search(day * DAY_MS - 1, 'next');
  }

  /** The last matching local time strictly before `local`; null when there is none. */
  before(local: number): number | null {
    const until = Math.ceil(local / 1000) - 1;
    let day = Math.floor(until / DAY_SECONDS);
    let time = until - day * DAY_SECONDS;
    for (let scanned = 0; scanned < SCANNED_DAYS; scanned++, day--, time = DAY_SECONDS - 1) {
      if (!this.#matchesDay(day)) continue;
      const at = this.#timeAtOrBefore(time);
      if (at !== null) return (day * DAY_SECONDS + at) * 1000;
    }
    return this.#search((day + 1) * DAY_MS, 'prev');
  }

  #matchesDay(day: number): boolean {
    let matches = this.#days.get(day);
    if (matches === undefined) {
      const first = new Date((day * DAY_SECONDS + this.#firstOfDay) * 1000);
      matches = this.#months.has(first.getUTCMonth() + 1) && this.#expression.includesDate(first);
      if (this.#days.size >= REMEMBERED_DAYS) this.#days.clear();
      this.#days.set(day, matches);
    }
    return matches;
  }

  /** `cron-parser`'s own search from `local` (for days too rare to scan); null when it finds none. */
  #search(local: number, direction: 'next' | 'prev'): number | null {
    try {
      this.#expression.reset(new Date(local));
      return (direction === 'next' ? this.#expression.next() : this.#expression.prev()).getTime();
    } catch {
      // cron-parser gives up after its loop limit: no matching time it can find.
      return null;
    }
  }

  /** The first matching time of a day at or after `time` (seconds since midnight), or null. */
  #timeAtOrAfter(time: number): number | null {
    const hour = Math.floor(time / 3600);
    const minute = Math.floor((time % 3600) / 60);
    if (this.#hours.includes(hour)) {
      if (this.#minutes.includes(minute)) {
        const second = atOrAfter(this.#seconds, time % 60);
        if (second !== undefined) return hour * 3600 + minute * 60 + second;
      }
      const laterMinute = atOrAfter(this.#minutes, minute + 1);
      if (laterMinute !== undefined) return hour * 3600 + laterMinute * 60 + this.#seconds[0]!;
    }
    const laterHour = atOrAfter(this.#hours, hour + 1);
    return laterHour === undefined ? null : laterHour * 3600 + this.#minutes[0]! * 60 + this.#seconds[0]!;
  }

  /** The last matching time of a day at or before `time` (seconds since midnight), or null. */
  #timeAtOrBefore(time: number): number | null {
    const hour = Math.floor(time / 3600);
    const minute = Math.floor((time % 3600) / 60);
    if (this.#hours.includes(hour)) {
      if (this.#minutes.includes(minute)) {
        const second = atOrBefore(this.#seconds, time % 60);
        if (second !== undefined) return hour * 3600 + minute * 60 + second;
      }
      const earlierMinute = atOrBefore(this.#minutes, minute - 1);
      if (earlierMinute !== undefined) return hour * 3600 + earlierMinute * 60 + this.#seconds.at(-1)!;
    }
    const earlierHour = atOrBefore(this.#hours, hour - 1);
    return earlierHour === undefined ? null : earlierHour * 3600 + this.#minutes.at(-1)! * 60 + this.#seconds.at(-1)!;
  }
}

/** A field's values, which are numbers for seconds, minutes, hours and months, sorted. */
function numbers(values: readonly (number | string)[]): number[] {
  return values.map(Number).sort((a, b) => a - b);
}

function atOrAfter(sorted: readonly number[], value: number): number | undefined {
  return sorted.find((each) => each >= value);
}

function atOrBefore(sorted: readonly number[], value: number): number | undefined {
  return sorted.findLast((each) => each <= value);
}
