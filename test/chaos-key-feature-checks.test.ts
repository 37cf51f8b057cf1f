/**
 * The key-feature profiles' rules on hand-made histories: a rule that cannot see a late
 * duplicate run again, a key's limit exceeded, a slot leaked, a generation run twice or a
 * replaced payload run, a tick committed twice or missed would make every such chaos run pass.
 * (The runs themselves are `npm run chaos -- --tombstones` and the like, outside vitest.)
 */
import { describe, expect, it } from 'vitest';
import type { ExecutionRow, FailedJob } from './chaos/checker.js';
import {
  checkConcurrencyLimits,
  checkRacingSchedulers,
  checkTombstones,
  firstSightOfTicks,
  type ConcurrencyHistory,
  type KeyFeatureCheck,
  type SchedulesHistory,
  type TickDuplicate,
  type TombstonesHistory,
} from './chaos/key-feature-checks.js';
import { checkDstSchedulers, clockAtReal, type DstScheduleHistory, type DstSchedulersHistory } from './chaos/dst-schedule-checks.js';
import type { ClockPiece } from './support/database-clock.js';
import type { WorkerLogLine } from './chaos/worker-fleet.js';
import { checkCoalescing, type CoalescingHistory } from './chaos/coalescing-checks.js';

const T0 = 1_700_000_000_000;
const row = (scope: string, key: string, fence: number, at: number): ExecutionRow => ({ scope, key, fence, workerPid: 1, at: T0 + at });
const line = (scope: string, key: string, outcome: string, at: number, jobId?: string): WorkerLogLine => ({
  time: T0 + at, pid: 1, msg: outcome, level: 30, outcome, scope, key, ...(jobId ? { jobId } : {}),
});
const failing = (check: KeyFeatureCheck) => Object.fromEntries(check.rules.filter((r) => r.failing.length > 0).map((r) => [r.rule, r.failing]));

describe('checkTombstones', () => {
  const REUSED: FailedJob = { id: 's/k2', jobId: 'late-other-2', attemptsMade: 1, reason: 'Idempotency key "k2" in scope "s" was already used with a different payload; the request was refused and nothing ran.' };
  const clean = (): TombstonesHistory => ({
    late: [
      { id: 's/k1', jobId: 'late-same-1', samePayload: true, sentAt: T0 + 10_000 },
      { id: 's/k2', jobId: 'late-other-2', samePayload: false, sentAt: T0 + 10_000 },
    ],
    effects: [row('s', 'k1', 1, 100), row('s', 'k2', 1, 200)],
    failedJobs: [REUSED],
    lines: [line('s', 'k1', 'result-expired', 10_050)],
    tombstones: 2,
  });

  it('passes late duplicates that ran nothing: the same payload acknowledged, another refused as KEY_REUSED', () => {
    const check = checkTombstones(clean());
    expect(failing(check)).toEqual({});
    expect(check.ok).toBe(true);
  });

  it('fails a late duplicate that ran again: an effect after the late send', () => {
    const history = { ...clean(), effects: [...clean().effects, row('s', 'k1', 1, 10_100)] };
    expect(failing(checkTombstones(history))).toEqual({ 'late duplicates run again (an effect after the late send)': ['s/k1'] });
  });

  it('fails a late duplicate of another payload that was not refused, and one of the same payload that failed', () => {
    const history: TombstonesHistory = {
      ...clean(),
      failedJobs: [{ id: 's/k1', jobId: 'late-same-1', attemptsMade: 1, reason: 'connection terminated' }],
    };
    const check = checkTombstones(history);
    expect(check.ok).toBe(false);
    expect(Object.keys(failing(check))).toEqual([
      'late duplicates with the same payload not acknowledged (job failed)',
      'late duplicates with another payload not refused as KEY_REUSED',
    ]);
  });

  it('fails a run that sent no late duplicate of a kind: it tested nothing', () => {
    const history = { ...clean(), late: clean().late.slice(0, 1), failedJobs: [] };
    expect(Object.keys(failing(checkTombstones(history)))).toEqual(['no late duplicate of each kind sent (nothing tested)']);
  });
});

