/**
 * The checker: reads a run's history (what the producer saw acknowledged, the workers' log
 * lines, process deaths) and the database's record of what happened (effect rows, external
 * call rows, the keys), and decides whether anything ran twice or was lost. Pure: it takes
 * data, not connections, so it can be tested on hand-made histories.
 */
import type { WorkerExit, WorkerLogLine } from './worker-fleet.js';
import { FAULT_LOG_MESSAGE } from './fault-injection.js';
import { JOB_FAULT_ERRORS, isFailingJobFault, type JobFault } from './job-faults.js';

/** One row of `effects`, `external_calls` or `step_effects`. */
export interface ExecutionRow {
  readonly scope: string;
  readonly key: string;
  readonly fence: number;
  readonly workerPid: number;
  /** ms since epoch (database clock), microseconds as the fraction. */
  readonly at: number;
  /**
   * `external_calls`: made by a run on the fast path, whose fence is no lease's (each attempt
   * claims afresh, and the attempt after a rolled-back one gets the same fence).
   */
  readonly fastPath?: boolean;
  /** The step that wrote the row (multi-step handler: `external_calls` and `step_effects`). */
  readonly step?: string;
  /** `effects` of the database-only handler: the transaction that committed it. */
  readonly txid?: number;
  /** `effects` of the database-only handler: `current_setting('app.tenant', true)` as the job saw it. */
  readonly seenTenant?: string | null;
  /** `effects` of the database-only handler: `current_setting('synchronous_commit')` as the job saw it. */
  readonly seenSynchronousCommit?: string | null;
}

/** One row of `job_steps`: a step's record (or, for an external step, its start). */
export interface StepRecordRow {
  readonly scope: string;
  readonly key: string;
  readonly name: string;
  readonly position: number;
  /** The fence that recorded it, or last started it when not recorded. */
  readonly fence: number;
  /** How many times it started (external steps). */
  readonly starts: number;
  /** ms since epoch (database clock), microseconds as the fraction; null: started, not recorded. */
  readonly recordedAt: number | null;
}

/** A step of the multi-step handler: its name, and whether it is a database or an external step. */
export interface StepSpec {
  readonly name: string;
  readonly kind: 'database' | 'external';
}

/** What the checker reads about steps (the multi-step profile, `--steps`). */
export interface StepsHistory {
  /** The handler's steps in the order it calls them; the completion follows the last. */
  readonly sequence: readonly StepSpec[];
  /** `step_effects`: one row per committed write of a database step. */
  readonly effects: readonly ExecutionRow[];
  /** `job_steps`. */
  readonly records: readonly StepRecordRow[];
}

/** One row of `idempotency_keys`. */
export interface KeyRow {
  readonly scope: string;
  readonly key: string;
  readonly status: string;
  readonly fence: number;
  /** The stored error of a failed key (for the evidence). */
  readonly error?: unknown;
}

/** A BullMQ job left in the `failed` state. */
export interface FailedJob {
  /** `scope/key` of its idempotency key. */
  readonly id: string;
  readonly jobId: string;
  readonly attemptsMade: number;
  readonly reason: string;
}

/** Everything the checker reads. */
export interface History {
  /** Every key the producer tried, by `scope/key`, with how many of its adds were acknowledged. */
  readonly produced: ReadonlyMap<string, { readonly acks: number }>;
  readonly effects: readonly ExecutionRow[];
  readonly externalCalls: readonly ExecutionRow[];
  readonly keys: readonly KeyRow[];
  readonly lines: readonly WorkerLogLine[];
  readonly exits: readonly WorkerExit[];
  /** When the harness began stopping workers on purpose; later deaths are not faults. */
  readonly stoppedAt: number;
  /** Keys that still had a job waiting, delayed or active in BullMQ at the end (none once drained). */
  readonly pending?: ReadonlySet<string>;
  /**
   * BullMQ jobs in the `failed` state after the drain. The chaos handler never fails on its
   * own, so a failed job is the system giving up on a job because of a fault.
   */
  readonly failedJobs?: readonly FailedJob[];
  /**
   * The workers ran the fast path: no lease outlives a rolled-back attempt (each attempt claims
   * afresh, under fence 1), so "one external call per lease" does not apply; it is reported only.
   */
  readonly fastPath?: boolean;
  /** The multi-step profile's rows and records; the step checks run only when present. */
  readonly steps?: StepsHistory;
  /**
   * The job-fault profile (`--job-faults`): the fault of each key that carries one, by
   * `scope/key`. When present, the job-fault checks run, and keys with a failing fault are
   * expected to fail (they leave `lost`, `failedKeys` and `failedJobs`).
   */
  readonly jobFaults?: ReadonlyMap<string, JobFault>;
  /**
   * Completed jobs stay in the queue (no `removeOnComplete`), so a job id holds one job for the
   * whole run and a replay under the id of the job that committed its key is that job delivered
   * again: the checker counts those ({@link CheckResult.redeliveredCommittedJobs}).
   */
  readonly completedJobsKept?: boolean;
  /** The job's completion commits with its effect (the Postgres backend): a committed job delivered again fails the run. */
  readonly jobFinishedInEffect?: boolean;
}

