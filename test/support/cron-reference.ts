/**
 * A reference model of a cron schedule's ticks, for the property tests and the chaos checker:
 * a brute-force walk over real instants, second by second (6 fields) or minute by minute (5),
 * each instant's local wall time read from `Intl.DateTimeFormat`, applying the rule of
 * docs/guide.md#schedules as written there. It shares nothing with the library's tick code
 * (no cron-parser, no offset spans), so a disagreement is a bug in one of them.
 *
 * Field forms read: `*`, `?` (days), numbers, `a-b`, steps (`/n` after `*`, `a-b` or `a`) and lists.
 * Day of month and day of week: when both are restricted (neither is exactly `*` or `?`), a day
 * matching either matches; otherwise both must match (cron-parser's reading, as the guide says).
 */

const MINUTE = 60_000;
const HOUR = 3_600_000;

/** A parsed expression of the forms above. */
export interface ReferenceCron {
  readonly seconds: ReadonlySet<number>;
  readonly minutes: ReadonlySet<number>;
  readonly hours: ReadonlySet<number>;
  readonly daysOfMonth: ReadonlySet<number>;
  readonly months: ReadonlySet<number>;
  readonly daysOfWeek: ReadonlySet<number>;
  readonly daysEither: boolean;
  readonly withSeconds: boolean;
  /** Neither the minute nor the hour field starts with `*`. */
  readonly fixedTime: boolean;
}

/** Parses a 5- or 6-field expression of the forms the model reads; throws for others. */
export function parseReferenceCron(spec: string): ReferenceCron {
  const words = spec.trim().split(/\s+/);
  if (words.length !== 5 && words.length !== 6) throw new Error(`reference cron: ${spec} has ${words.length} fields`);
  const withSeconds = words.length === 6;
  const [second, minute, hour, dom, month, dow] = withSeconds ? words : ['0', ...words];
  const domRestricted = dom !== '*' && dom !== '?';
  const dowRestricted = dow !== '*' && dow !== '?';
  return {
    seconds: field(second!, 0, 59),
    minutes: field(minute!, 0, 59),
    hours: field(hour!, 0, 23),
    daysOfMonth: field(dom!, 1, 31),
    months: field(month!, 1, 12),
    daysOfWeek: new Set([...field(dow!, 0, 7)].map((day) => day % 7)),
    daysEither: domRestricted && dowRestricted,
    withSeconds,
    fixedTime: !minute!.startsWith('*') && !hour!.startsWith('*'),
  };
}

function field(text: string, min: number, max: number): Set<number> {
  const values = new Set<number>();
  for (const item of text.split(',')) {
    const [range, stepText] = item.split('/');
    const step = stepText === undefined ? 1 : Number(stepText);
    let from: number;
    let to: number;
    if (range === '*' || range === '?') [from, to] = [min, max];
    else if (range!.includes('-')) [from, to] = range!.split('-').map(Number) as [number, number];
    else [from, to] = [Number(range), stepText === undefined ? Number(range) : max];
    if (![from, to, step].every(Number.isInteger) || from < min || to > max || from > to || step < 1) throw new Error(`reference cron: field ${text}`);
    for (let value = from; value <= to; value += step) values.add(value);
  }
  return values;
}

/** A local wall time as ms if it were UTC (`Date.UTC` of its fields). */
type LocalTime = number;

/** Whether local time `local` (ms as if UTC) matches. */
export function matchesLocal(cron: ReferenceCron, local: LocalTime): boolean {
  const d = new Date(local);
  if (!cron.seconds.has(d.getUTCSeconds()) || !cron.minutes.has(d.getUTCMinutes()) || !cron.hours.has(d.getUTCHours())) return false;
  return dayMatches(cron, local);
}

const formats = new Map<string, Intl.DateTimeFormat>();

/** The local wall time of instant `t` in `zone`, by `Intl` (ms as if UTC). */
export function localTimeOf(t: number, zone: string): LocalTime {
  let format = formats.get(zone);
  if (!format) {
    format = new Intl.DateTimeFormat('en-US', { timeZone: zone, hourCycle: 'h23', year: 'numeric', month: 'numeric', day: 'numeric', hour: 'numeric', minute: 'numeric', second: 'numeric' });
    formats.set(zone, format);
  }
  const p: Record<string, number> = {};
  for (const part of format.formatToParts(t)) if (part.type !== 'literal') p[part.type] = Number(part.value);
  return Date.UTC(p.year!, p.month! - 1, p.day!, p.hour!, p.minute!, p.second!) + (t % 1000);
}

