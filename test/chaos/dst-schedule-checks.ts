/**
 * The rules of the `--dst-schedulers` profile (`dst-schedules.ts`), over each schedule's effects
 * and the reference model's ticks. Pure, so `test/chaos-key-feature-checks.test.ts` can hold it
 * to hand-made histories.
 */
import type { ClockPiece } from '../support/database-clock.js';
import { localTimeOf } from '../support/cron-reference.js';
import type { ExecutionRow } from './checker.js';
import type { KeyFeatureCheck } from './key-feature-checks.js';

/** One schedule of the profile, as the run left it. */
export interface DstScheduleHistory {
  readonly name: string;
  readonly cron: string;
  readonly timezone: string;
  /** A daily fixed-time expression: one tick each local day. */
  readonly daily: boolean;
  /** The window checked, `(from, to]` (ms): from the first cursor to the last cursor, or the newest tick that ran if later. */
  readonly from: number;
  readonly to: number;
  /** The reference model's ticks in the window (ISO 8601, as the keys). */
  readonly expectedTicks: readonly string[];
  /** The schedule's effect rows (its scope). */
  readonly effects: readonly ExecutionRow[];
  /** Per tick key, the database's first sight of its job (key row created, first effect) on the schedulers' clock. */
  readonly firstSeenOnClock: ReadonlyMap<string, number>;
}

/** What {@link checkDstSchedulers} reads. */
export interface DstSchedulersHistory {
  readonly schedules: readonly DstScheduleHistory[];
  /** The changes the schedulers' clock was to run through (ms). */
  readonly changes: readonly number[];
  /** The schedulers' clock (reported). */
  readonly pieces: readonly ClockPiece[];
  /** Scheduler processes killed (SIGKILL) and started. */
  readonly kills: number;
  readonly starts: number;
}

/** The schedulers' clock at real time `real` (ms): the latest piece begun by then; before any, the first piece's time. */
export function clockAtReal(pieces: readonly ClockPiece[], real: number): number {
  const begun = pieces.filter((piece) => piece.fromReal !== 'now' && piece.fromReal.getTime() <= real);
  const piece = begun.at(-1) ?? pieces[0];
  if (!piece || piece.fromReal === 'now') throw new Error('clockAtReal: pieces need real start times');
  return piece.clockAt.getTime() + Math.max(0, real - piece.fromReal.getTime()) * piece.rate;
}

/**
 * Racing schedulers on DST days: each tick of the reference model in the window committed once,
 * none missed, no effect for a time that is not a tick; a daily fixed-time schedule has one
 * tick on each local day wholly inside the window; no tick's job seen by the database before
 * the tick's time on the schedulers' clock; and the clock went through both changes with a
 * scheduler killed (else nothing was tested).
 */
export function checkDstSchedulers(history: DstSchedulersHistory): KeyFeatureCheck {
  const twice: string[] = [];
  const missed: string[] = [];
  const unexpected: string[] = [];
  const days: string[] = [];
  const early: string[] = [];
  let due = 0;
  for (const schedule of history.schedules) {
    const counts = new Map<string, number>();
    for (const row of schedule.effects) counts.set(row.key, (counts.get(row.key) ?? 0) + 1);
    const expected = new Set(schedule.expectedTicks);
    due += expected.size;
    twice.push(...[...counts].filter(([, n]) => n > 1).map(([tick, n]) => `${schedule.name} ${tick}: ${n} effects`));
    missed.push(...schedule.expectedTicks.filter((tick) => !counts.has(tick)).map((tick) => `${schedule.name} ${tick}`));
    unexpected.push(...[...counts.keys()].filter((tick) => !expected.has(tick)).map((tick) => `${schedule.name} ${tick}`));
    if (schedule.daily) days.push(...localDaysNotOnce(schedule));
    for (const [tick, seenAt] of schedule.firstSeenOnClock) {
      if (seenAt < Date.parse(tick)) early.push(`${schedule.name} ${tick}: seen at ${new Date(seenAt).toISOString()} on the schedulers' clock`);
    }
  }
  const reached = Math.min(...history.schedules.map((schedule) => schedule.to));
  const notCrossed = history.changes.filter((change) => reached <= change).map((change) => `the schedulers' clock ended at ${new Date(reached).toISOString()}, before the change at ${new Date(change).toISOString()}`);
  const perSchedule = history.schedules.map((s) => `${s.name} ${s.expectedTicks.length}`).join(', ');
  const rates = [...new Set(history.pieces.map((piece) => piece.rate))].filter((rate) => rate > 0);
  return {
    feature: 'dst-schedulers',
    ok: [twice, missed, unexpected, days, early, notCrossed].every((list) => list.length === 0) && history.kills > 0 && due > 0,
    numbers: [
      ['ticks due by schedule', perSchedule],
      ['schedulers\' clock: windows from / rate', `${history.pieces.map((piece) => piece.clockAt.toISOString()).join(', ')} / ${rates.map((rate) => `${rate.toFixed(0)}×`).join(', ')}`],
      ['scheduler processes killed (SIGKILL) / started', `${history.kills} / ${history.starts}`],
    ],
    rules: [
      { rule: 'ticks committed more than once', failing: twice },
      { rule: 'ticks missed (a tick of the reference model without an effect)', failing: missed },
      { rule: 'effects of times that are not ticks of the reference model', failing: unexpected },
      { rule: 'local days of a daily fixed-time schedule without exactly one tick', failing: days },
      { rule: 'ticks seen by the database before their time on the schedulers\' clock', failing: early },
      { rule: 'the schedulers\' clock did not go through both changes', failing: notCrossed },
      { rule: 'no scheduler killed or no tick (nothing tested)', failing: history.kills === 0 || due === 0 ? [`${history.kills} kills, ${due} ticks`] : [] },
    ],
  };
}

/** The local days wholly inside the window on which the schedule's effects are not exactly one tick; and any day with two. */
function localDaysNotOnce(schedule: DstScheduleHistory): string[] {
  const dayOf = (t: number) => new Date(localTimeOf(t, schedule.timezone)).toISOString().slice(0, 10);
  const ticks = new Map<string, Set<string>>();
  for (const row of schedule.effects) {
    const day = dayOf(Date.parse(row.key));
    ticks.set(day, new Set([...(ticks.get(day) ?? []), row.key]));
  }
  const whole = new Set<string>();
  for (let t = schedule.from; t <= schedule.to; t += 3_600_000) whole.add(dayOf(t));
  whole.delete(dayOf(schedule.from));
  whole.delete(dayOf(schedule.to));
  const failing = [...whole].filter((day) => ticks.get(day)?.size !== 1).map((day) => `${schedule.name} ${day}: ${ticks.get(day)?.size ?? 0} ticks`);
  failing.push(...[...ticks].filter(([day, set]) => !whole.has(day) && set.size > 1).map(([day, set]) => `${schedule.name} ${day}: ${set.size} ticks`));
  return failing;
}
