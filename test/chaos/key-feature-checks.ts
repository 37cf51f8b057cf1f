/**
 * The checker rules of the key-feature profiles (`--tombstones`, `--concurrency-limits`,
 * `--coalescing` (in `coalescing-checks.ts`), `--racing-schedulers`; `--dst-schedulers` in `dst-schedule-checks.ts`): one pure function per feature, over the rows and log
 * lines a run left, added to the suite's checks (`checker.ts`). Each returns the numbers for the
 * report's table and the failing ids of each required rule; a rule that had nothing to judge
 * (no late duplicate sent, no job deferred by its limit, no arrival coalesced, no scheduler
 * killed) fails the run too, since it would pass without testing anything.
 */
import { percentiles, type ExecutionRow, type FailedJob } from './checker.js';
import type { WorkerLogLine } from './worker-fleet.js';

/** The five profiles (the rules of `dst-schedulers` are in `dst-schedule-checks.ts`). */
export const KEY_FEATURES = ['tombstones', 'concurrency-limits', 'coalescing', 'racing-schedulers', 'dst-schedulers'] as const;
export type KeyFeature = (typeof KEY_FEATURES)[number];

/** What a key-feature rule set found. */
export interface KeyFeatureCheck {
  readonly feature: KeyFeature;
  /** True when every required rule found nothing. */
  readonly ok: boolean;
  /** Reported numbers, in the report's order: label, value. */
  readonly numbers: ReadonlyArray<readonly [string, string]>;
  /** Each required rule: its label, and what broke it (empty when it held). */
  readonly rules: ReadonlyArray<{ readonly rule: string; readonly failing: readonly string[] }>;
}

/** `scope/key` of a row or line. */
export const idOf = (row: { scope?: string; key?: string }) => `${row.scope}/${row.key}`;

/** A rule set's verdict: ok when every required rule found nothing. */
export function result(feature: KeyFeature, numbers: Array<readonly [string, string]>, rules: Array<{ rule: string; failing: string[] }>): KeyFeatureCheck {
  return { feature, ok: rules.every((r) => r.failing.length === 0), numbers, rules };
}

const seconds = (ms: number | null) => (ms === null ? 'n/a' : `${(ms / 1000).toFixed(2)} s`);

// ---------------------------------------------------------------------------------------------
// Tombstones past retention

/** A duplicate sent after its key's row was deleted by the janitor, its tombstone live. */
export interface LateDuplicate {
  /** `scope/key`. */
  readonly id: string;
  /** The BullMQ job id it was added under. */
  readonly jobId: string;
  /** The key's own payload (expected: acknowledged, "completed, result expired") or another one (expected: `KEY_REUSED`). */
  readonly samePayload: boolean;
  /** When it was acknowledged (ms since epoch). */
  readonly sentAt: number;
}

/** What {@link checkTombstones} reads. */
export interface TombstonesHistory {
  readonly late: readonly LateDuplicate[];
  readonly effects: readonly ExecutionRow[];
  readonly failedJobs: readonly FailedJob[];
  readonly lines: readonly WorkerLogLine[];
  /** Tombstones live after the drain. */
  readonly tombstones: number;
}

/**
 * Tombstones past retention: no late duplicate runs again (no effect row of its key after it
 * was sent, never two rows), a late duplicate with the key's own payload is acknowledged (its
 * job does not fail), one with another payload is refused as `KEY_REUSED` (its job fails with
 * that error and nothing runs).
 */
export function checkTombstones(history: TombstonesHistory): KeyFeatureCheck {
  const effectsByKey = groupBy(history.effects, idOf);
  const failedByJob = new Map(history.failedJobs.map((job) => [job.jobId, job]));
  const ranAgain = new Set<string>();
  for (const late of history.late) {
    const rows = effectsByKey.get(late.id) ?? [];
    // The first run's row is older than the late send; any row after it, or a second row, ran again.
    if (rows.length > 1 || rows.some((row) => row.at > late.sentAt)) ranAgain.add(late.id);
  }
  const same = history.late.filter((late) => late.samePayload);
  const other = history.late.filter((late) => !late.samePayload);
  const expiredFailed = same.filter((late) => failedByJob.has(late.jobId)).map((late) => `${late.id} (job ${late.jobId}: ${failedByJob.get(late.jobId)!.reason.slice(0, 120)})`);
  const reuseNotRefused = other.filter((late) => !/KEY_REUSED|already used with a different payload/.test(failedByJob.get(late.jobId)?.reason ?? '')).map((late) => `${late.id} (job ${late.jobId})`);
  const resultExpired = history.lines.filter((line) => line.outcome === 'result-expired').length;
  return result(
    'tombstones',
    [
      ['late duplicates sent after the key\'s row was gone (same payload / another payload)', `${history.late.length} (${same.length} / ${other.length})`],
      ['claims answered "completed, result expired" (result-expired lines)', String(resultExpired)],
      ['tombstones live after the drain', String(history.tombstones)],
    ],
    [
      { rule: 'late duplicates run again (an effect after the late send)', failing: [...ranAgain] },
      { rule: 'late duplicates with the same payload not acknowledged (job failed)', failing: expiredFailed },
      { rule: 'late duplicates with another payload not refused as KEY_REUSED', failing: reuseNotRefused },
      { rule: 'no late duplicate of each kind sent (nothing tested)', failing: same.length === 0 || other.length === 0 ? [`same ${same.length}, other ${other.length}`] : [] },
    ],
  );
}

