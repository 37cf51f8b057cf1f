/**
 * A time zone's UTC offset as a function of the instant, read from the runtime's time zone data
 * (`Intl`), as spans of constant offset. A schedule's cron expression is read in local wall time;
 * turning local times into instants across a clock change needs to know where the offset
 * changes, which `Intl` does not say directly: each UTC year's changes are found once (an offset
 * sampled every 12 hours, each change narrowed down to the second) and kept per zone.
 */

/** A span of instants `[start, end)` (ms since the epoch) over which a zone's offset is `offsetMs`. */
export interface OffsetSpan {
  readonly start: number;
  readonly end: number;
  /** Local wall time minus UTC, in ms (+05:45 is 20,700,000). */
  readonly offsetMs: number;
}

const SECOND = 1_000;
const HOUR = 3_600_000;
const SAMPLE_MS = 12 * HOUR;
/** Years of spans kept per zone: a scheduler reads a handful of years; an unbounded cache would grow with every year a walk visits. */
const MAX_YEARS_PER_ZONE = 64;

const zones = new Map<string, ZoneOffsets>();

/** The offsets of an IANA zone (one instance per zone, shared). Throws `RangeError` for a zone `Intl` does not know. */
export function zoneOffsets(timeZone: string): ZoneOffsets {
  let zone = zones.get(timeZone);
  if (!zone) {
    zone = new ZoneOffsets(timeZone);
    zones.set(timeZone, zone);
  }
  return zone;
}

/** One zone's offsets; see {@link zoneOffsets}. */
export class ZoneOffsets {
  readonly #format: Intl.DateTimeFormat;
  /** Per UTC year, its spans in order; every year is cut at its first instant, so that a year is computed alone. */
  readonly #years = new Map<number, readonly OffsetSpan[]>();
  /** The span found last: a walk asks for the same span tick after tick. */
  #last: OffsetSpan = { start: 0, end: 0, offsetMs: 0 };

  constructor(readonly timeZone: string) {
    this.#format = new Intl.DateTimeFormat('en-US', {
      timeZone,
      hourCycle: 'h23',
      year: 'numeric',
      month: 'numeric',
      day: 'numeric',
      hour: 'numeric',
      minute: 'numeric',
      second: 'numeric',
    });
  }

  /** The span holding instant `t` (a span ends at the next change of offset, or at the end of t's UTC year). */
  spanAt(t: number): OffsetSpan {
    if (t >= this.#last.start && t < this.#last.end) return this.#last;
    const spans = this.#spansOf(new Date(t).getUTCFullYear());
    let low = 0;
    let high = spans.length - 1;
    while (low < high) {
      const middle = (low + high + 1) >> 1;
      if (spans[middle]!.start <= t) low = middle;
      else high = middle - 1;
    }
    this.#last = spans[low]!;
    return this.#last;
  }

  /** The offset at instant `t`, in ms. */
  offsetAt(t: number): number {
    return this.spanAt(t).offsetMs;
  }

  #spansOf(year: number): readonly OffsetSpan[] {
    let spans = this.#years.get(year);
    if (!spans) {
      if (this.#years.size >= MAX_YEARS_PER_ZONE) this.#years.clear();
      spans = this.#computeYear(year);
      this.#years.set(year, spans);
    }
    return spans;
  }

  #computeYear(year: number): OffsetSpan[] {
    const start = Date.UTC(year, 0, 1);
    const end = Date.UTC(year + 1, 0, 1);
    const spans: OffsetSpan[] = [];
    let spanStart = start;
    let offset = this.#offsetOfSecond(start);
    // Sampled every 12 hours; a change between two samples is narrowed to the second, and the
    // search goes on from it, so that a second change before the next sample is found too.
    for (let from = start; from < end - SECOND; ) {
      const probe = Math.min(from + SAMPLE_MS, end - SECOND);
      if (this.#offsetOfSecond(probe) === offset) {
        from = probe;
        continue;
      }
      const change = this.#firstChange(from, probe, offset);
      spans.push({ start: spanStart, end: change, offsetMs: offset });
      spanStart = change;
      offset = this.#offsetOfSecond(change);
      from = change;
    }
    spans.push({ start: spanStart, end, offsetMs: offset });
    return spans;
  }

  /** The first whole second in `(from, to]` whose offset is not `offset` (one exists: `to`'s). */
  #firstChange(from: number, to: number, offset: number): number {
    let low = Math.floor(from / SECOND);
    let high = Math.floor(to / SECOND);
    while (high - low > 1) {
      const middle = Math.floor((low + high) / 2);
      if (this.#offsetOfSecond(middle * SECOND) === offset) low = middle;
      else high = middle;
    }
    return high * SECOND;
  }

  /** The offset at a whole second `t`: the local wall time `Intl` gives, read as if it were UTC, minus `t`. */
  #offsetOfSecond(t: number): number {
    const parts: Record<string, string> = {};
    for (const part of this.#format.formatToParts(t)) parts[part.type] = part.value;
    const local = Date.UTC(Number(parts.year), Number(parts.month) - 1, Number(parts.day), Number(parts.hour), Number(parts.minute), Number(parts.second));
    return local - Math.floor(t / SECOND) * SECOND;
  }
}