/** Summary of a distribution, in ms. */
export interface Percentiles {
  readonly samples: number;
  readonly p50: number | null;
  readonly p99: number | null;
  readonly max: number | null;
}

/** The verdict. Every list holds `scope/key` ids (capped in the report, counted in full here). */
export interface CheckResult {
  readonly acknowledgedKeys: number;
  /** Acknowledged keys with no committed effect and no job left to run them (or failed for good). */
  readonly lost: string[];
  /** Acknowledged keys not completed yet whose job is still in BullMQ: the run did not drain. */
  readonly unfinished: string[];
  /** Keys whose status is `failed` (also counted in `lost` when acknowledged). */
  readonly failedKeys: string[];
  /** BullMQ jobs that ended `failed`: a fault used up a job's attempts. */
  readonly failedJobs: FailedJob[];
  /** Keys still `processing` after the drain and the workers' stop: nobody will finish them. */
  readonly leftProcessing: string[];
  /** Keys with more than one effect row. */
  readonly duplicated: string[];
  /** Effects for keys the producer never sent. */
  readonly unexpected: string[];
  /** Completed keys whose single effect row carries another fence than the completion. */
  readonly fenceMismatches: string[];
  /** Keys with two owners whose lease windows overlapped and which both committed an effect. */
  readonly committedOverlaps: string[];
  /** Keys with two owners whose windows overlapped (a zombie still running): fenced, allowed. */
  readonly leaseOverlaps: number;
  /** External calls: keys called more than once (only after a takeover), and the extra calls. */
  readonly externalCalls: { readonly total: number; readonly keysCalledMoreThanOnce: number; readonly extraCalls: number };
  /** (key, fence) pairs with more than one external call: a repeat within one lease. */
  readonly repeatedWithinLease: string[];
  /** The multi-step profile's checks (absent without steps). */
  readonly steps?: StepsCheck;
  /** The job-fault profile's checks (absent without job faults). */
  readonly jobFaults?: JobFaultsCheck;
  readonly outcomes: Readonly<Record<string, number>>;
  readonly injectedCrashes: Readonly<Record<string, number>>;
  /** Deaths by SIGKILL before the stop (nemesis kills and injected crashes). */
  readonly killedProcesses: number;
  /** Per key a killed worker held: from its death to the key's effect committing elsewhere. */
  readonly recoveryMs: Percentiles;
  /**
   * Runs that replayed a key under the job id whose run committed it: a job delivered again
   * after its effect committed (a worker died between the COMMIT and telling the queue). Counted
   * when completed jobs are kept; `scope/key` per redelivery.
   */
  readonly redeliveredCommittedJobs?: string[];
  /**
   * Replays under the committing job's id by a delivery older than the committing one: a worker
   * held the job through a stall (its lock expired, the job went to another) and claimed the key
   * after the other's commit. Not a redelivery; counted to show the race was exercised.
   */
  readonly replaysByOlderDeliveries?: string[];
  /** True when every required check is zero. */
  readonly ok: boolean;
}