// ---------------------------------------------------------------------------------------------
// Per-key concurrency limits under kills

/** One concurrency key a produced key names, and its limit. */
export interface ConcurrencyGroup {
  readonly key: string;
  readonly limit: number;
}

/** The concurrency keys a produced key names. */
function groupsOf(history: ConcurrencyHistory, id: string): readonly ConcurrencyGroup[] {
  const named = history.groups.get(id);
  return named === undefined ? [] : Array.isArray(named) ? (named as readonly ConcurrencyGroup[]) : [named as ConcurrencyGroup];
}

/** What {@link checkConcurrencyLimits} reads. */
export interface ConcurrencyHistory {
  /** The concurrency key and limit of each produced key, by `scope/key`; a list when it names several (a tenant's and one in all). */
  readonly groups: ReadonlyMap<string, ConcurrencyGroup | readonly ConcurrencyGroup[]>;
  /** Committed effects: each run's end. */
  readonly effects: readonly ExecutionRow[];
  /** External calls: each run's start (the call of the effect's fence). */
  readonly externalCalls: readonly ExecutionRow[];
  readonly lines: readonly WorkerLogLine[];
  /** Slots still held after the drain and the workers' stop (`group/slot by scope/key`). */
  readonly liveSlots: readonly string[];
  /** The workers' lease: a run longer than it holds its slots by their renewal alone (on the fast path, where its key is not `processing`). */
  readonly leaseMs?: number;
  /**
   * Longest a concurrency key may go on deferring its jobs while fewer than its limit of its runs
   * are in flight, without starting one: a slot of a killed worker is held for a lease, a
   * starving waiter's for the starvation bound; beyond both, the key is starved.
   */
  readonly starvedBoundMs: number;
  /**
   * When faults were in effect (from start to end, plus a lease for the slots they left held):
   * a starved span is judged only between them, where nothing else explains an idle slot.
   */
  readonly faultWindows?: ReadonlyArray<{ readonly from: number; readonly to: number }>;
}

/**
 * Limits under kills: never more than a concurrency key's limit of its runs in flight at once
 * (a committed run is in flight from its external call, made after the claim under its fence,
 * to its effect's insert, just before its COMMIT; all times in the database's clock); no key
 * starved: deferring its jobs (`concurrency-limited` lines) with fewer than its limit in flight
 * for longer than the bound without starting a run (a measure of fairness that a slow or
 * loaded machine does not change: while workers are down or Postgres frozen nobody is
 * deferred); no slot left held once everything drained. The wait of each deferred job, from its
 * first deferral to its run, is reported.
 */
