/**
 * The chaos suite's checker and schedule, on hand-made histories: a checker that cannot see a
 * duplicate, a loss, a failed job, a key left processing, an overlap, a step run twice or
 * out of order, a job failed for another job's fault, or a setting seen across jobs would make
 * every chaos run pass. (The chaos run itself is
 * `npm run chaos`, outside vitest.)
 */
import { describe, expect, it } from 'vitest';
import { CHAOS_STEPS } from './chaos/chaos-handler.js';
import { checkHistory, percentiles, type ExecutionRow, type History, type StepRecordRow } from './chaos/checker.js';
import { ArmedFaults, FAULT_LOG_MESSAGE, parseFaultPoints } from './chaos/fault-injection.js';
import { FAULT_KINDS, STEP_FAULT_KINDS, nemesisSchedule } from './chaos/nemesis.js';
import { JOB_FAULTS, JOB_FAULT_RATIO, countServerErrorsOfFaults, jobFaultFor, jobNameFor, type JobFault } from './chaos/job-faults.js';
import type { WorkerLogLine } from './chaos/worker-fleet.js';

const T0 = 1_700_000_000_000;
const row = (key: string, fence: number, at: number, workerPid = 1): ExecutionRow => ({ scope: 's', key, fence, workerPid, at: T0 + at });
const line = (pid: number, key: string, fence: number, outcome: string, at: number): WorkerLogLine => ({
  time: T0 + at, pid, msg: outcome, level: 30, outcome, scope: 's', key, fence,
});

/** k1 claimed and completed by worker 1; k2 claimed by worker 2, which is killed, then taken over by worker 3. */
function cleanHistory(): History {
  return {
    produced: new Map([['s/k1', { acks: 1 }], ['s/k2', { acks: 2 }]]),
    effects: [row('k1', 1, 50, 1), row('k2', 2, 5_000, 3)],
    externalCalls: [row('k1', 1, 10, 1), row('k2', 1, 110, 2), row('k2', 2, 4_900, 3)],
    keys: [
      { scope: 's', key: 'k1', status: 'completed', fence: 1 },
      { scope: 's', key: 'k2', status: 'completed', fence: 2 },
    ],
    lines: [
      line(1, 'k1', 1, 'claimed', 0),
      line(1, 'k1', 1, 'completed', 60),
      line(2, 'k2', 1, 'claimed', 100),
      line(3, 'k2', 2, 'taken-over', 4_000),
      line(3, 'k2', 2, 'completed', 5_010),
    ],
    exits: [{ pid: 2, slot: 1, at: T0 + 1_000, code: null, signal: 'SIGKILL', beforeReady: false }],
    stoppedAt: T0 + 10_000,
  };
}

