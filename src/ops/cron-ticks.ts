import { CronCalendar } from './cron-calendar.js';
import { zoneOffsets, type ZoneOffsets } from './zone-offsets.js';

/**
 * A cron expression's ticks in a time zone: the instants it fires at, by the rule of cron
 * implementations (Vixie cron, cronie) on the days the zone's clock changes.
 *
 * - A **fixed-time** expression (neither its minute nor its hour field starts with `*`) fires
 *   each local time it names once: at the first instant the zone's clock reads that time or
 *   later. A time the clock skips (a spring-forward) fires at the first instant after the gap;
 *   a time the clock shows twice (a fall-back) fires at its first occurrence. Several skipped
 *   times fire as one tick, the gap's end.
 * - Any other expression (`0 * * * *`, `* * * * *`, a step such as every 15 minutes) fires at every instant whose local time
 *   matches: a skipped time not at all, a repeated time at both occurrences (an hourly
 *   expression runs every real hour).
 *
 * Both walk directions read one definition, so the ticks a round finds due and the next tick
 * shown are the same instants. For a fixed-time expression: let `high(t)` be the latest local
 * time the clock has shown by instant `t`; the tick of local time `m` is the first `t` with
 * `high(t) ≥ m`, which grows with `m`, so the ticks after `t` are those of the local times after
 * `high(t)`, in order. Instants are ms since the epoch; local times are ms as if UTC.
 */
export class CronTicks {
  readonly #calendar: CronCalendar;
  readonly #zone: ZoneOffsets;

  /** Throws `cron-parser`'s error for a bad expression, `RangeError` for an unknown zone. */
  constructor(spec: string, timeZone: string, hashSeed: string) {
    this.#calendar = new CronCalendar(spec, hashSeed);
    this.#zone = zoneOffsets(timeZone);
  }

  /** Whether the expression names fixed times of day (see the class). */
  get fixedTime(): boolean {
    return this.#calendar.fixedTime;
  }

  /** The first tick after instant `after`; null when there is none. */
  next(after: number): number | null {
    return this.nextWithLocalTime(after)?.at ?? null;
  }

  /**
   * The first tick after instant `after`, with the local time it fires for: the tick's own local
   * time, except for a fixed time the clock skipped, which fires at the end of the gap.
   */
  nextWithLocalTime(after: number): { readonly at: number; readonly localTime: number } | null {
    if (this.#calendar.fixedTime) {
      const local = this.#calendar.after(this.#highWater(after));
      return local === null ? null : { at: this.#firstReaching(local), localTime: local };
    }
    for (let from = after + 1, spans = 0; spans < MAX_SPANS; spans++) {
      const span = this.#zone.spanAt(from);
      const local = this.#calendar.after(from + span.offsetMs - 1);
      if (local === null) return null;
      if (local - span.offsetMs < span.end) return { at: local - span.offsetMs, localTime: local };
      from = span.end;
    }
    return null;
  }

  /** The last tick at or before instant `atOrBefore`; null when there is none. */
  prev(atOrBefore: number): number | null {
    if (this.#calendar.fixedTime) {
      const local = this.#calendar.before(this.#highWater(atOrBefore) + 1);
      return local === null ? null : this.#firstReaching(local);
    }
    for (let until = atOrBefore, spans = 0; spans < MAX_SPANS; spans++) {
      const span = this.#zone.spanAt(until);
      const local = this.#calendar.before(until + span.offsetMs + 1);
      if (local === null) return null;
      if (local - span.offsetMs >= span.start) return local - span.offsetMs;
      until = span.start - 1;
    }
    return null;
  }

  /** The zone's offset at instant `t`, in ms. */
  offsetAt(t: number): number {
    return this.#zone.offsetAt(t);
  }

  /** The latest local time the zone's clock has shown at any instant up to `t` (after a fall-back, the time it showed before falling back). */
  #highWater(t: number): number {
    // A clock falls back by less than a day, so only the last two days' spans can have shown a later time.
    let span = this.#zone.spanAt(t - TWO_DAYS);
    let high = -Infinity;
    for (;;) {
      high = Math.max(high, Math.min(span.end - 1, t) + span.offsetMs);
      if (span.end > t) return high;
      span = this.#zone.spanAt(span.end);
    }
  }

  /** The first instant at which the zone's clock reads local time `local` or later. */
  #firstReaching(local: number): number {
    // Offsets stay within a day of UTC: two days before, every instant's clock reads earlier.
    let span = this.#zone.spanAt(local - TWO_DAYS);
    while (span.end - 1 + span.offsetMs < local) span = this.#zone.spanAt(span.end);
    return Math.max(span.start, local - span.offsetMs);
  }
}

const TWO_DAYS = 2 * 86_400_000;
/** Spans of constant offset a walk crosses before it gives up (each UTC year is at least one: over a century). */
const MAX_SPANS = 400;
