/**
 * fast-check generators for the schedule properties: cron expressions of 5 and 6 fields (the
 * forms the reference model reads: numbers, ranges, steps, lists), time zones whose clocks change
 * (and zones with odd offsets), and windows of time around their changes of 2019–2030.
 */
import fc from 'fast-check';
import { localTimeOf, offsetChanges } from './cron-reference.js';

/**
 * Zones with every kind of change: Europe and North America; Lord Howe's 30-minute change;
 * Troll's 2-hour one; Chatham (+12:45), Adelaide (+09:30), St John's (−03:30); changes at
 * midnight (Santiago, Havana, Tehran until 2022); Casablanca's Ramadan changes; Apia's last
 * ones (2021); and zones that keep one offset (Kathmandu +05:45, UTC).
 */
export const ZONES = [
  'Europe/Paris',
  'America/New_York',
  'Australia/Lord_Howe',
  'Antarctica/Troll',
  'Pacific/Chatham',
  'Australia/Adelaide',
  'America/St_Johns',
  'America/Santiago',
  'America/Havana',
  'Asia/Tehran',
  'Africa/Casablanca',
  'Pacific/Apia',
  'Asia/Kathmandu',
  'UTC',
] as const;

const HOUR = 3_600_000;
const RANGE = { from: Date.UTC(2019, 0, 1), to: Date.UTC(2031, 0, 1) };
const changes = new Map<string, number[]>();

/** The zone's offset changes in 2019–2030 (found once per zone, by the reference model). */
export function changesOf(zone: string): number[] {
  let found = changes.get(zone);
  if (!found) {
    found = offsetChanges(zone, RANGE.from, RANGE.to, 24 * HOUR);
    changes.set(zone, found);
  }
  return found;
}

/**
 * A zone and an instant at which its clock changes (or any instant of 2026–2030 for a zone that
 * keeps its offset), with the local hours around it: the hours an expression must name to meet
 * the change.
 */
export interface ZoneChange {
  readonly zone: string;
  readonly change: number;
  /** Local hours just before and at the change, and the hour either side. */
  readonly hours: readonly number[];
}

export const zoneChange: fc.Arbitrary<ZoneChange> = fc.constantFrom(...ZONES).chain((zone) => {
  const near = changesOf(zone);
  const anywhere = fc.integer({ min: Date.UTC(2026, 0, 1) / 1000, max: Date.UTC(2031, 0, 1) / 1000 - 1 }).map((s) => s * 1000);
  const instant = near.length === 0 ? anywhere : fc.oneof({ weight: 6, arbitrary: fc.constantFrom(...near) }, { weight: 1, arbitrary: anywhere });
  return instant.map((change) => {
    const around = [change - 60_000, change].map((t) => new Date(localTimeOf(t, zone)).getUTCHours());
    const hours = [...new Set(around.flatMap((h) => [(h + 23) % 24, h, (h + 1) % 24]))];
    return { zone, change, hours };
  });
});

/** A window `(from, to]` of `lengthMs` holding `change` (mostly), or starting within `lengthMs` of it. */
export function windowAround(change: number, longestMs: number): fc.Arbitrary<{ from: number; lengthMs: number }> {
  return fc.integer({ min: Math.min(600, longestMs / 1000), max: longestMs / 1000 }).chain((seconds) => {
    const lengthMs = seconds * 1000;
    const holding = fc.integer({ min: 0, max: seconds }).map((before) => change - before * 1000);
    const near = fc.integer({ min: -seconds, max: seconds }).map((offset) => change + offset * 1000);
    return fc.oneof({ weight: 4, arbitrary: holding }, { weight: 1, arbitrary: near }).map((from) => ({ from, lengthMs }));
  });
}

const step = (max: number) => fc.integer({ min: 2, max });