describe('checkHistory', () => {
  it('passes a history where every key ran once, and measures recovery from the kill', () => {
    const result = checkHistory(cleanHistory());
    expect(result.ok).toBe(true);
    expect(result.acknowledgedKeys).toBe(2);
    expect(result.externalCalls).toEqual({ total: 3, keysCalledMoreThanOnce: 1, extraCalls: 1 });
    expect(result.outcomes['taken-over']).toBe(1);
    expect(result.killedProcesses).toBe(1);
    expect(result.recoveryMs).toEqual({ samples: 1, p50: 4_000, p99: 4_000, max: 4_000 });
    expect(result.leaseOverlaps).toBe(0);
  });

  it('counts a committed job delivered again (a replay under the job id that committed), not a replay under another job id; fails the run only where the job finishes in its effect', () => {
    const withJob = (l: WorkerLogLine, jobId: string): WorkerLogLine => ({ ...l, jobId });
    const base = cleanHistory();
    const lines = [
      ...base.lines.map((l) => withJob(l, `job-${l.key}`)),
      withJob(line(3, 'k1', 1, 'replayed', 7_000), 'job-k1'), // k1's own job, again: a redelivery
      withJob(line(3, 'k2', 2, 'replayed', 7_100), 'foreign-1'), // another job for k2: a duplicate, not a redelivery
    ];
    const counted = checkHistory({ ...base, lines, completedJobsKept: true });
    expect(counted.redeliveredCommittedJobs).toEqual(['s/k1']);
    expect(counted.ok).toBe(true);
    expect(checkHistory({ ...base, lines, completedJobsKept: true, jobFinishedInEffect: true }).ok).toBe(false);
    expect(checkHistory({ ...base, lines }).redeliveredCommittedJobs).toBeUndefined();
  });

  it('tells a replay by an older delivery of the committed job (held through a stall) from the job delivered again after its commit', () => {
    const base = cleanHistory();
    const committing = (l: WorkerLogLine): WorkerLogLine => ({ ...l, jobId: `job-${l.key}`, delivery: 2 });
    const lines = [
      ...base.lines.map(committing),
      // Worker 3 took k1's job at its first delivery, stalled, and claimed after delivery 2 committed.
      { ...line(3, 'k1', 1, 'replayed', 7_000), jobId: 'job-k1', delivery: 1 },
    ];
    const stale = checkHistory({ ...base, lines, completedJobsKept: true, jobFinishedInEffect: true });
    expect(stale.redeliveredCommittedJobs).toEqual([]);
    expect(stale.replaysByOlderDeliveries).toEqual(['s/k1']);
    expect(stale.ok).toBe(true);
    const again = checkHistory({
      ...base,
      lines: [...lines, { ...line(3, 'k2', 2, 'replayed', 7_100), jobId: 'job-k2', delivery: 3 }],
      completedJobsKept: true,
      jobFinishedInEffect: true,
    });
    expect(again.redeliveredCommittedJobs).toEqual(['s/k2']);
    expect(again.ok).toBe(false);
  });

  it('finds a duplicated effect, an unexpected one and a lost key', () => {
    const history = cleanHistory();
    const result = checkHistory({
      ...history,
      produced: new Map([...history.produced, ['s/k3', { acks: 1 }]]),
      effects: [...history.effects, row('k1', 1, 70), row('ghost', 1, 80)],
    });
    expect(result.ok).toBe(false);
    expect(result.duplicated).toEqual(['s/k1']);
    expect(result.unexpected).toEqual(['s/ghost']);
    expect(result.lost).toEqual(['s/k3']);
  });

  it('tells a key still queued when the drain timed out (unfinished) from a lost one; both fail the run', () => {
    const history = cleanHistory();
    const result = checkHistory({
      ...history,
      produced: new Map([...history.produced, ['s/k3', { acks: 1 }], ['s/k4', { acks: 1 }]]),
      pending: new Set(['s/k3']),
    });
    expect(result.unfinished).toEqual(['s/k3']);
    expect(result.lost).toEqual(['s/k4']);
    expect(result.ok).toBe(false);
    expect(checkHistory({ ...history, produced: new Map([...history.produced, ['s/k3', { acks: 1 }]]), pending: new Set(['s/k3']) }).ok).toBe(false);
  });

  it('does not hold unacknowledged keys to "never lost", but counts a failed key as lost', () => {
    const history = cleanHistory();
    const result = checkHistory({
      ...history,
      produced: new Map([...history.produced, ['s/k3', { acks: 0 }], ['s/k4', { acks: 1 }]]),
      keys: [...history.keys, { scope: 's', key: 'k4', status: 'failed', fence: 1 }],
    });
    expect(result.lost).toEqual(['s/k4']);
    expect(result.failedKeys).toEqual(['s/k4']);
  });

  it('fails a run with a failed BullMQ job, even when the key completed through another job', () => {
    const history = cleanHistory();
    const failed = { id: 's/k1', jobId: 'foreign-7', attemptsMade: 1, reason: 'terminating connection due to administrator command' };
    const result = checkHistory({ ...history, failedJobs: [failed] });
    expect(result.failedJobs).toEqual([failed]);
    expect(result.lost).toEqual([]);
    expect(result.ok).toBe(false);
    expect(checkHistory({ ...history, failedJobs: [] }).ok).toBe(true);
  });

  it('fails a run with a key left processing after the drain, acknowledged or not', () => {
    const history = cleanHistory();
    const result = checkHistory({
      ...history,
      // k3's add was never acknowledged (so it is not held to "never lost"), but its job ran
      // far enough to claim the key, and nobody finished it.
      produced: new Map([...history.produced, ['s/k3', { acks: 0 }]]),
      keys: [...history.keys, { scope: 's', key: 'k3', status: 'processing', fence: 1 }],
    });
    expect(result.leftProcessing).toEqual(['s/k3']);
    expect(result.lost).toEqual([]);
    expect(result.ok).toBe(false);

    const acknowledged = checkHistory({ ...history, keys: [history.keys[0]!, { scope: 's', key: 'k2', status: 'processing', fence: 2 }] });
    expect(acknowledged.leftProcessing).toEqual(['s/k2']);
    expect(acknowledged.lost).toEqual(['s/k2']);
    expect(acknowledged.ok).toBe(false);
  });

  it('tells a fenced zombie (overlap, allowed) from two overlapping owners that both committed', () => {
    const history = cleanHistory();
    // Worker 2 is paused, not killed: it is still running when worker 3 takes k2 over.
    const zombie: History = { ...history, exits: [], lines: [...history.lines, line(2, 'k2', 1, 'fenced', 6_000)] };
    const fenced = checkHistory(zombie);
    expect(fenced.ok).toBe(true);
    expect(fenced.leaseOverlaps).toBe(1);
    expect(fenced.committedOverlaps).toEqual([]);

    const bothCommitted = checkHistory({ ...zombie, effects: [...zombie.effects, row('k2', 1, 5_900, 2)] });
    expect(bothCommitted.ok).toBe(false);
    expect(bothCommitted.committedOverlaps).toEqual(['s/k2']);
    expect(bothCommitted.duplicated).toEqual(['s/k2']);
  });

  it('finds an external call repeated within one lease, and an effect under a stale fence', () => {
    const history = cleanHistory();
    const result = checkHistory({
      ...history,
      externalCalls: [...history.externalCalls, row('k1', 1, 20)],
      keys: [history.keys[0]!, { scope: 's', key: 'k2', status: 'completed', fence: 3 }],
    });
    expect(result.repeatedWithinLease).toEqual(['s/k1#1']);
    expect(result.fenceMismatches).toEqual(['s/k2']);
    expect(result.ok).toBe(false);
  });

  it('on the fast path reports external calls repeated under one fence without failing (each attempt claims afresh)', () => {
    const history = cleanHistory();
    const result = checkHistory({ ...history, fastPath: true, externalCalls: [...history.externalCalls, row('k1', 1, 20)] });
    expect(result.repeatedWithinLease).toEqual(['s/k1#1']);
    expect(result.ok).toBe(true);
  });

  it('in a run mixing the fast path and leases, holds only the leased runs\' calls to one per lease (a rolled-back fast-path attempt and the next claim share fence 1)', () => {
    const history = cleanHistory();
    const fastPathCall = (at: number): ExecutionRow => ({ ...row('k1', 1, at, 2), fastPath: true });
    const mixed = checkHistory({ ...history, externalCalls: [fastPathCall(2), fastPathCall(4), ...history.externalCalls] });
    expect(mixed.repeatedWithinLease).toEqual([]);
    expect(mixed.externalCalls).toEqual({ total: 5, keysCalledMoreThanOnce: 2, extraCalls: 3 });
    expect(mixed.ok).toBe(true);
    const twoLeased = checkHistory({ ...history, externalCalls: [fastPathCall(2), ...history.externalCalls, row('k1', 1, 20)] });
    expect(twoLeased.repeatedWithinLease).toEqual(['s/k1#1']);
    expect(twoLeased.ok).toBe(false);
  });

  it('measures recovery per process when a killed worker\'s pid is reused by a later worker', () => {
    const history = cleanHistory();
    // A later worker gets pid 2 again, claims k3 and is killed too; worker 3 takes k3 over.
    const result = checkHistory({
      ...history,
      produced: new Map([...history.produced, ['s/k3', { acks: 1 }]]),
      effects: [...history.effects, row('k3', 2, 25_000, 3)],
      keys: [...history.keys, { scope: 's', key: 'k3', status: 'completed', fence: 2 }],
      lines: [...history.lines, line(2, 'k3', 1, 'claimed', 20_000), line(3, 'k3', 2, 'taken-over', 24_000), line(3, 'k3', 2, 'completed', 25_010)],
      exits: [...history.exits, { pid: 2, slot: 0, at: T0 + 21_000, code: null, signal: 'SIGKILL', beforeReady: false }],
      stoppedAt: T0 + 30_000,
    });
    // Not 24 s for k3 from the first process's death: that process never held it.
    expect(result.recoveryMs).toEqual({ samples: 2, p50: 4_000, p99: 4_000, max: 4_000 });
  });

  it('counts injected crashes by point and takes the crash time from the fault line', () => {
    const history = cleanHistory();
    const fault: WorkerLogLine = { time: T0 + 500, pid: 2, msg: FAULT_LOG_MESSAGE, level: 50, point: 'before-commit', scope: 's', key: 'k2' };
    const result = checkHistory({ ...history, lines: [...history.lines, fault] });
    expect(result.injectedCrashes).toEqual({ 'before-commit': 1 });
    expect(result.recoveryMs.max).toBe(4_500);
  });
});