/** The step checks. Lists hold `scope/key:step` (`scope/key:completion` for the completion). */
export interface StepsCheck {
  /**
   * Database steps whose write did not happen exactly once with its record: more than one
   * row; a row without a record, or under another fence than the record's; a record, or a
   * completed key, without a row.
   */
  readonly databaseNotOnce: string[];
  /** External steps called after they were recorded: under a later fence, or by the recording fence after its record. */
  readonly calledAfterRecord: string[];
  /** External steps whose calls the record does not account for: more calls than starts, or no call by the fence that recorded it. */
  readonly uncountedCalls: string[];
  /** Steps (or completions) with a write or call before the step before them was recorded. */
  readonly outOfOrder: string[];
  /**
   * Calls that reached the external system after a later owner recorded the step, made by an
   * earlier fence that had started the step (a zombie's call in flight when it lost the key):
   * allowed, at most once per lease; reported.
   */
  readonly lateZombieCalls: number;
  /** External steps called more than once (under several fences), and their extra calls. */
  readonly repeatedSteps: number;
  readonly extraCalls: number;
}

/** The job-fault checks. Lists hold `scope/key`. */
export interface JobFaultsCheck {
  /** Acknowledged keys by fault (`none`: without one). */
  readonly keysByFault: Readonly<Record<string, number>>;
  /**
   * Keys without a failing fault that failed: lost (acknowledged, not completed with an effect,
   * no job left), stored `failed`, or with a BullMQ job `failed`. A job failed for a group-mate's
   * fault (or for a fault of the system's) is one.
   */
  readonly innocentFailures: string[];
  /**
   * Keys with a failing fault that committed an effect or completed, or (acknowledged, no job
   * left for them) did not end `failed`.
   */
  readonly poisonNotFailed: string[];
  /**
   * Keys whose effect row saw another job's state: a tenant neither unset (null or empty) nor
   * its own, or a `synchronous_commit` other than `on` without a `set-local` fault of its own.
   */
  readonly settingsSeenAcross: string[];
  /**
   * Keys with a state fault whose effect row committed in a transaction with another key's: a
   * job that changed transaction-scoped state shared its transaction.
   */
  readonly stateFaultsGrouped: string[];
  /**
   * Keys with a state fault whose effect row does not show it (`set-local`: `synchronous_commit`
   * `off`; the tenant faults: its own tenant): the handler did not send its fault, and the
   * checks above would pass without testing anything.
   */
  readonly faultsNotSeen: string[];
  /**
   * Keys with a failing fault with a BullMQ job failed for another reason than the fault's
   * error: a fault of the system's (a cut connection) used up the job's attempt, which only the
   * job's own error may do.
   */
  readonly poisonFailedOtherwise: string[];
  /** Effect rows committed in a transaction with other keys' rows (group commit at work), and those transactions. */
  readonly groupedEffects: number;
  readonly sharedTransactions: number;
}

const TERMINAL = new Set(['completed', 'fenced', 'released', 'failed', 'lease-lost']);
const idOf = (row: { scope?: string; key?: string }) => `${row.scope}/${row.key}`;

