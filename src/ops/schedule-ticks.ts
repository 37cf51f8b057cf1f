import type { MissedTicksPolicy, ScheduleKind } from '../store/records.js';
import { CronTicks } from './cron-ticks.js';

/**
 * A schedule's ticks: which are due in a round, how many its missed-ticks policy leaves out,
 * and the next one. Pure functions of the schedule and the database's times, so every scheduler
 * computes the same ticks. The due ticks are the forward walk of {@link nextTick}: the tick a
 * listing shows next is the tick a later round enqueues.
 */

/** What the tick functions read of a schedule. */
export interface TickRule {
  /** The schedule's name: `H` in a cron expression is drawn from it, the same for every scheduler. */
  readonly name: string;
  readonly kind: ScheduleKind;
  readonly spec: string;
  readonly timezone: string;
  readonly missed: MissedTicksPolicy;
  readonly maxMissed: number;
}

/** Most missed ticks {@link ticksDue} counts in one call (a cron of every second after days of downtime would otherwise be counted one by one). */
export const MAX_COUNTED_SKIPS = 10_000;

/** A schedule's ticks as a set of instants (ms), walked either way. */
interface TickSet {
  /** The first tick after `after`, or null. */
  next(after: number): number | null;
  /** The last tick at or before `atOrBefore`, or null. */
  prev(atOrBefore: number): number | null;
  /** The number of ticks in `(after, until]`, when it can be computed without a walk. */
  count?(after: number, until: number): number;
}

/** Ticks at the multiples of `every` since the epoch. */
function intervalTicks(every: number): TickSet {
  return {
    next: (after) => (Math.floor(after / every) + 1) * every,
    prev: (atOrBefore) => Math.floor(atOrBefore / every) * every,
    count: (after, until) => Math.floor(until / every) - Math.floor(after / every),
  };
}

const sets = new Map<string, TickSet>();
/** Tick sets kept (parsed once, with their zone's offsets and remembered days): more than a deployment's schedules. */
const MAX_SETS = 1_024;

/** The schedule's tick set, parsed once per definition. Throws for a cron expression or zone that no longer parses. */
function tickSetOf(rule: Pick<TickRule, 'name' | 'kind' | 'spec' | 'timezone'>): TickSet {
  const id = `${rule.kind}\n${rule.spec}\n${rule.timezone}\n${rule.name}`;
  let set = sets.get(id);
  if (!set) {
    set = rule.kind === 'interval' ? intervalTicks(Number(rule.spec)) : new CronTicks(rule.spec, rule.timezone, hashSeedOf(rule.name));
    if (sets.size >= MAX_SETS) sets.clear();
    sets.set(id, set);
  }
  return set;
}

/** The seed of `H` in a schedule's cron expression: its scope, never empty (an empty seed would make `cron-parser` draw at random). */
export function hashSeedOf(name: string): string {
  return `schedule:${name}`;
}

/** The ticks a round enqueues and the missed ticks its policy leaves out. */
export interface DueTicks {
  /** The due ticks, oldest first. */
  readonly ticks: Date[];
  /** Ticks after the cursor left out by the missed-ticks policy; counted exactly for an interval, up to {@link MAX_COUNTED_SKIPS} for a cron expression. */
  readonly skipped: number;
}

/**
 * The ticks due: those after `cursor` and at or before `now` (both the database's), oldest
 * first; only the latest one with `missed: 'latest'`, the latest `maxMissed` with `'all'`. Found
 * backwards from `now` for at most `maxMissed` ticks (a cursor months back costs no more), then
 * walked forwards from the first of them with {@link nextTick}'s walk.
 */
export function ticksDue(rule: TickRule, cursor: Date, now: Date): DueTicks {
  const after = cursor.getTime();
  const until = now.getTime();
  if (until <= after) return { ticks: [], skipped: 0 };
  const set = tickSetOf(rule);
  const limit = rule.missed === 'latest' ? 1 : rule.maxMissed;
  let first: number | null = null;
  let found = 0;
  for (let tick = set.prev(until); tick !== null && tick > after && found < limit; tick = set.prev(tick - 1)) {
    first = tick;
    found += 1;
  }
  if (first === null) return { ticks: [], skipped: 0 };
  const ticks: Date[] = [];
  for (let tick = set.next(first - 1); tick !== null && tick <= until && ticks.length < limit; tick = set.next(tick)) ticks.push(new Date(tick));
  if (set.count) return { ticks, skipped: Math.max(0, set.count(after, until) - ticks.length) };
  let skipped = 0;
  for (let tick = set.prev(first - 1); tick !== null && tick > after && skipped < MAX_COUNTED_SKIPS; tick = set.prev(tick - 1)) skipped += 1;
  return { ticks, skipped };
}

/** The due ticks of {@link ticksDue}, oldest first. */
export function dueTicks(rule: TickRule, cursor: Date, now: Date): Date[] {
  return ticksDue(rule, cursor, now).ticks;
}

/** The first tick after `after`, or null when the cron expression has no more. */
export function nextTick(rule: Pick<TickRule, 'name' | 'kind' | 'spec' | 'timezone'>, after: Date): Date | null {
  const tick = tickSetOf(rule).next(after.getTime());
  return tick === null ? null : new Date(tick);
}

/** The next tick as the schedule's clock reads it. */
export interface TickInZone {
  /** The tick. */
  readonly at: Date;
  /** Its local time with the zone's offset then, `2026-03-29T03:00:00+02:00` (`+00:00` for an interval). */
  readonly localTime: string;
  /** A local time the zone's clock skipped, which fires at this tick (the first instant after the gap), `2026-03-29T02:00:00`; null for a tick at its own local time. */
  readonly skippedLocalTime: string | null;
}

/** The first tick after `after`, with its local time and, for a fixed time the clock skipped, that time; null when there is none. */
export function nextTickInZone(rule: Pick<TickRule, 'name' | 'kind' | 'spec' | 'timezone'>, after: Date): TickInZone | null {
  const set = tickSetOf(rule);
  if (!(set instanceof CronTicks)) {
    const tick = set.next(after.getTime());
    return tick === null ? null : { at: new Date(tick), localTime: wallTime(tick, 0), skippedLocalTime: null };
  }
  const next = set.nextWithLocalTime(after.getTime());
  if (!next) return null;
  const offset = set.offsetAt(next.at);
  return {
    at: new Date(next.at),
    localTime: wallTime(next.at, offset),
    skippedLocalTime: next.localTime === next.at + offset ? null : new Date(next.localTime).toISOString().slice(0, 19),
  };
}

/** `2026-03-29T03:00:00+02:00`: instant `at` on a clock `offsetMs` from UTC (seconds of the offset shown when it has any). */
function wallTime(at: number, offsetMs: number): string {
  const local = new Date(at + offsetMs).toISOString().slice(0, 19);
  const sign = offsetMs < 0 ? '-' : '+';
  const total = Math.abs(offsetMs) / 1000;
  const hh = String(Math.floor(total / 3600)).padStart(2, '0');
  const mm = String(Math.floor((total % 3600) / 60)).padStart(2, '0');
  const ss = total % 60 === 0 ? '' : `:${String(total % 60).padStart(2, '0')}`;
  return `${local}${sign}${hh}:${mm}${ss}`;
}