/** A cron field of values `min`–`max`: `*`, a step, a value, a range, a range with a step, a list. */
function cronField(min: number, max: number, values: fc.Arbitrary<number> = fc.integer({ min, max })): fc.Arbitrary<string> {
  const range = fc.tuple(values, values).map(([a, b]): [number, number] => (a <= b ? [a, b] : [b, a]));
  return fc.oneof(
    { weight: 2, arbitrary: fc.constant('*') },
    { weight: 1, arbitrary: step(Math.min(30, max - min + 1)).map((n) => `*/${n}`) },
    { weight: 3, arbitrary: values.map(String) },
    { weight: 2, arbitrary: range.map(([a, b]) => `${a}-${b}`) },
    { weight: 1, arbitrary: fc.tuple(range, step(10)).map(([[a, b], n]) => `${a}-${b}/${n}`) },
    { weight: 2, arbitrary: fc.uniqueArray(values, { minLength: 2, maxLength: 4 }).map((list) => list.join(',')) },
  );
}

/** Hours of the change (mostly), and any. */
const hourNear = (hours: readonly number[]) => fc.oneof({ weight: 3, arbitrary: fc.constantFrom(...hours) }, { weight: 1, arbitrary: fc.integer({ min: 0, max: 23 }) });

/** Day fields: mostly `*`; days of month up to 28, so that every month has them (cron-parser refuses a day no listed month has). */
const dayOfMonth = fc.oneof({ weight: 8, arbitrary: fc.constant('*') }, { weight: 1, arbitrary: cronField(1, 28) });
const month = fc.oneof({ weight: 8, arbitrary: fc.constant('*') }, { weight: 1, arbitrary: cronField(1, 12) });
/** Days of week 0–6, and 7 (Sunday again) alone or ending a range: cron-parser refuses a list naming Sunday twice. */
const dayOfWeek = fc.oneof({ weight: 16, arbitrary: fc.constant('*') }, { weight: 2, arbitrary: cronField(0, 6) }, { weight: 1, arbitrary: fc.constantFrom('7', '5-7', '1-7/2') });

/** A 5-field expression (minute first), its hours mostly those of `hours`. */
export function cron5(hours: readonly number[]): fc.Arbitrary<string> {
  return fc.tuple(cronField(0, 59), cronField(0, 23, hourNear(hours)), dayOfMonth, month, dayOfWeek).map((fields) => fields.join(' '));
}

/** A 6-field expression (second first); its seconds are rarely `*`, so that a few hours hold no more than some thousands of ticks. */
export function cron6(hours: readonly number[]): fc.Arbitrary<string> {
  const second = fc.oneof({ weight: 1, arbitrary: fc.constant('*') }, { weight: 6, arbitrary: cronField(0, 59).filter((f) => f !== '*') });
  return fc.tuple(second, cronField(0, 59), cronField(0, 23, hourNear(hours)), dayOfMonth, month, dayOfWeek).map((fields) => fields.join(' '));
}

/** A daily expression at one fixed time, with or without seconds (`30 2 * * *`, `15 30 2 * * *`), its hour mostly one of `hours`. */
export function dailyFixedTime(hours: readonly number[]): fc.Arbitrary<string> {
  return fc
    .tuple(fc.option(fc.integer({ min: 0, max: 59 }), { nil: undefined }), fc.integer({ min: 0, max: 59 }), hourNear(hours))
    .map(([second, minute, h]) => (second === undefined ? `${minute} ${h} * * *` : `${second} ${minute} ${h} * * *`));
}

/** A zone, an expression meeting one of its changes, and a window `(from, from + lengthMs]` around it: up to 3 days (5 fields) or 3 hours (6). */
export const scheduleWindow = zoneChange.chain(({ zone, change, hours }) =>
  fc.boolean().chain((withSeconds) =>
    fc
      .tuple(withSeconds ? cron6(hours) : cron5(hours), windowAround(change, withSeconds ? 3 * HOUR : 72 * HOUR))
      .map(([spec, { from, lengthMs }]) => ({ zone, spec, from, lengthMs })),
  ),
);