/** Checks one history. */
export function checkHistory(history: History): CheckResult {
  const effectsByKey = groupBy(history.effects, idOf);
  const keyRows = new Map(history.keys.map((row) => [idOf(row), row]));

  const acknowledged = [...history.produced].filter(([, p]) => p.acks > 0).map(([id]) => id);
  // Keys whose jobs must fail (the job-fault profile): checked by their own rules, not as losses.
  const poisoned = (id: string) => isFailingJobFault(history.jobFaults?.get(id));
  const notDone = acknowledged.filter((id) => !effectsByKey.has(id) || keyRows.get(id)?.status !== 'completed');
  const stillQueued = (id: string) => history.pending?.has(id) === true && keyRows.get(id)?.status !== 'failed';
  const lost = notDone.filter((id) => !stillQueued(id) && !poisoned(id));
  const unfinished = notDone.filter(stillQueued);
  const failedKeys = history.keys.filter((row) => row.status === 'failed' && !poisoned(idOf(row))).map(idOf);
  const failedJobs = (history.failedJobs ?? []).filter((job) => !poisoned(job.id));
  const leftProcessing = history.keys.filter((row) => row.status === 'processing').map(idOf);
  const duplicated = [...effectsByKey].filter(([, rows]) => rows.length > 1).map(([id]) => id);
  const unexpected = [...effectsByKey.keys()].filter((id) => !history.produced.has(id));
  const fenceMismatches = [...effectsByKey]
    .filter(([id, rows]) => rows.length === 1 && keyRows.get(id)?.status === 'completed' && keyRows.get(id)!.fence !== rows[0]!.fence)
    .map(([id]) => id);

  // External calls: one per lease at most; more per key only after takeovers. A call made on the
  // fast path is under no lease: in a run mixing both paths, only leased runs' calls are held to it.
  const callsByKey = groupBy(history.externalCalls, idOf);
  const leasedCalls = history.fastPath === true ? history.externalCalls : history.externalCalls.filter((row) => row.fastPath !== true);
  const callsByLease = groupBy(leasedCalls, (row) => `${idOf(row)}#${row.fence}`);
  let keysCalledMoreThanOnce = 0;
  let extraCalls = 0;
  for (const rows of callsByKey.values()) {
    if (rows.length > 1) {
      keysCalledMoreThanOnce++;
      extraCalls += rows.length - 1;
    }
  }
  const repeatedWithinLease = [...callsByLease].filter(([, rows]) => rows.length > 1).map(([id]) => id);

  // Outcomes and injected crashes, from the workers' logs.
  const outcomes: Record<string, number> = {};
  const injectedCrashes: Record<string, number> = {};
  const faultTimes = new Map<number, number>();
  for (const line of history.lines) {
    if (line.outcome) outcomes[line.outcome] = (outcomes[line.outcome] ?? 0) + 1;
    if (line.msg === FAULT_LOG_MESSAGE && line.point) {
      injectedCrashes[line.point] = (injectedCrashes[line.point] ?? 0) + 1;
      faultTimes.set(line.pid, line.time);
    }
  }

  // Owners of each key: who claimed it (fence), from when, until when they stopped acting.
  const exitAt = new Map(history.exits.map((exit) => [exit.pid, exit.at]));
  interface Owner { pid: number; fence: number; start: number; end: number }
  const owners = new Map<string, Owner[]>();
  const terminal = new Map<string, number>();
  for (const line of history.lines) {
    if (line.outcome && TERMINAL.has(line.outcome) && line.fence !== undefined) {
      const lease = `${line.pid}:${idOf(line)}#${line.fence}`;
      if (!terminal.has(lease)) terminal.set(lease, line.time);
    }
  }
  const endOfRun = history.lines.reduce((latest, line) => Math.max(latest, line.time), history.stoppedAt);
  for (const line of history.lines) {
    if ((line.outcome === 'claimed' || line.outcome === 'taken-over') && line.fence !== undefined) {
      const id = idOf(line);
      const died = Math.min(exitAt.get(line.pid) ?? Infinity, faultTimes.get(line.pid) ?? Infinity);
      const end = terminal.get(`${line.pid}:${id}#${line.fence}`) ?? (Number.isFinite(died) ? died : endOfRun);
      const list = owners.get(id) ?? [];
      list.push({ pid: line.pid, fence: line.fence, start: line.time, end });
      owners.set(id, list);
    }
  }
  let leaseOverlaps = 0;
  const committedOverlaps: string[] = [];
  for (const [id, list] of owners) {
    const committedFences = new Set((effectsByKey.get(id) ?? []).map((row) => row.fence));
    let overlapped = false;
    let committedOverlap = false;
    for (const a of list) {
      for (const b of list) {
        if (a.fence < b.fence && b.start < a.end) {
          overlapped = true;
          if (committedFences.has(a.fence) && committedFences.has(b.fence)) committedOverlap = true;
        }
      }
    }
    if (overlapped) leaseOverlaps++;
    if (committedOverlap) committedOverlaps.push(id);
  }

  // Recovery after each SIGKILL: keys the dead worker held, until their effect committed.
  const samples: number[] = [];
  let killedProcesses = 0;
  const firstEffectAt = new Map([...effectsByKey].map(([id, rows]) => [id, Math.min(...rows.map((r) => r.at))]));
  // Indexed by pid: a long run has hundreds of deaths and a million owners.
  const ownedByPid = new Map<number, Array<{ id: string; owner: Owner }>>();
  for (const [id, list] of owners) {
    for (const owner of list) {
      const held = ownedByPid.get(owner.pid) ?? [];
      held.push({ id, owner });
      ownedByPid.set(owner.pid, held);
    }
  }
  // A pid can be reused by a later worker: a process held only what it claimed after the
  // previous exit of its pid and before its own.
  const previousExitAt = new Map<WorkerExit, number>();
  const lastExitOfPid = new Map<number, number>();
  for (const exit of [...history.exits].sort((a, b) => a.at - b.at)) {
    previousExitAt.set(exit, lastExitOfPid.get(exit.pid) ?? -Infinity);
    lastExitOfPid.set(exit.pid, exit.at);
  }
  for (const exit of history.exits) {
    if (exit.signal !== 'SIGKILL' || exit.at >= history.stoppedAt) continue;
    killedProcesses++;
    const diedAt = Math.min(exit.at, faultTimes.get(exit.pid) ?? Infinity);
    for (const { id, owner } of ownedByPid.get(exit.pid) ?? []) {
      if (owner.start <= previousExitAt.get(exit)! || owner.start > exit.at) continue;
      if (terminal.has(`${owner.pid}:${id}#${owner.fence}`)) continue;
      const doneAt = firstEffectAt.get(id);
      if (doneAt !== undefined && doneAt > diedAt) samples.push(doneAt - diedAt);
    }
  }

  const steps = history.steps ? checkSteps(history.steps, history.externalCalls, effectsByKey, keyRows) : undefined;
  // A committed job delivered again: a replay under the job id of the run that committed the key.
  let redeliveredCommittedJobs: string[] | undefined;
  let replaysByOlderDeliveries: string[] | undefined;
  if (history.completedJobsKept) {
    const committedBy = new Map<string, WorkerLogLine>();
    for (const line of history.lines) if (line.outcome === 'completed' && line.jobId) committedBy.set(idOf(line), line);
    const replaysOfTheCommittedJob = history.lines.filter((line) => line.outcome === 'replayed' && line.jobId !== undefined && committedBy.get(idOf(line))?.jobId === line.jobId);
    // A delivery older than the one that committed (a worker that held the job through a stall
    // and claimed only after the new holder's commit) replays, but it is not the job delivered
    // again. Without delivery numbers, every replay under the job id counts.
    const older = (line: WorkerLogLine) => {
      const committing = committedBy.get(idOf(line))!.delivery;
      return line.delivery !== undefined && committing !== undefined && line.delivery < committing;
    };
    redeliveredCommittedJobs = replaysOfTheCommittedJob.filter((line) => !older(line)).map(idOf);
    replaysByOlderDeliveries = replaysOfTheCommittedJob.filter(older).map(idOf);
  }

  const jobFaults = history.jobFaults
    ? checkJobFaults(history, history.jobFaults, { acknowledged, effectsByKey, keyRows, stillQueued, lost })
    : undefined;

  const ok =
    lost.length === 0 &&
    unfinished.length === 0 &&
    failedJobs.length === 0 &&
    leftProcessing.length === 0 &&
    duplicated.length === 0 &&
    unexpected.length === 0 &&
    committedOverlaps.length === 0 &&
    fenceMismatches.length === 0 &&
    (!history.jobFinishedInEffect || redeliveredCommittedJobs?.length === 0) &&
    (history.fastPath === true || repeatedWithinLease.length === 0) &&
    (steps === undefined ||
      (steps.databaseNotOnce.length === 0 && steps.calledAfterRecord.length === 0 && steps.uncountedCalls.length === 0 && steps.outOfOrder.length === 0)) &&
    (jobFaults === undefined ||
      (jobFaults.innocentFailures.length === 0 &&
        jobFaults.poisonNotFailed.length === 0 &&
        jobFaults.settingsSeenAcross.length === 0 &&
        jobFaults.stateFaultsGrouped.length === 0 &&
        jobFaults.faultsNotSeen.length === 0 &&
        jobFaults.poisonFailedOtherwise.length === 0));
  return {
    acknowledgedKeys: acknowledged.length,
    lost,
    unfinished,
    failedKeys,
    failedJobs,
    leftProcessing,
    duplicated,
    unexpected,
    fenceMismatches,
    committedOverlaps,
    leaseOverlaps,
    externalCalls: { total: history.externalCalls.length, keysCalledMoreThanOnce, extraCalls },
    repeatedWithinLease,
    ...(steps ? { steps } : {}),
    ...(jobFaults ? { jobFaults } : {}),
    outcomes,
    injectedCrashes,
    killedProcesses,
    recoveryMs: percentiles(samples),
    ...(redeliveredCommittedJobs ? { redeliveredCommittedJobs } : {}),
    ...(replaysByOlderDeliveries ? { replaysByOlderDeliveries } : {}),
    ok,
  };
}