const stepRow = (key: string, step: string, fence: number, at: number, workerPid = 1): ExecutionRow => ({ ...row(key, fence, at, workerPid), step });
const record = (key: string, name: string, fence: number, recordedAt: number | null, starts = 1): StepRecordRow => ({
  scope: 's',
  key,
  name,
  position: CHAOS_STEPS.findIndex((step) => step.name === name) + 1,
  fence,
  starts,
  recordedAt: recordedAt === null ? null : T0 + recordedAt,
});

/**
 * The multi-step handler's history (reserve, charge, ledger, completion): k1 runs through under
 * fence 1 (worker 1). k2's worker 2 records reserve, calls charge and is killed before recording
 * it; worker 3 takes k2 over (fence 2), replays reserve, calls charge again (its second start),
 * records it, and goes on. The times are 0.3 ms apart where one thing follows another at once.
 */
function stepsHistory(): History {
  const base = cleanHistory();
  return {
    ...base,
    effects: [row('k1', 1, 40, 1), row('k2', 2, 5_000, 3)],
    externalCalls: [stepRow('k1', 'charge', 1, 20, 1), stepRow('k2', 'charge', 1, 120, 2), stepRow('k2', 'charge', 2, 4_100, 3)],
    steps: {
      sequence: CHAOS_STEPS,
      effects: [
        stepRow('k1', 'reserve', 1, 10, 1),
        stepRow('k1', 'ledger', 1, 30, 1),
        stepRow('k2', 'reserve', 1, 110, 2),
        stepRow('k2', 'ledger', 2, 4_200, 3),
      ],
      records: [
        record('k1', 'reserve', 1, 10.3),
        record('k1', 'charge', 1, 20.3),
        record('k1', 'ledger', 1, 30.3),
        record('k2', 'reserve', 1, 110.3),
        record('k2', 'charge', 2, 4_100.3, 2),
        record('k2', 'ledger', 2, 4_200.3),
      ],
    },
  };
}