describe('checkConcurrencyLimits', () => {
  const groups = new Map([
    ['s/a', { key: 'tenant:0', limit: 2 }],
    ['s/b', { key: 'tenant:0', limit: 2 }],
    ['s/c', { key: 'tenant:0', limit: 2 }],
    ['s/d', { key: 'tenant:1', limit: 2 }],
    ['s/e', { key: 'tenant:1', limit: 2 }],
  ]);
  /** a and b overlap (2 of limit 2); c starts the instant b ends; d runs in another key. */
  const clean = (): ConcurrencyHistory => ({
    groups,
    externalCalls: [row('s', 'a', 1, 0), row('s', 'b', 1, 100), row('s', 'c', 2, 500), row('s', 'd', 1, 50)],
    effects: [row('s', 'a', 1, 400), row('s', 'b', 1, 500), row('s', 'c', 2, 900), row('s', 'd', 1, 450)],
    lines: [line('s', 'c', 'concurrency-limited', 150), line('s', 'c', 'concurrency-limited', 300)],
    liveSlots: [],
    starvedBoundMs: 100,
  });

  it('passes runs within their key\'s limit, a slot freed and taken at the same instant, and deferrals while the key is at its limit', () => {
    const check = checkConcurrencyLimits(clean());
    expect(failing(check)).toEqual({});
    expect(check.numbers[0]![1]).toBe('4 (2; 2)');
  });

  it('with the lease given: counts runs longer than it, fails a profile that had none, and names a long run among too many at once', () => {
    // Every run lasts 400 ms: longer than a lease of 350 ms, shorter than one of 1 s.
    const check = checkConcurrencyLimits({ ...clean(), leaseMs: 350 });
    expect(failing(check)).toEqual({});
    expect(check.numbers.find(([name]) => name.startsWith('runs longer than the lease'))![1]).toBe('4 (4)');
    expect(Object.keys(failing(checkConcurrencyLimits({ ...clean(), leaseMs: 1_000 })))).toEqual(['no run longer than the lease (nothing tested)']);
    // c starts at 300 ms while a and b still run: three at once, long runs among them.
    const crowded = { ...clean(), leaseMs: 350, externalCalls: [...clean().externalCalls.filter((r) => r.key !== 'c'), row('s', 'c', 2, 300)] };
    expect(Object.keys(failing(checkConcurrencyLimits(crowded)))).toEqual([
      'runs of a concurrency key in flight past its limit',
      'never more than the limit at once with a run longer than the lease among them',
    ]);
  });

  it('fails a third run of a key in flight while two are', () => {
    const history = { ...clean(), externalCalls: [...clean().externalCalls.filter((r) => r.key !== 'c'), row('s', 'c', 2, 300)] };
    const broken = failing(checkConcurrencyLimits(history));
    expect(Object.keys(broken)).toEqual(['runs of a concurrency key in flight past its limit']);
    expect(broken['runs of a concurrency key in flight past its limit']![0]).toMatch(/^tenant:0: 3 runs/);
  });

  it('measures a run from the external call of its own fence, not a fenced earlier one', () => {
    // c's first owner (fence 1) called at 120 and lost the key; only fence 2's run counts.
    const history = { ...clean(), externalCalls: [...clean().externalCalls, row('s', 'c', 1, 120)] };
    expect(checkConcurrencyLimits(history).ok).toBe(true);
  });

  it('fails a key that went on deferring with a free slot past the bound (a livelock), not one whose deferrals a run ended', () => {
    // e is deferred at 1.0, 1.1 and 1.3 s while nothing of tenant:1 runs, then runs at 4 s.
    const deferredIdle = (times: number[]) => ({
      ...clean(),
      externalCalls: [...clean().externalCalls, row('s', 'e', 1, 4_000)],
      effects: [...clean().effects, row('s', 'e', 1, 4_100)],
      lines: [...clean().lines, ...times.map((at) => line('s', 'e', 'concurrency-limited', at))],
    });
    const starved = failing(checkConcurrencyLimits(deferredIdle([1_000, 1_100, 1_300])));
    expect(Object.keys(starved)).toEqual(['keys starved: deferring with a free slot for longer than 0.10 s without a run']);
    expect(Object.values(starved)[0]![0]).toMatch(/^tenant:1: deferring with a free slot from .* for 0\.30 s/);
    // A fault between the deferrals (a worker frozen, Postgres down) explains the idle slot.
    expect(checkConcurrencyLimits({ ...deferredIdle([1_000, 1_100, 1_300]), faultWindows: [{ from: T0 + 1_150, to: T0 + 1_200 }] }).ok).toBe(true);
    // Deferred once before and once after a run of the key started: served in between.
    expect(checkConcurrencyLimits({ ...deferredIdle([3_950, 4_050]), starvedBoundMs: 90 }).ok).toBe(true);
  });

  it('holds each key a job names to its limit: a tenant key and an in-all key', () => {
    const inAll = { key: 'all', limit: 2 };
    // Each of a, b, d within its tenant's limit, but three at once in all.
    const twoKeys = new Map([...groups].map(([id, group]) => [id, [group, inAll]]));
    const history = { ...clean(), groups: twoKeys, lines: [{ ...line('s', 'c', 'concurrency-limited', 150), concurrencyKey: 'all' }] };
    const broken = failing(checkConcurrencyLimits(history));
    expect(Object.keys(broken)).toEqual(['runs of a concurrency key in flight past its limit']);
    expect(broken['runs of a concurrency key in flight past its limit']![0]).toMatch(/^all: 3 runs/);
    // Runs counted once however many keys they name.
    expect(checkConcurrencyLimits(history).numbers[0]![1]).toBe('4 (3; 3)');
    expect(checkConcurrencyLimits({ ...history, groups: new Map([...groups].map(([id, group]) => [id, [group, { key: 'all', limit: 3 }]])) }).ok).toBe(true);
  });

  it('fails a slot left held, and a run that deferred nothing', () => {
    const leaked = { ...clean(), liveSlots: ['tenant:0/1 by s/c'] };
    expect(failing(checkConcurrencyLimits(leaked))).toEqual({ 'slots left held after the drain': ['tenant:0/1 by s/c'] });
    const untested = { ...clean(), lines: [] };
    expect(Object.keys(failing(checkConcurrencyLimits(untested)))).toEqual(['no job deferred by its limit (nothing tested)']);
  });
});