/**
 * The multi-step checks, per key and step: database steps exactly once with their record;
 * external calls never after the record (calls within one fence are the lease check's); every
 * call counted by the record's starts; nothing before the step before it was recorded.
 */
function checkSteps(
  history: StepsHistory,
  externalCalls: readonly ExecutionRow[],
  effectsByKey: ReadonlyMap<string, readonly ExecutionRow[]>,
  keyRows: ReadonlyMap<string, KeyRow>,
): StepsCheck {
  const stepOf = (row: { scope: string; key: string }, name: string) => `${idOf(row)}:${name}`;
  const records = new Map(history.records.map((record) => [stepOf(record, record.name), record]));
  const writes = groupBy(history.effects, (row) => stepOf(row, row.step ?? ''));
  const calls = groupBy(
    externalCalls.filter((row) => row.step !== undefined),
    (row) => stepOf(row, row.step!),
  );
  const keys = new Set([...history.records, ...history.effects, ...externalCalls.filter((row) => row.step !== undefined)].map(idOf));
  for (const [id, row] of keyRows) if (row.status === 'completed') keys.add(id);

  const databaseNotOnce: string[] = [];
  const calledAfterRecord: string[] = [];
  const uncountedCalls: string[] = [];
  const outOfOrder: string[] = [];
  let lateZombieCalls = 0;
  let repeatedSteps = 0;
  let extraCalls = 0;
  for (const id of keys) {
    const completed = keyRows.get(id)?.status === 'completed';
    let before: StepRecordRow | undefined;
    let first = true;
    for (const spec of history.sequence) {
      const step = `${id}:${spec.name}`;
      const record = records.get(step);
      const recordedAt = record?.recordedAt ?? null;
      const rows = (spec.kind === 'database' ? writes : calls).get(step) ?? [];
      if (spec.kind === 'database') {
        const [row] = rows;
        if (
          rows.length > 1 ||
          (row !== undefined && (recordedAt === null || record!.fence !== row.fence)) ||
          (row === undefined && (recordedAt !== null || completed))
        ) {
          databaseNotOnce.push(step);
        }
      } else {
        if (rows.length > 1) {
          repeatedSteps++;
          extraCalls += rows.length - 1;
        }
        if (recordedAt !== null) {
          let after = false;
          for (const row of rows) {
            if (row.fence > record!.fence || (row.fence === record!.fence && row.at > recordedAt)) after = true;
            else if (row.fence < record!.fence && row.at > recordedAt) lateZombieCalls++;
          }
          if (after) calledAfterRecord.push(step);
        }
        if ((record !== undefined && rows.length > record.starts) || (record === undefined && rows.length > 0) || (recordedAt !== null && !rows.some((row) => row.fence === record!.fence))) {
          uncountedCalls.push(step);
        }
      }
      if (!first && rows.length > 0 && !recordedBefore(before, rows)) outOfOrder.push(step);
      before = record;
      first = false;
    }
    const completion = effectsByKey.get(id) ?? [];
    if (history.sequence.length > 0 && completion.length > 0 && !recordedBefore(before, completion)) outOfOrder.push(`${id}:completion`);
  }
  return { databaseNotOnce, calledAfterRecord, uncountedCalls, outOfOrder, lateZombieCalls, repeatedSteps, extraCalls };
}