/** `history` with its step rows and records changed. */
function withSteps(history: History, change: Partial<NonNullable<History['steps']>>): History {
  return { ...history, steps: { ...history.steps!, ...change } };
}

describe('checkHistory on multi-step jobs', () => {
  it('passes a history where each database step wrote once with its record, and charge was called again only under the new fence', () => {
    const result = checkHistory(stepsHistory());
    expect(result.steps).toEqual({
      databaseNotOnce: [],
      calledAfterRecord: [],
      uncountedCalls: [],
      outOfOrder: [],
      lateZombieCalls: 0,
      repeatedSteps: 1,
      extraCalls: 1,
    });
    expect(result.ok).toBe(true);
    expect(checkHistory(cleanHistory()).steps).toBeUndefined();
  });

  it('fails a database step whose write happened twice', () => {
    const history = stepsHistory();
    const result = checkHistory(withSteps(history, { effects: [...history.steps!.effects, stepRow('k2', 'reserve', 2, 4_050, 3)] }));
    expect(result.steps!.databaseNotOnce).toEqual(['s/k2:reserve']);
    expect(result.ok).toBe(false);
  });

  it('fails a database step whose write committed without its record, or under another fence than the record', () => {
    const history = stepsHistory();
    // k2's worker 2 (fence 1) wrote ledger, and the record is fence 2's: the write committed apart from its record.
    const otherFence = checkHistory(
      withSteps(history, { effects: history.steps!.effects.map((r) => (r.key === 'k2' && r.step === 'ledger' ? { ...r, fence: 1, workerPid: 2 } : r)) }),
    );
    expect(otherFence.steps!.databaseNotOnce).toEqual(['s/k2:ledger']);
    expect(otherFence.ok).toBe(false);

    // A write of a key that never recorded the step (nor completed).
    const unrecorded: History = {
      ...history,
      produced: new Map([...history.produced, ['s/k3', { acks: 0 }]]),
      keys: [...history.keys, { scope: 's', key: 'k3', status: 'processing', fence: 1 }],
    };
    const unrecordedResult = checkHistory(withSteps(unrecorded, { effects: [...history.steps!.effects, stepRow('k3', 'reserve', 1, 7_000)] }));
    expect(unrecordedResult.steps!.databaseNotOnce).toEqual(['s/k3:reserve']);
  });

  it('fails a database step recorded without its write, and a completed key with a database step never written', () => {
    const history = stepsHistory();
    const result = checkHistory(withSteps(history, { effects: history.steps!.effects.filter((r) => !(r.key === 'k1' && r.step === 'ledger')) }));
    expect(result.steps!.databaseNotOnce).toEqual(['s/k1:ledger']);
    expect(result.ok).toBe(false);

    const neither = checkHistory(
      withSteps(history, {
        effects: history.steps!.effects.filter((r) => !(r.key === 'k1' && r.step === 'ledger')),
        records: history.steps!.records.filter((r) => !(r.key === 'k1' && r.name === 'ledger')),
      }),
    );
    expect(neither.steps!.databaseNotOnce).toEqual(['s/k1:ledger']);
  });

  it('fails an external step called after it was recorded: by a later fence, or by the recording fence again', () => {
    const history = stepsHistory();
    // A run under fence 3 called charge although fence 2 had recorded it (and started it: 3 starts).
    const laterFence = checkHistory(
      withSteps(
        { ...history, externalCalls: [...history.externalCalls, stepRow('k2', 'charge', 3, 6_000, 4)] },
        { records: history.steps!.records.map((r) => (r.key === 'k2' && r.name === 'charge' ? { ...r, starts: 3 } : r)) },
      ),
    );
    expect(laterFence.steps!.calledAfterRecord).toEqual(['s/k2:charge']);
    expect(laterFence.steps!.uncountedCalls).toEqual([]);
    expect(laterFence.ok).toBe(false);

    const sameFence = checkHistory({ ...history, externalCalls: [...history.externalCalls, stepRow('k1', 'charge', 1, 25, 1)] });
    expect(sameFence.steps!.calledAfterRecord).toEqual(['s/k1:charge']);
    expect(sameFence.repeatedWithinLease).toEqual(['s/k1#1']);
    expect(sameFence.ok).toBe(false);
  });

  it("allows a zombie's call that arrives after a later owner recorded the step, and counts it", () => {
    const history = stepsHistory();
    // Worker 2 had started charge under fence 1; paused, its call reached the other system after fence 2 recorded it.
    const zombie: History = {
      ...history,
      externalCalls: [stepRow('k1', 'charge', 1, 20, 1), stepRow('k2', 'charge', 2, 4_100, 3), stepRow('k2', 'charge', 1, 4_500, 2)],
    };
    const result = checkHistory(zombie);
    expect(result.steps!.lateZombieCalls).toBe(1);
    expect(result.steps!.calledAfterRecord).toEqual([]);
    expect(result.ok).toBe(true);
  });

  it('fails external calls the record does not count: more calls than starts, or none by the fence that recorded', () => {
    const history = stepsHistory();
    const moreCalls = checkHistory(withSteps(history, { records: history.steps!.records.map((r) => (r.key === 'k2' && r.name === 'charge' ? { ...r, starts: 1 } : r)) }));
    expect(moreCalls.steps!.uncountedCalls).toEqual(['s/k2:charge']);
    expect(moreCalls.ok).toBe(false);

    const noCallByRecorder = checkHistory({ ...history, externalCalls: history.externalCalls.filter((r) => !(r.key === 'k2' && r.fence === 2)) });
    expect(noCallByRecorder.steps!.uncountedCalls).toEqual(['s/k2:charge']);
    expect(noCallByRecorder.ok).toBe(false);
  });

  it('fails a step that ran before the step before it was recorded, and a completion before the last step was recorded', () => {
    const history = stepsHistory();
    // k2's ledger written at 4,050, before charge was recorded at 4,100.3.
    const early = checkHistory(withSteps(history, { effects: history.steps!.effects.map((r) => (r.key === 'k2' && r.step === 'ledger' ? { ...r, at: T0 + 4_050 } : r)) }));
    expect(early.steps!.outOfOrder).toEqual(['s/k2:ledger']);
    expect(early.ok).toBe(false);

    // Charge called while reserve was never recorded (its write rolled back: no row either).
    const unrecorded = checkHistory(
      withSteps(history, {
        effects: history.steps!.effects.filter((r) => !(r.key === 'k1' && r.step === 'reserve')),
        records: history.steps!.records.filter((r) => !(r.key === 'k1' && r.name === 'reserve')),
      }),
    );
    expect(unrecorded.steps!.outOfOrder).toEqual(['s/k1:charge']);
    expect(unrecorded.ok).toBe(false);

    const completion = checkHistory({ ...history, effects: [row('k1', 1, 30.1, 1), row('k2', 2, 5_000, 3)] });
    expect(completion.steps!.outOfOrder).toEqual(['s/k1:completion']);
    expect(completion.ok).toBe(false);
  });
});