describe('checkCoalescing', () => {
  /** Versions 1-4 of one key: 1 runs (0-1000); 2, 3 arrive during it and collapse; 3 runs (1000-2000); 4 runs alone later. */
  const clean = (): CoalescingHistory => ({
    sent: new Map([['c/e', [1, 2, 3, 4]]]),
    runs: [
      { id: 'c/e', generation: 1, version: 1, start: T0 + 10, end: T0 + 1_000 },
      { id: 'c/e', generation: 2, version: 3, start: T0 + 1_010, end: T0 + 2_000 },
      { id: 'c/e', generation: 3, version: 4, start: T0 + 3_000, end: T0 + 3_500 },
    ],
    generations: new Map([['c/e', [1, 2, 3]]]),
    versionOfJob: new Map([['j1', 1], ['j2', 2], ['j3', 3], ['j4', 4]]),
    lines: [line('c', 'e', 'coalesced', 200, 'j2'), line('c', 'e', 'coalesced', 400, 'j3')],
  });

  it('passes generations committed once, one after another, the newest pending payload run, the last one last', () => {
    const check = checkCoalescing(clean());
    expect(failing(check)).toEqual({});
    expect(check.numbers[0]![1]).toBe('1: 4 / 3 / 2');
  });

  it('fails a generation committed twice, and one with a key row and no effect', () => {
    const twice = { ...clean(), runs: [...clean().runs, { ...clean().runs[1]! }] };
    expect(failing(checkCoalescing(twice))).toEqual({ 'generations not committed exactly once': ['c/e#2: 2 effects'] });
    const lostRun = { ...clean(), generations: new Map([['c/e', [1, 2, 3, 4]]]) };
    expect(failing(checkCoalescing(lostRun))['generations not committed exactly once']).toEqual(['c/e#4: 0 effects']);
  });

  it('fails a key whose last version did not run last, and runs of one key overlapping', () => {
    const runs = clean().runs.slice(0, 2);
    expect(Object.keys(failing(checkCoalescing({ ...clean(), runs, generations: new Map([['c/e', [1, 2]]]) })))).toEqual([
      'keys whose newest payload sent did not run last',
    ]);
    const overlapping = clean().runs.map((run) => (run.generation === 2 ? { ...run, start: T0 + 900 } : run));
    expect(Object.keys(failing(checkCoalescing({ ...clean(), runs: overlapping })))).toEqual(['runs of one key overlapping']);
  });

  it('fails a successor that ran a payload replaced before the run before it ended (a queue of successors)', () => {
    const queued = clean().runs.map((run) => (run.generation === 2 ? { ...run, version: 2 } : run));
    expect(Object.keys(failing(checkCoalescing({ ...clean(), runs: queued })))).toEqual([
      'generations that ran a replaced payload (more than one pending successor)',
    ]);
  });

  it('passes a payload held back (sent before the pending one, arriving after it) that did not replace it', () => {
    // Version 2 arrives after version 3 (a deferred delivery): 3 stays pending and runs.
    const late = { ...clean(), lines: [line('c', 'e', 'coalesced', 200, 'j3'), line('c', 'e', 'coalesced', 400, 'j2')] };
    expect(failing(checkCoalescing(late))).toEqual({});
    // Had the late version 2 replaced it, the rule fails.
    const replaced = { ...late, runs: late.runs.map((run) => (run.generation === 2 ? { ...run, version: 2 } : run)) };
    expect(Object.keys(failing(checkCoalescing(replaced)))).toEqual(['generations that ran a replaced payload (more than one pending successor)']);
  });

  it('fails a run in which nothing was coalesced', () => {
    expect(Object.keys(failing(checkCoalescing({ ...clean(), lines: [] })))).toEqual(['no arrival coalesced (nothing tested)']);
  });

  it('fails a payload run in two generations (a redelivery run again)', () => {
    const twice = { ...clean(), runs: [...clean().runs, { id: 'c/e', generation: 4, version: 3, start: T0 + 4_000, end: T0 + 4_500 }], generations: new Map([['c/e', [1, 2, 3, 4]]]) };
    expect(failing(checkCoalescing(twice))).toEqual({
      'payloads run in more than one generation': ['c/e: version 3 ran in generations 2, 4'],
      'keys whose newest payload sent did not run last': ['c/e: newest sent 4, ran last 3'],
    });
  });

  it('orders by when the database counts each version sent: a version stamped by a clock behind is older, one ahead counts from its first arrival', () => {
    // Version 4 was stamped by a clock five minutes behind: it counts as older than version 3,
    // is superseded when it arrives, and version 3, run as generation 2, is the last run.
    const sentAt = new Map([['c/e', new Map([[1, T0], [2, T0 + 100], [3, T0 + 300], [4, T0 + 3_000 - 300_000]])]]);
    const reordered: CoalescingHistory = {
      ...clean(),
      runs: clean().runs.slice(0, 2),
      generations: new Map([['c/e', [1, 2]]]),
      lines: [...clean().lines, line('c', 'e', 'coalesced', 3_000, 'j4')],
      sentAt,
    };
    expect(failing(checkCoalescing(reordered))).toEqual({});
    // Read by versions alone, version 4 should have run last.
    expect(Object.keys(failing(checkCoalescing({ ...reordered, sentAt: undefined })))).toEqual(['keys whose newest payload sent did not run last']);
  });

  it('reports the clocks and the store faults at the hand-over, and fails a run that had no add from a skewed clock or no store fault', () => {
    const skewOfJob = new Map([['j1', 0], ['j2', 180_000], ['j3', -240_000], ['j4', 0]]);
    const fault = (point: string, at: number): WorkerLogLine => ({ time: T0 + at, pid: 1, msg: 'fault injected: store fault', level: 40, point, scope: 'c', key: 'e' });
    const faulted = { ...clean(), skewOfJob, lines: [...clean().lines, fault('before-hand-over', 900), fault('after-hand-over', 1_900)] };
    const check = checkCoalescing(faulted);
    expect(failing(check)).toEqual({});
    expect(Object.fromEntries(check.numbers)).toMatchObject({
      'adds stamped by a producer clock ahead / behind / right': '1 / 1 / 2',
      'store faults injected at the hand-over: before / after it reached Postgres': '1 / 1',
    });
    expect(Object.keys(failing(checkCoalescing({ ...faulted, lines: clean().lines })))).toEqual([
      'no add stamped by a clock ahead or behind, or no store fault at the hand-over (nothing tested)',
    ]);
  });
});