export function checkConcurrencyLimits(history: ConcurrencyHistory): KeyFeatureCheck {
  const calls = groupBy(history.externalCalls, (row) => `${idOf(row)}#${row.fence}`);
  const runs: Array<{ id: string; group: string; limit: number; start: number; end: number }> = [];
  let withoutStart = 0;
  for (const effect of history.effects) {
    const id = idOf(effect);
    const groups = groupsOf(history, id);
    if (groups.length === 0) continue;
    const starts = (calls.get(`${id}#${effect.fence}`) ?? []).filter((call) => call.at <= effect.at);
    if (starts.length === 0) {
      withoutStart++;
      continue;
    }
    // A run counts in each key its job names: every one of their limits must hold.
    for (const group of groups) runs.push({ id, group: group.key, limit: group.limit, start: Math.max(...starts.map((c) => c.at)), end: effect.at });
  }
  const overLimit: string[] = [];
  let maxInFlight = 0;
  for (const [group, list] of groupBy(runs, (run) => run.group)) {
    // Ends before starts at the same instant: a slot freed and taken again is not an overlap.
    const events = list.flatMap((run) => [{ at: run.start, delta: 1, run }, { at: run.end, delta: -1, run }]).sort((a, b) => a.at - b.at || a.delta - b.delta);
    let inFlight = 0;
    const running = new Set<(typeof runs)[number]>();
    for (const event of events) {
      inFlight += event.delta;
      if (event.delta > 0) running.add(event.run);
      else running.delete(event.run);
      maxInFlight = Math.max(maxInFlight, inFlight);
      if (event.delta > 0 && inFlight > event.run.limit) {
        overLimit.push(`${group}: ${inFlight} runs at ${new Date(event.at).toISOString()} (limit ${event.run.limit}: ${[...running].map((r) => r.id).join(', ')})`);
      }
    }
  }
  const firstDeferral = new Map<string, number>();
  let deferrals = 0;
  for (const line of history.lines) {
    if (line.outcome !== 'concurrency-limited') continue;
    deferrals++;
    const id = idOf(line);
    if (!firstDeferral.has(id)) firstDeferral.set(id, line.time);
  }
  const waits: number[] = [];
  const startOf = new Map(runs.map((run) => [run.id, run.start]));
  for (const [id, since] of firstDeferral) {
    const start = startOf.get(id);
    if (start !== undefined) waits.push(Math.max(0, start - since)); // never committed: the suite's "lost" says so
  }
  const waited = percentiles(waits);
  const starved = starvedSpans(history, runs);
  // Runs longer than the lease: a slot taken is held for a lease, and beyond it by its renewal
  // (on the fast path nothing else holds it). The rule above holds them to the limit with every
  // other run; these say that they were there to hold, and whether one was among too many.
  const leaseMs = history.leaseMs ?? Infinity;
  const longRuns = runs.filter((run) => run.end - run.start > leaseMs);
  const longOverLimit = overLimit.filter((line) => longRuns.some((run) => line.includes(run.id)));
  return result(
    'concurrency-limits',
    [
      ['runs with a concurrency key (groups; most in flight at once in a group)', `${new Set(runs.map((r) => `${r.id}#${r.start}`)).size} (${new Set(runs.map((r) => r.group)).size}; ${maxInFlight})${withoutStart ? `, ${withoutStart} without a start` : ''}`],
      ['deferrals by the limit (jobs deferred)', `${deferrals} (${firstDeferral.size})`],
      ['runs longer than the lease (jobs)', `${new Set(longRuns.map((r) => `${r.id}#${r.start}`)).size} (${new Set(longRuns.map((r) => r.id)).size})`],
      ['wait of a deferred job from its first deferral to its run p50 / p99 / max', `${seconds(waited.p50)} / ${seconds(waited.p99)} / ${seconds(waited.max)}`],
    ],
    [
      { rule: 'runs of a concurrency key in flight past its limit', failing: overLimit },
      { rule: 'never more than the limit at once with a run longer than the lease among them', failing: longOverLimit },
      { rule: 'no run longer than the lease (nothing tested)', failing: history.leaseMs !== undefined && longRuns.length === 0 ? ['0 long runs'] : [] },
      { rule: `keys starved: deferring with a free slot for longer than ${seconds(history.starvedBoundMs)} without a run`, failing: starved },
      { rule: 'slots left held after the drain', failing: [...history.liveSlots] },
      { rule: 'no job deferred by its limit (nothing tested)', failing: deferrals === 0 ? ['0 deferrals'] : [] },
    ],
  );
}

/**
 * Per concurrency key, the spans in which it deferred jobs while fewer than its limit of its
 * runs were in flight, without a run of it starting, longer than the bound.
 */
function starvedSpans(history: ConcurrencyHistory, runs: ReadonlyArray<{ group: string; limit: number; start: number; end: number }>): string[] {
  const runsByGroup = groupBy(runs, (run) => run.group);
  const limitOf = new Map([...history.groups.keys()].flatMap((id) => groupsOf(history, id)).map((g) => [g.key, g.limit]));
  // A deferral counts against the key that refused it (the line names it), else the job's only key.
  const deferralsByGroup = groupBy(
    history.lines.filter((line) => line.outcome === 'concurrency-limited' && history.groups.has(idOf(line))),
    (line) => line.concurrencyKey ?? groupsOf(history, idOf(line))[0]!.key,
  );
  const starved: string[] = [];
  for (const [group, deferrals] of deferralsByGroup) {
    const groupRuns = runsByGroup.get(group) ?? [];
    const starts = groupRuns.map((run) => run.start).sort((a, b) => a - b);
    const inFlight = (at: number) => groupRuns.filter((run) => run.start <= at && at < run.end).length;
    let spanStart: number | undefined;
    let reported = false;
    let nextStart = 0;
    const faultBetween = (from: number, to: number) => (history.faultWindows ?? []).some((w) => w.from <= to && w.to >= from);
    for (const time of deferrals.map((line) => line.time).sort((a, b) => a - b)) {
      // A run of the group started since the span began: the key was served; a new span may begin.
      while (nextStart < starts.length && starts[nextStart]! <= time) {
        if (spanStart !== undefined && starts[nextStart]! >= spanStart) {
          spanStart = undefined;
          reported = false;
        }
        nextStart++;
      }
      if (inFlight(time) >= (limitOf.get(group) ?? Infinity)) continue; // at its limit: deferring is right
      // A fault since the span began (a worker killed or frozen, Postgres down) explains the wait: start again.
      if (spanStart !== undefined && faultBetween(spanStart, time)) {
        spanStart = undefined;
        reported = false;
      }
      spanStart ??= time;
      if (!reported && time - spanStart > history.starvedBoundMs) {
        starved.push(`${group}: deferring with a free slot from ${new Date(spanStart).toISOString()} for ${seconds(time - spanStart)} without a run`);
        reported = true;
      }
    }
  }
  return starved;
}

// ---------------------------------------------------------------------------------------------
// Racing schedulers

/** A duplicate of a tick's job that the scheduler profile sent itself (same key and payload). */
export interface TickDuplicate {
  /** The tick's key (its time in ISO 8601). */
  readonly tick: string;
  /** The BullMQ job id it was added under. */
  readonly jobId: string;
  /**
   * `same-job-id`: under the tick's own job id, the job still in the queue (BullMQ keeps one);
   * `other-job-id`: under a job id of its own, a second job of the tick; `after-removal`: under
   * the tick's own job id after its completed job was removed, a job BullMQ takes as new.
   */
  readonly kind: 'same-job-id' | 'other-job-id' | 'after-removal';
  /** When it was acknowledged (ms since epoch). */
  readonly sentAt: number;
}

/** A schedule's cursor as read, and the database's clock when it was read. */
export interface CursorSighting {
  /** The tick key of the cursor (`last_tick`). */
  readonly cursor: string;
  /** ms since epoch, the database's clock, after the read's snapshot. */
  readonly at: number;
}

/**
 * Per tick key, the earliest time the database saw its job: the earliest of its rows (`key`,
 * `at` in the database's clock: its key row's creation, external calls, effects) and of the
 * reads of a cursor at or past the tick (a round moves the cursor only after enqueuing its
 * ticks). Ticks with no row are left out: they never ran.
 */
export function firstSightOfTicks(rows: Iterable<{ readonly key: string; readonly at: number }>, cursors: readonly CursorSighting[]): Map<string, number> {
  const seen = new Map<string, number>();
  for (const { key, at } of rows) seen.set(key, Math.min(seen.get(key) ?? Infinity, Number(at)));
  for (const [key, at] of seen) {
    const due = Date.parse(key);
    const reads = cursors.filter((sighting) => Date.parse(sighting.cursor) >= due).map((sighting) => sighting.at);
    if (reads.length > 0) seen.set(key, Math.min(at, ...reads));
  }
  return seen;
}

/** What {@link checkRacingSchedulers} reads. */
export interface SchedulesHistory {
  /**
   * The schedule's tick keys that must each have committed once: every tick after its creation
   * up to its cursor, or up to the newest tick enqueued before the schedulers stopped if later
   * (a round enqueues every missed tick, oldest first, so none before it may be missing).
   */
  readonly expectedTicks: readonly string[];
  /** Of them, the ticks up to the schedule's cursor (`last_tick`), reported. */
  readonly upToCursor: number;
  /** Effects of the schedule's scope. */
  readonly effects: readonly ExecutionRow[];
  /**
   * Per tick key, the earliest time the database saw its job (ms, the database's clock): its key
   * row's creation by the first claim, its first external call, its first effect, the first read
   * of the schedule's cursor at or past it. All come after the tick's job was enqueued, which was
   * after the round read the database's `now()`.
   */
  readonly firstSeenAt: ReadonlyMap<string, number>;
  /** Duplicates of ticks the profile sent (acknowledged). */
  readonly duplicates: readonly TickDuplicate[];
  /** Scheduler processes killed (SIGKILL) and started. */
  readonly kills: number;
  readonly starts: number;
  /** How far the schedulers' and the skewed workers' wall clocks were off, in ms (reported). */
  readonly clockSkewsMs?: { readonly schedulers: readonly number[]; readonly workers: readonly number[] };
}

/**
 * Racing schedulers: each tick's effect committed once (never twice, never for a time that is
 * not a tick of the schedule after its creation and before the schedulers stopped, whatever the
 * duplicates of ticks sent), no tick missed (with `missed: 'all'` and a bound above the run's
 * length of ticks, the policy allows none), and no tick fired before its time: the database saw
 * no tick's job before the tick's time by its own clock, whatever the schedulers' wall clocks
 * said (the first sight is after the enqueue, so a tick enqueued early by less than the delay of
 * that sight goes unseen; one enqueued by a scheduler's skewed clock, seconds or minutes off, does not).
 */
export function checkRacingSchedulers(history: SchedulesHistory): KeyFeatureCheck {
  const byTick = groupBy(history.effects, (row) => row.key);
  const expected = new Set(history.expectedTicks);
  const twice = [...byTick].filter(([, rows]) => rows.length > 1).map(([tick, rows]) => `${tick}: ${rows.length} effects`);
  const missed = history.expectedTicks.filter((tick) => !byTick.has(tick));
  const unexpected = [...byTick.keys()].filter((tick) => !expected.has(tick));
  const early: string[] = [];
  const afterTick: number[] = [];
  for (const [tick, seenAt] of history.firstSeenAt) {
    const due = Date.parse(tick);
    if (!Number.isFinite(due)) continue; // not a time: the rule of effects that are no ticks says so
    if (seenAt < due) early.push(`${tick}: seen by the database at ${new Date(seenAt).toISOString()}, ${seconds(due - seenAt)} before its time`);
    else afterTick.push(seenAt - due);
  }
  const lag = percentiles(afterTick);
  const sent = (kind: TickDuplicate['kind']) => history.duplicates.filter((d) => d.kind === kind).length;
  const skews = history.clockSkewsMs;
  const duplicatesUntested = (['other-job-id', 'after-removal'] as const).filter((kind) => sent(kind) === 0).map((kind) => `0 duplicates ${kind}`);
  return result(
    'racing-schedulers',
    [
      ['ticks due (up to the cursor)', `${history.expectedTicks.length} (${history.upToCursor})`],
      ['scheduler processes killed (SIGKILL) / started', `${history.kills} / ${history.starts}`],
      ...(skews ? [['wall clocks off: schedulers / workers', `${skews.schedulers.map(signedSeconds).join(', ')} / ${skews.workers.map(signedSeconds).join(', ') || 'none'}`] as const] : []),
      [
        'duplicates of ticks sent: under the tick\'s job id / another job id / the job id after its job\'s removal',
        `${history.duplicates.length}: ${sent('same-job-id')} / ${sent('other-job-id')} / ${sent('after-removal')}`,
      ],
      ['first sight of a tick\'s job by the database after its time p50 / max', `${seconds(lag.p50)} / ${seconds(lag.max)}`],
    ],
    [
      { rule: 'ticks committed more than once', failing: twice },
      { rule: 'ticks missed', failing: missed },
      { rule: 'effects of times that are not ticks of the schedule (before its creation, after the stop, or off the second)', failing: unexpected },
      { rule: 'ticks fired before their time (seen by the database before the tick\'s time)', failing: early },
      { rule: 'no scheduler killed or no tick (nothing tested)', failing: history.kills === 0 || history.expectedTicks.length === 0 ? [`${history.kills} kills, ${history.expectedTicks.length} ticks`] : [] },
      { rule: 'no duplicate of a tick under another job id or after its job\'s removal (nothing tested)', failing: duplicatesUntested },
    ],
  );
}

/** 190000 → `+190.0 s`. */
function signedSeconds(ms: number): string {
  return `${ms >= 0 ? '+' : '−'}${(Math.abs(ms) / 1000).toFixed(1)} s`;
}

/** `items` grouped by `keyOf`, in order. */
export function groupBy<T>(items: Iterable<T>, keyOf: (item: T) => string): Map<string, T[]> {
  const groups = new Map<string, T[]>();
  for (const item of items) {
    const key = keyOf(item);
    const list = groups.get(key);
    if (list) list.push(item);
    else groups.set(key, [item]);
  }
  return groups;
}