/** An effect row of the database-only handler: its transaction and what it saw of the settings. */
const seenRow = (key: string, txid: number, seen: { tenant?: string | null; synchronousCommit?: string } = {}): ExecutionRow => ({
  ...row(key, 1, txid),
  txid,
  seenTenant: seen.tenant ?? null,
  seenSynchronousCommit: seen.synchronousCommit ?? 'on',
});

/**
 * The job-fault profile on the fast path: k1 and k2 (no fault) committed in one group; k3
 * (a syntax error) and k6 (a deferred foreign key broken) failed, each with its BullMQ job,
 * k6 with a duplicate's too; k4 (SET LOCAL synchronous_commit) and k5 (app.tenant set inside
 * a function) committed alone, each seeing its own setting.
 */
function jobFaultHistory(): History & { jobFaults: ReadonlyMap<string, JobFault> } {
  const keys = ['k1', 'k2', 'k3', 'k4', 'k5', 'k6'];
  return {
    produced: new Map(keys.map((key) => [`s/${key}`, { acks: 1 }])),
    effects: [seenRow('k1', 10), seenRow('k2', 10, { tenant: '' }), seenRow('k4', 11, { synchronousCommit: 'off' }), seenRow('k5', 12, { tenant: 's/k5' })],
    externalCalls: [],
    keys: [
      { scope: 's', key: 'k1', status: 'completed', fence: 1 },
      { scope: 's', key: 'k2', status: 'completed', fence: 1 },
      { scope: 's', key: 'k3', status: 'failed', fence: 1 },
      { scope: 's', key: 'k4', status: 'completed', fence: 1 },
      { scope: 's', key: 'k5', status: 'completed', fence: 1 },
      { scope: 's', key: 'k6', status: 'failed', fence: 1 },
    ],
    lines: [],
    exits: [],
    stoppedAt: T0 + 10_000,
    failedJobs: [
      { id: 's/k3', jobId: 'j3', attemptsMade: 1, reason: 'Job for key "k3" in scope "s" failed: syntax error at or near ")"' },
      { id: 's/k6', jobId: 'j6', attemptsMade: 1, reason: 'insert or update on table "fault_children" violates foreign key constraint "fault_children_parent_id_fkey"' },
      { id: 's/k6', jobId: 'foreign-6', attemptsMade: 1, reason: 'insert or update on table "fault_children" violates foreign key constraint "fault_children_parent_id_fkey"' },
    ],
    fastPath: true,
    jobFaults: new Map<string, JobFault>([
      ['s/k3', 'syntax'],
      ['s/k4', 'set-local'],
      ['s/k5', 'set-tenant-quietly'],
      ['s/k6', 'deferred-fk'],
    ]),
  };
}