describe('checkRacingSchedulers', () => {
  const scope = 'schedule:chaos-tick';
  const tick = (n: number) => new Date(T0 + n * 1_000).toISOString();
  const duplicates: TickDuplicate[] = [
    { tick: tick(2), jobId: 'ij_2', kind: 'same-job-id', sentAt: T0 + 2_500 },
    { tick: tick(1), jobId: 'tick-dup-1', kind: 'other-job-id', sentAt: T0 + 2_600 },
    { tick: tick(1), jobId: 'ij_1', kind: 'after-removal', sentAt: T0 + 2_700 },
  ];
  const clean = (): SchedulesHistory => ({
    expectedTicks: [tick(1), tick(2), tick(3), tick(4)],
    upToCursor: 3,
    effects: [row(scope, tick(1), 1, 1_050), row(scope, tick(2), 1, 2_050), row(scope, tick(3), 1, 3_050), row(scope, tick(4), 1, 4_050)],
    // The first claim of each tick 10 ms after its time.
    firstSeenAt: new Map([1, 2, 3, 4].map((n) => [tick(n), T0 + n * 1_000 + 10])),
    duplicates,
    kills: 3,
    starts: 6,
    clockSkewsMs: { schedulers: [300_000, -240_000, 12_000], workers: [-90_000, 2_000] },
  });

  it('passes every tick due committed once, one past the cursor included, none seen before its time, duplicates sent', () => {
    const check = checkRacingSchedulers(clean());
    expect(failing(check)).toEqual({});
    expect(Object.fromEntries(check.numbers)).toMatchObject({
      'wall clocks off: schedulers / workers': '+300.0 s, −240.0 s, +12.0 s / −90.0 s, +2.0 s',
      "duplicates of ticks sent: under the tick's job id / another job id / the job id after its job's removal": '3: 1 / 1 / 1',
    });
  });

  it('fails a tick committed twice, a tick missed, and an effect of a time that is no tick', () => {
    const history = { ...clean(), effects: [row(scope, tick(1), 1, 1_050), row(scope, tick(1), 2, 2_600), row(scope, tick(3), 1, 3_050), row(scope, 'tx', 1, 2_500)] };
    expect(failing(checkRacingSchedulers(history))).toEqual({
      'ticks committed more than once': [`${tick(1)}: 2 effects`],
      'ticks missed': [tick(2), tick(4)],
      'effects of times that are not ticks of the schedule (before its creation, after the stop, or off the second)': ['tx'],
    });
  });

  it('fails a tick whose job the database saw before the tick\'s time (a scheduler that trusted a clock ahead)', () => {
    const firstSeenAt = new Map(clean().firstSeenAt);
    firstSeenAt.set(tick(4), T0 + 4_000 - 300_000);
    // Exactly at its time is not early.
    firstSeenAt.set(tick(3), T0 + 3_000);
    expect(failing(checkRacingSchedulers({ ...clean(), firstSeenAt }))).toEqual({
      "ticks fired before their time (seen by the database before the tick's time)": [`${tick(4)}: seen by the database at ${new Date(T0 - 296_000).toISOString()}, 300.00 s before its time`],
    });
  });

  it('takes a tick\'s first sight from its rows and from the first read of a cursor at or past it', () => {
    const rows = [
      { key: tick(1), at: T0 + 1_400 }, // its key row
      { key: tick(1), at: T0 + 1_200 }, // an external call
      { key: tick(2), at: T0 + 2_900 },
      { key: tick(3), at: T0 + 3_050 },
    ];
    const cursors = [
      { cursor: tick(0), at: T0 + 500 },
      { cursor: tick(2), at: T0 + 2_300 },
      { cursor: tick(3), at: T0 + 3_100 },
    ];
    expect(firstSightOfTicks(rows, cursors)).toEqual(new Map([[tick(1), T0 + 1_200], [tick(2), T0 + 2_300], [tick(3), T0 + 3_050]]));
    // A cursor read past a tick before the tick's time: the tick was enqueued early.
    const early = firstSightOfTicks(rows, [...cursors, { cursor: tick(3), at: T0 + 2_950 }]);
    expect(Object.keys(failing(checkRacingSchedulers({ ...clean(), firstSeenAt: early })))).toEqual(["ticks fired before their time (seen by the database before the tick's time)"]);
  });

  it('fails a run in which no scheduler was killed', () => {
    expect(Object.keys(failing(checkRacingSchedulers({ ...clean(), kills: 0 })))).toEqual(['no scheduler killed or no tick (nothing tested)']);
  });

  it('fails a run without duplicates under another job id or after a removal', () => {
    expect(failing(checkRacingSchedulers({ ...clean(), duplicates: duplicates.filter((d) => d.kind === 'same-job-id') }))).toEqual({
      "no duplicate of a tick under another job id or after its job's removal (nothing tested)": ['0 duplicates other-job-id', '0 duplicates after-removal'],
    });
  });
});