/**
 * The ticks of `spec` in `zone` after `from` and at or before `to` (ms), oldest first, by a walk
 * over every whole second (6 fields) or minute (5), from a day before `from` (to know the latest
 * local time the clock had shown): a fixed-time expression ticks at the first instant whose
 * local time passes a matching local time the clock had not shown yet; any other at each instant
 * whose local time matches.
 *
 * Local time is the instant plus the zone's offset, read with `Intl` at each end of every span
 * between the zone's changes ({@link offsetChanges}). The walk leaps over the rest of a local
 * day or hour that the expression cannot match, where no earlier local time is left to show.
 */
export function referenceTicks(spec: string, zone: string, from: number, to: number): number[] {
  const cron = parseReferenceCron(spec);
  const step = cron.withSeconds ? 1_000 : MINUTE;
  const walkFrom = Math.floor(from / MINUTE) * MINUTE - 26 * HOUR;
  const ticks: number[] = [];
  // As if the clock had shown every local time before the walk's first instant.
  let highest = localTimeOf(walkFrom, zone) - step;
  for (const span of offsetSpans(zone, walkFrom, to + step)) {
    for (let t = span.start; t < span.end && t <= to; ) {
      const local = t + span.offsetMs;
      let tick = false;
      if (!cron.fixedTime) tick = matchesLocal(cron, local);
      else if (local > highest) {
        // Every local time newly shown, `(highest, local]`: one step's worth, or a whole gap.
        for (let shown = Math.floor(highest / step) * step + step; shown <= local && !tick; shown += step) tick = matchesLocal(cron, shown);
      }
      if (tick && t > from) ticks.push(t);
      // The next instant to look at: the next step, or past local times that cannot match (none left unshown before them).
      let next = t + step;
      if (local >= highest) {
        const unit = !dayMatches(cron, local) ? DAY : !cron.hours.has(new Date(local).getUTCHours()) ? HOUR : 0;
        if (unit > 0) next = Math.max(next, Math.min(span.end, Math.floor(local / unit) * unit + unit - span.offsetMs));
      }
      highest = Math.max(highest, next - step + span.offsetMs);
      t = next;
    }
  }
  return ticks;
}

const DAY = 24 * HOUR;

/** Whether local time `local`'s day matches the expression's month, day of month and day of week. */
function dayMatches(cron: ReferenceCron, local: LocalTime): boolean {
  const d = new Date(local);
  if (!cron.months.has(d.getUTCMonth() + 1)) return false;
  const dom = cron.daysOfMonth.has(d.getUTCDate());
  const dow = cron.daysOfWeek.has(d.getUTCDay());
  return cron.daysEither ? dom || dow : dom && dow;
}

/** The spans of constant offset covering `[from, to)`, each offset read with `Intl` at both ends (they must agree). */
function offsetSpans(zone: string, from: number, to: number): Array<{ start: number; end: number; offsetMs: number }> {
  const bounds = [from, ...offsetChanges(zone, from, to, HOUR).filter((change) => change > from && change < to), to];
  return bounds.slice(0, -1).map((start, index) => {
    const end = bounds[index + 1]!;
    const offsetMs = localTimeOf(start, zone) - start;
    if (localTimeOf(end - 1, zone) - (end - 1) !== offsetMs) throw new Error(`reference cron: ${zone}'s offset changes inside ${new Date(start).toISOString()}–${new Date(end).toISOString()}`);
    return { start, end, offsetMs };
  });
}

/**
 * The instants in `[from, to)` at which `zone`'s offset changes, by `Intl` sampled every
 * `sampleMs` and narrowed to the minute (the changes of the years the tests use are at whole
 * minutes, and weeks apart).
 */
export function offsetChanges(zone: string, from: number, to: number, sampleMs = 6 * HOUR): number[] {
  const offset = (t: number) => localTimeOf(t, zone) - t;
  const changes: number[] = [];
  for (let t = from; t < to; t += sampleMs) {
    if (offset(t) === offset(t + sampleMs)) continue;
    let low = t;
    let high = t + sampleMs;
    while (high - low > MINUTE) {
      const middle = Math.floor((low + high) / 2 / MINUTE) * MINUTE;
      if (middle <= low) break;
      if (offset(middle) === offset(t)) low = middle;
      else high = middle;
    }
    changes.push(high);
  }
  return changes;
}