describe('checkHistory with job faults', () => {
  it('passes a history where only the jobs with a failing fault failed and nobody saw another job\'s setting', () => {
    const result = checkHistory(jobFaultHistory());
    expect(result.ok).toBe(true);
    // The poisoned keys' failures are expected: not lost, not failed keys or jobs.
    expect(result.lost).toEqual([]);
    expect(result.failedKeys).toEqual([]);
    expect(result.failedJobs).toEqual([]);
    expect(result.jobFaults).toEqual({
      keysByFault: { none: 2, syntax: 1, 'set-local': 1, 'set-tenant-quietly': 1, 'deferred-fk': 1 },
      innocentFailures: [],
      poisonNotFailed: [],
      settingsSeenAcross: [],
      stateFaultsGrouped: [],
      faultsNotSeen: [],
      poisonFailedOtherwise: [],
      groupedEffects: 2,
      sharedTransactions: 1,
    });
    // Without the job faults, the same history fails: k3 and k6 are lost keys with failed jobs.
    const { jobFaults: _, ...withoutFaults } = jobFaultHistory();
    const plain = checkHistory(withoutFaults);
    expect(plain.ok).toBe(false);
    expect(plain.lost).toEqual(['s/k3', 's/k6']);
  });

  it('fails an innocent failure: a key without a failing fault stored failed, lost, or with a failed BullMQ job', () => {
    const history = jobFaultHistory();
    // k1 failed for its group-mate k3's syntax error.
    const blamed = checkHistory({
      ...history,
      effects: history.effects.filter((r) => r.key !== 'k1'),
      keys: history.keys.map((k) => (k.key === 'k1' ? { ...k, status: 'failed' } : k)),
      failedJobs: [...history.failedJobs!, { id: 's/k1', jobId: 'j1', attemptsMade: 1, reason: 'syntax error at or near ")"' }],
    });
    expect(blamed.jobFaults!.innocentFailures).toEqual(['s/k1']);
    expect(blamed.lost).toEqual(['s/k1']);
    expect(blamed.ok).toBe(false);

    // k4 (a state fault, which must complete) never committed, and no job is left for it.
    const stateLost = checkHistory({ ...history, effects: history.effects.filter((r) => r.key !== 'k4'), keys: history.keys.filter((k) => k.key !== 'k4') });
    expect(stateLost.jobFaults!.innocentFailures).toEqual(['s/k4']);
    expect(stateLost.ok).toBe(false);

    // k2 completed, but one of its jobs failed on the way (a fault used up its only attempt).
    const failedJob = checkHistory({ ...history, failedJobs: [...history.failedJobs!, { id: 's/k2', jobId: 'foreign-2', attemptsMade: 1, reason: 'boom' }] });
    expect(failedJob.jobFaults!.innocentFailures).toEqual(['s/k2']);
    expect(failedJob.lost).toEqual([]);
    expect(failedJob.ok).toBe(false);
  });

  it('fails a failing fault that did not fail: completed with its effect, or not ended failed', () => {
    const history = jobFaultHistory();
    const committed = checkHistory({
      ...history,
      effects: [...history.effects, seenRow('k3', 13)],
      keys: history.keys.map((k) => (k.key === 'k3' ? { ...k, status: 'completed' } : k)),
      failedJobs: history.failedJobs!.filter((job) => job.id !== 's/k3'),
    });
    expect(committed.jobFaults!.poisonNotFailed).toEqual(['s/k3']);
    expect(committed.ok).toBe(false);

    // An effect row of a failing fault is enough, whatever the key says.
    const effectOnly = checkHistory({ ...history, effects: [...history.effects, seenRow('k6', 14)] });
    expect(effectOnly.jobFaults!.poisonNotFailed).toEqual(['s/k6']);
    expect(effectOnly.ok).toBe(false);

    // k6's key released (no row), no job left to run it: it did not end failed.
    const released = checkHistory({ ...history, keys: history.keys.filter((k) => k.key !== 'k6') });
    expect(released.jobFaults!.poisonNotFailed).toEqual(['s/k6']);
    expect(released.ok).toBe(false);

    // Still queued when the drain timed out: unfinished (a liveness failure), not a poison that completed.
    const queued = checkHistory({ ...history, keys: history.keys.filter((k) => k.key !== 'k6'), pending: new Set(['s/k6']) });
    expect(queued.jobFaults!.poisonNotFailed).toEqual([]);
    expect(queued.unfinished).toEqual(['s/k6']);
    expect(queued.ok).toBe(false);

    // A key never acknowledged is not held to failing, but it may not commit either.
    const unacknowledged = checkHistory({
      ...history,
      produced: new Map([...history.produced, ['s/k7', { acks: 0 }]]),
      jobFaults: new Map([...history.jobFaults, ['s/k7', 'nul']]),
      effects: [...history.effects, seenRow('k7', 15)],
    });
    expect(unacknowledged.jobFaults!.poisonNotFailed).toEqual(['s/k7']);
  });

  it('fails a setting seen across jobs: another key\'s tenant, or synchronous_commit off without a set-local of its own', () => {
    const history = jobFaultHistory();
    const result = checkHistory({
      ...history,
      effects: history.effects.map((r) =>
        r.key === 'k1' ? { ...r, seenTenant: 's/k5' } : r.key === 'k2' ? { ...r, seenSynchronousCommit: 'off' } : r,
      ),
    });
    expect(result.jobFaults!.settingsSeenAcross).toEqual(['s/k1', 's/k2']);
    expect(result.ok).toBe(false);
    // A row that did not record the setting at all cannot pass as "on".
    const unrecorded = checkHistory({ ...history, effects: history.effects.map((r) => (r.key === 'k1' ? { ...r, seenSynchronousCommit: null } : r)) });
    expect(unrecorded.jobFaults!.settingsSeenAcross).toEqual(['s/k1']);
  });

  it('fails a state fault committed in a transaction shared with another key', () => {
    const history = jobFaultHistory();
    // k5 set app.tenant inside a function and committed in k1 and k2's group (txid 10).
    const result = checkHistory({ ...history, effects: history.effects.map((r) => (r.key === 'k5' ? { ...r, txid: 10 } : r)) });
    expect(result.jobFaults!.stateFaultsGrouped).toEqual(['s/k5']);
    expect(result.jobFaults!.sharedTransactions).toBe(1);
    expect(result.jobFaults!.groupedEffects).toBe(3);
    expect(result.ok).toBe(false);
  });

  it('fails a state fault its own job did not see (the fault was never sent, so the checks above tested nothing)', () => {
    const history = jobFaultHistory();
    const result = checkHistory({
      ...history,
      effects: history.effects.map((r) => (r.key === 'k4' ? { ...r, seenSynchronousCommit: 'on' } : r.key === 'k5' ? { ...r, seenTenant: null } : r)),
    });
    expect(result.jobFaults!.faultsNotSeen).toEqual(['s/k4', 's/k5']);
    expect(result.ok).toBe(false);
  });

  it('fails a failing fault whose job failed for another reason than its fault (a system fault used up its attempt)', () => {
    const history = jobFaultHistory();
    const result = checkHistory({
      ...history,
      failedJobs: history.failedJobs!.map((job) => (job.jobId === 'foreign-6' ? { ...job, reason: 'Connection terminated unexpectedly' } : job)),
    });
    expect(result.jobFaults!.poisonFailedOtherwise).toEqual(['s/k6']);
    expect(result.ok).toBe(false);
  });
});