describe('checkDstSchedulers', () => {
  const fall = Date.UTC(2026, 9, 25, 1);
  const spring = Date.UTC(2027, 2, 28, 1);
  const iso = (t: number) => new Date(t).toISOString();
  // '30 2 * * *' in Paris from the 24th to the 26th of October: the first 02:30 of the 25th only.
  const daily = ['2026-10-24T00:30:00.000Z', '2026-10-25T00:30:00.000Z', '2026-10-26T01:30:00.000Z'];
  const schedule = (overrides: Partial<DstScheduleHistory> = {}): DstScheduleHistory => ({
    name: 'dst-daily-paris',
    cron: '30 2 * * *',
    timezone: 'Europe/Paris',
    daily: true,
    from: Date.UTC(2026, 9, 23, 12),
    to: Date.UTC(2026, 9, 27, 12),
    expectedTicks: daily,
    effects: daily.map((tick, n) => ({ scope: 'schedule:dst-daily-paris', key: tick, fence: 1, workerPid: 1, at: Date.parse(tick) + 1_000 + n })),
    firstSeenOnClock: new Map(daily.map((tick) => [tick, Date.parse(tick) + 5_000])),
    ...overrides,
  });
  const pieces: ClockPiece[] = [
    { fromReal: new Date(T0), clockAt: new Date(fall - 45 * 60_000), rate: 0 },
    { fromReal: new Date(T0 + 10_000), clockAt: new Date(fall - 45 * 60_000), rate: 180 },
    { fromReal: new Date(T0 + 40_000), clockAt: new Date(spring - 45 * 60_000), rate: 180 },
  ];
  const history = (one: DstScheduleHistory = schedule()): DstSchedulersHistory => ({ schedules: [one], changes: [fall], pieces, kills: 2, starts: 5 });

  it('passes every tick of the model committed once, one tick on each local day, the clock past its change', () => {
    const check = checkDstSchedulers({ ...history(), changes: [fall] });
    expect(failing(check)).toEqual({});
    expect(check.ok).toBe(true);
  });

  it("fails a run whose schedulers' clock ended before a change", () => {
    expect(failing(checkDstSchedulers({ ...history(), changes: [fall, spring] }))).toEqual({
      "the schedulers' clock did not go through both changes": ['the schedulers\' clock ended at 2026-10-27T12:00:00.000Z, before the change at 2027-03-28T01:00:00.000Z'],
    });
  });

  it('fails a tick committed twice, a tick missed and an effect that is no tick of the model', () => {
    const effects = schedule().effects;
    const check = checkDstSchedulers(history(schedule({ effects: [effects[0]!, effects[0]!, { ...effects[2]!, key: '2026-10-25T01:30:00.000Z' }] })));
    const rules = failing(check);
    expect(rules['ticks committed more than once']).toEqual(['dst-daily-paris 2026-10-24T00:30:00.000Z: 2 effects']);
    expect(rules['ticks missed (a tick of the reference model without an effect)']).toEqual(['dst-daily-paris 2026-10-25T00:30:00.000Z', 'dst-daily-paris 2026-10-26T01:30:00.000Z']);
    expect(rules['effects of times that are not ticks of the reference model']).toEqual(['dst-daily-paris 2026-10-25T01:30:00.000Z']);
  });

  it("fails a daily schedule with two ticks on the fall-back day (the repeated 02:30) or none on a day", () => {
    const twice = [...daily.slice(0, 2), '2026-10-25T01:30:00.000Z', daily[2]!];
    const rows = twice.map((tick) => ({ scope: 'schedule:dst-daily-paris', key: tick, fence: 1, workerPid: 1, at: Date.parse(tick) }));
    const check = checkDstSchedulers(history(schedule({ expectedTicks: twice, effects: rows })));
    expect(failing(check)['local days of a daily fixed-time schedule without exactly one tick']).toEqual(['dst-daily-paris 2026-10-25: 2 ticks']);
    const none = checkDstSchedulers(history(schedule({ expectedTicks: [daily[0]!, daily[2]!], effects: rows.filter((r) => r.key !== daily[1] && r.key !== '2026-10-25T01:30:00.000Z') })));
    expect(failing(none)['local days of a daily fixed-time schedule without exactly one tick']).toEqual(['dst-daily-paris 2026-10-25: 0 ticks']);
  });

  it("fails a tick seen before its time on the schedulers' clock, and maps real times through the clock's pieces", () => {
    const check = checkDstSchedulers(history(schedule({ firstSeenOnClock: new Map([[daily[0]!, Date.parse(daily[0]!) - 1]]) })));
    expect(failing(check)["ticks seen by the database before their time on the schedulers' clock"]).toEqual([`dst-daily-paris ${daily[0]}: seen at ${iso(Date.parse(daily[0]!) - 1)} on the schedulers' clock`]);
    expect(clockAtReal(pieces, T0 + 5_000)).toBe(fall - 45 * 60_000);
    expect(clockAtReal(pieces, T0 + 20_000)).toBe(fall - 45 * 60_000 + 10_000 * 180);
    expect(clockAtReal(pieces, T0 + 41_000)).toBe(spring - 45 * 60_000 + 1_000 * 180);
  });

  it('fails a run in which no scheduler was killed', () => {
    expect(failing(checkDstSchedulers({ ...history(), kills: 0 }))['no scheduler killed or no tick (nothing tested)']).toEqual(['0 kills, 3 ticks']);
  });
});