/**
 * The job-fault checks: no job fails for another's fault, every job with a failing fault fails
 * and commits nothing, no job sees another's state, and a job that changed state committed in a
 * transaction of its own.
 */
function checkJobFaults(
  history: History,
  faults: ReadonlyMap<string, JobFault>,
  seen: {
    readonly acknowledged: readonly string[];
    readonly effectsByKey: ReadonlyMap<string, readonly ExecutionRow[]>;
    readonly keyRows: ReadonlyMap<string, KeyRow>;
    readonly stillQueued: (id: string) => boolean;
    readonly lost: readonly string[];
  },
): JobFaultsCheck {
  const { acknowledged, effectsByKey, keyRows, stillQueued } = seen;
  const failing = (id: string) => isFailingJobFault(faults.get(id));
  const keysByFault: Record<string, number> = {};
  for (const id of acknowledged) {
    const fault = faults.get(id) ?? 'none';
    keysByFault[fault] = (keysByFault[fault] ?? 0) + 1;
  }

  const innocentFailures = new Set<string>(seen.lost);
  for (const row of history.keys) if (row.status === 'failed' && !failing(idOf(row))) innocentFailures.add(idOf(row));
  for (const job of history.failedJobs ?? []) if (!failing(job.id)) innocentFailures.add(job.id);

  const poisonNotFailed = new Set<string>();
  for (const id of faults.keys()) {
    if (!failing(id)) continue;
    if (effectsByKey.has(id) || keyRows.get(id)?.status === 'completed') poisonNotFailed.add(id);
  }
  for (const id of acknowledged) {
    if (failing(id) && !stillQueued(id) && keyRows.get(id)?.status !== 'failed') poisonNotFailed.add(id);
  }

  const settingsSeenAcross = new Set<string>();
  const faultsNotSeen = new Set<string>();
  for (const row of history.effects) {
    const id = idOf(row);
    const fault = faults.get(id);
    const tenant = row.seenTenant ?? '';
    if ((tenant !== '' && tenant !== id) || (row.seenSynchronousCommit !== 'on' && fault !== 'set-local')) settingsSeenAcross.add(id);
    if ((fault === 'set-local' && row.seenSynchronousCommit !== 'off') || ((fault === 'set-tenant' || fault === 'set-tenant-quietly') && tenant !== id)) {
      faultsNotSeen.add(id);
    }
  }

  const byTransaction = groupBy(
    history.effects.filter((row) => row.txid !== undefined),
    (row) => String(row.txid),
  );
  const stateFaultsGrouped = new Set<string>();
  let groupedEffects = 0;
  let sharedTransactions = 0;
  for (const rows of byTransaction.values()) {
    if (new Set(rows.map(idOf)).size < 2) continue;
    sharedTransactions++;
    groupedEffects += rows.length;
    for (const row of rows) {
      const fault = faults.get(idOf(row));
      if (fault !== undefined && !isFailingJobFault(fault)) stateFaultsGrouped.add(idOf(row));
    }
  }

  const poisonFailedOtherwise = new Set<string>();
  for (const job of history.failedJobs ?? []) {
    const fault = faults.get(job.id);
    if (isFailingJobFault(fault) && !JOB_FAULT_ERRORS[fault].test(job.reason)) poisonFailedOtherwise.add(job.id);
  }

  return {
    keysByFault,
    innocentFailures: [...innocentFailures],
    poisonNotFailed: [...poisonNotFailed],
    settingsSeenAcross: [...settingsSeenAcross],
    stateFaultsGrouped: [...stateFaultsGrouped],
    faultsNotSeen: [...faultsNotSeen],
    poisonFailedOtherwise: [...poisonFailedOtherwise],
    groupedEffects,
    sharedTransactions,
  };
}

/** Whether `record` was recorded before each of `rows` was written. */
function recordedBefore(record: StepRecordRow | undefined, rows: readonly ExecutionRow[]): boolean {
  const recordedAt = record?.recordedAt ?? null;
  return recordedAt !== null && rows.every((row) => row.at > recordedAt);
}

/** p50, p99 and max of `values` (nearest rank). */
export function percentiles(values: readonly number[]): Percentiles {
  if (values.length === 0) return { samples: 0, p50: null, p99: null, max: null };
  const sorted = [...values].sort((a, b) => a - b);
  const rank = (q: number) => sorted[Math.max(0, Math.ceil(q * sorted.length) - 1)]!;
  return { samples: sorted.length, p50: rank(0.5), p99: rank(0.99), max: sorted[sorted.length - 1]! };
}

function groupBy<T>(items: readonly T[], keyOf: (item: T) => string): Map<string, T[]> {
  const groups = new Map<string, T[]>();
  for (const item of items) {
    const key = keyOf(item);
    const list = groups.get(key);
    if (list) list.push(item);
    else groups.set(key, [item]);
  }
  return groups;
}