describe('jobFaultFor', () => {
  it('marks about a tenth of the keys, the same ones for the same seed, with every fault', () => {
    const marked = (seed: number) => Array.from({ length: 10_000 }, (_, n) => jobFaultFor(seed, n));
    const a = marked(7);
    expect(marked(7)).toEqual(a);
    expect(marked(8)).not.toEqual(a);
    const faulty = a.filter((fault) => fault !== undefined);
    expect(faulty.length / a.length).toBeGreaterThan(JOB_FAULT_RATIO - 0.02);
    expect(faulty.length / a.length).toBeLessThan(JOB_FAULT_RATIO + 0.02);
    expect(new Set(faulty)).toEqual(new Set(JOB_FAULTS));
  });

  it('counts the errors the faults made Postgres log, by cause', () => {
    const log = [
      '2026-12-01 10:00:00.000 UTC [11] ERROR:  syntax error at or near ")" at character 52',
      '2026-12-01 10:00:00.001 UTC [11] STATEMENT:  select "id" from "s"."effects" where "key" in ()',
      '2026-12-01 10:00:00.002 UTC [12] ERROR:  a job of this group changed app.tenant inside the shared transaction',
      '2026-12-01 10:00:00.003 UTC [12] ERROR:  syntax error at or near ")" at character 52',
      '2026-12-01 10:00:00.004 UTC [13] ERROR:  duplicate key value violates unique constraint "x"',
    ].join('\n');
    expect(countServerErrorsOfFaults(log)).toEqual({
      'syntax error': 2,
      'NUL (22021)': 0,
      'foreign key at COMMIT (23503)': 0,
      'setting changed in a group (IJ003)': 1,
    });
  });

  it('gives each fault a job name of its own', () => {
    expect(jobNameFor(undefined)).toBe('charge');
    expect(new Set(JOB_FAULTS.map(jobNameFor)).size).toBe(JOB_FAULTS.length);
    expect(JOB_FAULTS.map(jobNameFor)).not.toContain('charge');
  });
});

describe('percentiles', () => {
  it('uses the nearest rank', () => {
    const values = Array.from({ length: 100 }, (_, i) => i + 1);
    expect(percentiles(values)).toEqual({ samples: 100, p50: 50, p99: 99, max: 100 });
    expect(percentiles([])).toEqual({ samples: 0, p50: null, p99: null, max: null });
  });
});

describe('parseFaultPoints', () => {
  it('reads point:probability pairs', () => {
    expect(parseFaultPoints('after-claim:0.02, before-commit:0.5,after-commit:0')).toEqual({
      'after-claim': 0.02,
      'before-commit': 0.5,
      'after-commit': 0,
    });
    expect(parseFaultPoints('inside-database-step:0.01,inside-external-step:0.01,between-steps:0.02')).toEqual({
      'inside-database-step': 0.01,
      'inside-external-step': 0.01,
      'between-steps': 0.02,
    });
    expect(parseFaultPoints(undefined)).toEqual({});
  });

  it('names the bad part', () => {
    expect(() => parseFaultPoints('after-lunch:0.1')).toThrow(/"after-lunch:0.1" is not <point>:<probability>/);
    expect(() => parseFaultPoints('after-claim:2')).toThrow(/probability of "after-claim" must be a number in \[0, 1\] \(got "2"\)/);
    expect(() => parseFaultPoints('after-claim')).toThrow(/probability of "after-claim"/);
  });
});

describe('ArmedFaults', () => {
  it('fires once per arming, only at the armed point', () => {
    const armed = new ArmedFaults();
    armed.arm('before-commit');
    armed.arm('before-commit');
    expect(armed.take('after-claim')).toBe(false);
    expect(armed.take('before-commit')).toBe(true);
    expect(armed.take('before-commit')).toBe(true);
    expect(armed.take('before-commit')).toBe(false);
  });
});

describe('nemesisSchedule', () => {
  const options = { seed: 42, durationMs: 90_000, intervalMs: 3_000, workers: 3, leaseMs: 3_000 };

  it('is the same for the same seed and differs for another', () => {
    expect(nemesisSchedule(options)).toEqual(nemesisSchedule(options));
    expect(nemesisSchedule({ ...options, seed: 43 })).not.toEqual(nemesisSchedule(options));
  });

  it('covers every kind of fault in a short run, within the chaos phase and the worker slots', () => {
    const schedule = nemesisSchedule(options);
    expect(new Set(schedule.map((op) => op.kind))).toEqual(new Set(FAULT_KINDS));
    for (const op of schedule) {
      expect(op.atMs).toBeLessThan(options.durationMs - options.leaseMs);
      expect(op.slot).toBeGreaterThanOrEqual(0);
      expect(op.slot).toBeLessThan(options.workers);
    }
    for (const op of schedule.filter((op) => op.kind === 'pause' || op.kind === 'pg-pause')) expect(op.pauseMs).toBeGreaterThan(options.leaseMs);
    for (const op of schedule.filter((op) => op.kind === 'pg-crash' || op.kind === 'pg-restart' || op.kind === 'redis-restart')) {
      expect(op.downMs).toBeGreaterThanOrEqual(200);
      expect(op.downMs).toBeLessThanOrEqual(2_000);
    }
  });

  it('adds the crashes inside and between steps for the multi-step profile, and leaves the schedule without steps as it was', () => {
    const schedule = nemesisSchedule({ ...options, steps: true });
    expect(new Set(schedule.map((op) => op.kind))).toEqual(new Set([...FAULT_KINDS, ...STEP_FAULT_KINDS]));
    expect(nemesisSchedule({ ...options, steps: false })).toEqual(nemesisSchedule(options));
  });

  it('restarts, crashes and freezes Postgres in the short profile', () => {
    const kinds = nemesisSchedule(options).map((op) => op.kind);
    for (const kind of ['pg-crash', 'pg-restart', 'pg-pause', 'pg-terminate'] as const) expect(kinds).toContain(kind);
  });
});
