/**
 * The report of a chaos run: a summary table for the terminal and a JSON file with the same
 * numbers, the fault schedule as carried out, and the history of every key that failed a check.
 */
import { closeSync, mkdirSync, openSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { CRASH_POINTS, PROTOCOL_CRASH_POINTS } from './fault-injection.js';
import type { ChaosRun, FailoverResend } from './harness.js';

/** The numbers of a run, as written to the JSON report. */
export interface ChaosSummary {
  readonly verdict: 'PASS' | 'FAIL';
  readonly seed: number;
  readonly workers: number;
  readonly concurrency: number;
  readonly leaseMs: number;
  readonly fastPath: boolean;
  readonly groupCommit: boolean;
  /** The multi-step profile (`--steps`). */
  readonly steps: boolean;
  /** The database-only handler with its defaults (`--database-only`): fast path and group commit. */
  readonly databaseOnly: boolean;
  /** With `databaseOnly`: a share of keys carried a job fault (`--job-faults`). */
  readonly jobFaults: boolean;
  /** The workers reached Postgres through PgBouncer in transaction mode. */
  readonly pgBouncer: boolean;
  /** Redis was a private Redis Cluster (`--redis-cluster`). */
  readonly redisCluster: boolean;
  /** Redis was a private Sentinel set-up (`--redis-sentinel`). */
  readonly redisSentinel?: boolean;
  /** Postgres was a private Patroni cluster behind HAProxy (`--patroni`), with this replication. */
  readonly patroni?: 'synchronous' | 'asynchronous';
  readonly chaosSeconds: number;
  readonly jobs: number;
  readonly requests: Readonly<Record<string, number>>;
  readonly uniqueKeys: number;
  readonly acknowledgedKeys: number;
  readonly faults: {
    readonly kills: number;
    readonly pauses: number;
    readonly pgTerminations: number;
    readonly pgBackendsTerminated: number;
    readonly pgCrashes: number;
    readonly pgRestarts: number;
    readonly pgPauses: number;
    /** Starts of the private Postgres that ran crash recovery (its log says so). */
    readonly pgCrashRecoveries: number;
    readonly redisClientKills: number;
    readonly redisClientsKilled: number;
    readonly redisRestarts: number;
    /** Coordinated failovers of the queue's shard (Redis Cluster only). */
    readonly redisFailovers: number;
    /** The Patroni profile's faults, by kind, and the longest time until the cluster was healthy again. */
    readonly patroni?: {
      readonly leaderPostgresKills: number;
      readonly leaderCrashes: number;
      /** Crashes of the leader while its standby had received nothing for a while (`patroni-lagging-crash`). */
      readonly laggingCrashes: number;
      readonly switchovers: number;
      readonly failovers: number;
      readonly leaderChanges: number;
      readonly longestUnhealthyMs: number;
    };
    readonly crashesArmed: number;
    readonly injectedCrashes: Readonly<Record<string, number>>;
    readonly skipped: number;
  };
  readonly workerProcessesStarted: number;
  /** Workers that died by themselves (not killed, not crashed on purpose): a robustness bug. */
  readonly unexpectedWorkerExits: number;
  /** Workers that exited at start because a server was down (started again by the fleet). */
  readonly workerStartFailures: number;
  readonly takeovers: number;
  readonly fencedCommits: number;
  readonly leaseLost: number;
  readonly deferrals: number;
  readonly replays: number;
  readonly released: number;
  readonly recoveryAfterKillMs: { readonly samples: number; readonly p50: number | null; readonly p99: number | null; readonly max: number | null };
  readonly externalCalls: { readonly total: number; readonly keysCalledMoreThanOnce: number; readonly extraCalls: number };
  readonly leaseOverlaps: number;
  /** Committed jobs delivered again (counted when completed jobs are kept: the Postgres queue backend). */
  readonly redeliveredCommittedJobs?: number;
  /** Replays under the committing job's id by an older delivery of it (a stall's race, not a redelivery). */
  readonly replaysByOlderDeliveries?: number;
  /** Where BullMQ kept the queue. */
  readonly queueBackend?: 'redis' | 'postgres';
  readonly lost: number;
  readonly unfinished: number;
  readonly duplicated: number;
  readonly unexpected: number;
  readonly committedOverlaps: number;
  readonly fenceMismatches: number;
  readonly externalCallsRepeatedWithinLease: number;
  /** The step checks (the multi-step profile only). */
  readonly stepChecks?: {
    readonly databaseNotOnce: number;
    readonly calledAfterRecord: number;
    readonly uncountedCalls: number;
    readonly outOfOrder: number;
    readonly lateZombieCalls: number;
    readonly repeatedSteps: number;
    readonly extraCalls: number;
  };
  /** The job-fault checks (`--job-faults` only). */
  readonly jobFaultChecks?: {
    readonly keysByFault: Readonly<Record<string, number>>;
    readonly innocentFailures: number;
    readonly poisonNotFailed: number;
    readonly settingsSeenAcross: number;
    readonly stateFaultsGrouped: number;
    readonly faultsNotSeen: number;
    readonly poisonFailedOtherwise: number;
    readonly groupedEffects: number;
    readonly sharedTransactions: number;
    /** Errors the faults made Postgres log, by cause. */
    readonly serverErrors: Readonly<Record<string, number>>;
  };
  /** A key-feature profile's rules (`--tombstones`, `--concurrency-limits`, `--coalescing`, `--racing-schedulers`): numbers, and each rule's failures. */
  readonly keyFeature?: {
    readonly feature: string;
    readonly numbers: ReadonlyArray<readonly [string, string]>;
    readonly rules: ReadonlyArray<{ readonly rule: string; readonly failing: number }>;
  };
  /** Keys stored `failed`, and BullMQ jobs `failed` (with `--job-faults`: of keys without a failing fault). */
  readonly failedKeys: number;
  readonly failedJobs: number;
  readonly keysLeftProcessing: number;
  readonly producerRetries: number;
  readonly unacknowledgedRequests: number;
  readonly drained: boolean;
  /**
   * On Redis Sentinel: after the first drain, the acknowledged keys the changes of master had lost
   * (of them outside the re-sending windows), and the keys acknowledged around a change of master
   * that the producer sent again (`failover-resend.ts`).
   */
  readonly resent?: FailoverResend;
  /** With `--reconcile`: completed jobs checked, those whose key had vanished (of them left processing), sent again. */
  readonly reconciled?: { readonly checked: number; readonly vanished: number; readonly unfinished: number; readonly reenqueued: number };
  readonly drainSeconds: number;
  readonly totalSeconds: number;
}

/** Reduces a run to its summary. */
export function summarize(run: ChaosRun): ChaosSummary {
  const { check, load, events, options } = run;
  const done = events.filter((e) => !e.skipped);
  const count = (kind: string) => done.filter((e) => e.kind === kind).length;
  const cut = (kind: string) => done.filter((e) => e.kind === kind).reduce((sum, e) => sum + (e.cut ?? 0), 0);
  const outcome = (name: string) => check.outcomes[name] ?? 0;
  return {
    verdict: check.ok && run.drained && (run.keyFeature?.ok ?? true) ? 'PASS' : 'FAIL',
    seed: options.seed,
    workers: options.workers,
    concurrency: options.concurrency,
    leaseMs: options.leaseMs,
    fastPath: options.fastPath,
    groupCommit: options.groupCommit,
    steps: options.steps,
    databaseOnly: options.databaseOnly ?? false,
    jobFaults: options.jobFaults ?? false,
    pgBouncer: options.pgBouncer ?? false,
    redisCluster: options.redisCluster ?? false,
    ...(options.redisSentinel ? { redisSentinel: true } : {}),
    ...(options.patroni ? { patroni: options.patroni } : {}),
    chaosSeconds: Math.round(run.timings.chaosMs / 1000),
    ...(run.keyFeature
      ? { keyFeature: { feature: run.keyFeature.feature, numbers: run.keyFeature.numbers, rules: run.keyFeature.rules.map((r) => ({ rule: r.rule, failing: r.failing.length })) } }
      : {}),
    jobs: load.acknowledged,
    requests: load.requests,
    uniqueKeys: load.keys.size,
    acknowledgedKeys: check.acknowledgedKeys,
    faults: {
      kills: count('kill'),
      pauses: count('pause'),
      pgTerminations: count('pg-terminate'),
      pgBackendsTerminated: cut('pg-terminate'),
      ...(options.patroni
        ? {
            patroni: {
              leaderPostgresKills: count('patroni-kill-postgres'),
              leaderCrashes: count('patroni-crash-leader'),
              laggingCrashes: count('patroni-lagging-crash'),
              switchovers: count('patroni-switchover'),
              failovers: count('patroni-failover'),
              leaderChanges: done.filter((e) => e.leader && e.leader.from !== e.leader.to).length,
              longestUnhealthyMs: Math.max(0, ...done.map((e) => e.leader?.healthyAfterMs ?? 0)),
            },
          }
        : {}),
      pgCrashes: count('pg-crash'),
      pgRestarts: count('pg-restart'),
      pgPauses: count('pg-pause'),
      pgCrashRecoveries: run.postgresRecoveries,
      redisClientKills: count('redis-client-kill'),
      redisClientsKilled: cut('redis-client-kill'),
      redisRestarts: count('redis-restart'),
      redisFailovers: count('redis-failover'),
      crashesArmed: done.filter((e) => e.kind.startsWith('crash-')).length,
      injectedCrashes: Object.fromEntries(
        (options.steps ? CRASH_POINTS : PROTOCOL_CRASH_POINTS).map((point) => [point, check.injectedCrashes[point] ?? 0]),
      ),
      skipped: events.length - done.length,
    },
    workerProcessesStarted: run.workerStarts,
    unexpectedWorkerExits: run.unexpectedExits.length,
    workerStartFailures: run.history.exits.filter((exit) => exit.beforeReady && exit.signal === null).length,
    takeovers: outcome('taken-over'),
    fencedCommits: outcome('fenced'),
    leaseLost: outcome('lease-lost'),
    deferrals: outcome('deferred'),
    replays: outcome('replayed'),
    released: outcome('released'),
    recoveryAfterKillMs: check.recoveryMs,
    externalCalls: check.externalCalls,
    leaseOverlaps: check.leaseOverlaps,
    ...(check.redeliveredCommittedJobs ? { redeliveredCommittedJobs: check.redeliveredCommittedJobs.length } : {}),
    ...(check.replaysByOlderDeliveries ? { replaysByOlderDeliveries: check.replaysByOlderDeliveries.length } : {}),
    queueBackend: run.options.queueBackend ?? 'redis',
    lost: check.lost.length,
    unfinished: check.unfinished.length,
    duplicated: check.duplicated.length,
    unexpected: check.unexpected.length,
    committedOverlaps: check.committedOverlaps.length,
    fenceMismatches: check.fenceMismatches.length,
    externalCallsRepeatedWithinLease: check.repeatedWithinLease.length,
    ...(check.steps
      ? {
          stepChecks: {
            databaseNotOnce: check.steps.databaseNotOnce.length,
            calledAfterRecord: check.steps.calledAfterRecord.length,
            uncountedCalls: check.steps.uncountedCalls.length,
            outOfOrder: check.steps.outOfOrder.length,
            lateZombieCalls: check.steps.lateZombieCalls,
            repeatedSteps: check.steps.repeatedSteps,
            extraCalls: check.steps.extraCalls,
          },
        }
      : {}),
    ...(check.jobFaults
      ? {
          jobFaultChecks: {
            keysByFault: check.jobFaults.keysByFault,
            innocentFailures: check.jobFaults.innocentFailures.length,
            poisonNotFailed: check.jobFaults.poisonNotFailed.length,
            settingsSeenAcross: check.jobFaults.settingsSeenAcross.length,
            stateFaultsGrouped: check.jobFaults.stateFaultsGrouped.length,
            faultsNotSeen: check.jobFaults.faultsNotSeen.length,
            poisonFailedOtherwise: check.jobFaults.poisonFailedOtherwise.length,
            groupedEffects: check.jobFaults.groupedEffects,
            sharedTransactions: check.jobFaults.sharedTransactions,
            serverErrors: run.serverErrorsOfFaults ?? {},
          },
        }
      : {}),
    failedKeys: check.failedKeys.length,
    failedJobs: check.failedJobs.length,
    keysLeftProcessing: check.leftProcessing.length,
    producerRetries: load.retries,
    unacknowledgedRequests: load.unacknowledged,
    drained: run.drained,
    ...(run.resent ? { resent: run.resent } : {}),
    ...(run.reconciled ? { reconciled: run.reconciled } : {}),
    drainSeconds: Math.round(run.timings.drainMs / 1000),
    totalSeconds: Math.round(run.timings.totalMs / 1000),
  };
}

/** How the workers ran their jobs, e.g. `fast path, group commit`. */
function paths(s: ChaosSummary): string {
  if (s.databaseOnly) return `database-only handler with its defaults: fast path, group commit${s.jobFaults ? '; job faults' : ''}`;
  return `${s.fastPath ? 'fast path' : `lease ${s.leaseMs} ms`}${s.groupCommit ? ', group commit' : ''}`;
}

/** The summary as a two-column table (Markdown, so it pastes into docs/chaos.md as is). */
export function formatTable(summary: ChaosSummary): string {
  const s = summary;
  const ms = (v: number | null) => (v === null ? 'n/a' : `${(v / 1000).toFixed(2)} s`);
  const crashes = s.faults.injectedCrashes;
  const rows: Array<[string, string]> = [
    ['verdict', s.verdict],
    ['seed', String(s.seed)],
    ['workers × concurrency', `${s.workers} × ${s.concurrency} (${paths(s)}${s.steps ? ', steps' : ''}${s.pgBouncer ? ', through PgBouncer' : ''}${s.redisCluster ? ', on Redis Cluster' : ''}${s.redisSentinel ? ', on Redis Sentinel' : ''}${s.patroni ? `, on Patroni (${s.patroni} replication)` : ''})`],
    ['chaos phase', `${s.chaosSeconds} s (drain ${s.drainSeconds} s, total ${s.totalSeconds} s)`],
    ['jobs (acknowledged adds)', `${s.jobs} (new ${s.requests.new}, repeated ${s.requests.repeat}, foreign ${s.requests.foreign}, concurrent ${s.requests.concurrent})`],
    ['unique keys (acknowledged)', `${s.uniqueKeys} (${s.acknowledgedKeys})`],
    ['worker kills (SIGKILL)', String(s.faults.kills)],
    ['pauses (SIGSTOP past the lease)', String(s.faults.pauses)],
    ['Postgres backends terminated', `${s.faults.pgBackendsTerminated} in ${s.faults.pgTerminations} rounds`],
    ['Postgres crashes (SIGKILL, crash recovery) / fast restarts / pauses past the lease', `${s.faults.pgCrashes} (${s.faults.pgCrashRecoveries} recoveries) / ${s.faults.pgRestarts} / ${s.faults.pgPauses}`],
    ['Redis connections killed', `${s.faults.redisClientsKilled} in ${s.faults.redisClientKills} rounds`],
    ['Redis restarts (crash + AOF reload)', String(s.faults.redisRestarts)],
    ...(s.faults.patroni
      ? [
          [
            'Patroni: leader Postgres killed / leader crashed / crashed with a lagging standby / switchovers / failovers (leader changes; longest until healthy)',
            `${s.faults.patroni.leaderPostgresKills} / ${s.faults.patroni.leaderCrashes} / ${s.faults.patroni.laggingCrashes} / ${s.faults.patroni.switchovers} / ${s.faults.patroni.failovers} (${s.faults.patroni.leaderChanges}; ${(s.faults.patroni.longestUnhealthyMs / 1000).toFixed(1)} s)`,
          ] as [string, string],
        ]
      : []),
    ...(s.redisCluster ? [['Redis Cluster failovers of the queue\'s shard (coordinated)', String(s.faults.redisFailovers)] as [string, string]] : []),
    ...(s.redisSentinel ? [['Redis Sentinel failovers (SENTINEL FAILOVER, not coordinated with writes)', String(s.faults.redisFailovers)] as [string, string]] : []),
    [
      'injected crashes by point',
      `${Object.entries(crashes)
        .map(([point, n]) => `${point} ${n}`)
        .join(', ')} (${s.faults.crashesArmed} armed)`,
    ],
    ['worker processes started (died by themselves; could not start, a server down)', `${s.workerProcessesStarted} (${s.unexpectedWorkerExits}; ${s.workerStartFailures})`],
    ['takeovers', String(s.takeovers)],
    ['fenced commits', `${s.fencedCommits} (leases lost: ${s.leaseLost})`],
    ['deferrals', String(s.deferrals)],
    ['replays', String(s.replays)],
    ['recovery after a kill p50 / p99 / max', `${ms(s.recoveryAfterKillMs.p50)} / ${ms(s.recoveryAfterKillMs.p99)} / ${ms(s.recoveryAfterKillMs.max)} (${s.recoveryAfterKillMs.samples} keys)`],
    [
      'external calls (keys called > once, extra calls)',
      `${s.externalCalls.total} (${s.externalCalls.keysCalledMoreThanOnce}, ${s.externalCalls.extraCalls}; ${s.fastPath || s.databaseOnly ? 'fast path: after rolled-back attempts' : 'all after takeovers'})`,
    ],
    ['lease overlaps (zombie still running, fenced)', String(s.leaseOverlaps)],
    ...(s.resent
      ? [
          [
            'adds lost by the changes of master (outside the re-sending windows) / keys sent again (given up)',
            `${s.resent.lost} of ${s.acknowledgedKeys} keys in ${s.resent.masterChanges} changes (${s.resent.lostOutsideWindows}) / ${s.resent.resent} (${s.resent.unacknowledged})`,
          ] as [string, string],
        ]
      : []),
    ...(s.reconciled
      ? [
          [
            'reconciler: completed jobs checked / whose key vanished (left processing) / sent again',
            `${s.reconciled.checked} / ${s.reconciled.vanished} (${s.reconciled.unfinished}) / ${s.reconciled.reenqueued}`,
          ] as [string, string],
        ]
      : []),
    ...(s.redeliveredCommittedJobs === undefined
      ? []
      : [
          [s.queueBackend === 'postgres' ? '**committed jobs delivered again**' : 'committed jobs delivered again', String(s.redeliveredCommittedJobs)] as [string, string],
          ['replays by a delivery older than the committing one (held through a stall)', String(s.replaysByOlderDeliveries ?? 0)] as [string, string],
        ]),
    ['**lost**', s.unfinished > 0 ? `${s.lost} (and ${s.unfinished} not finished: still queued when the drain timed out)` : String(s.lost)],
    [s.jobFaults ? '**failed jobs** (of keys without a failing fault)' : '**failed jobs**', String(s.failedJobs)],
    ['**keys left processing**', String(s.keysLeftProcessing)],
    ['**duplicated**', String(s.duplicated)],
    ['**unexpected**', String(s.unexpected)],
    ['**committed overlaps**', String(s.committedOverlaps)],
    [
      s.fastPath || s.databaseOnly ? '**fence mismatches** / external calls repeated under one fence (fast path: reported only)' : '**fence mismatches / external calls repeated within a lease**',
      `${s.fenceMismatches} / ${s.externalCallsRepeatedWithinLease}`,
    ],
    ...stepRows(s),
    ...jobFaultRows(s),
    ...keyFeatureRows(s),
    ['drained', s.drained ? 'yes' : 'NO'],
  ];
  const width = Math.max(...rows.map(([name]) => name.length));
  return ['| metric | value |', '| --- | --- |', ...rows.map(([name, value]) => `| ${name.padEnd(width)} | ${value} |`)].join('\n');
}

/** The step checks' rows of the table (none without steps). */
function stepRows(s: ChaosSummary): Array<[string, string]> {
  const c = s.stepChecks;
  if (!c) return [];
  return [
    ['external step called more than once (keys, extra calls; late calls of zombies)', `${c.repeatedSteps}, ${c.extraCalls}; ${c.lateZombieCalls}`],
    ['**database steps not exactly once**', String(c.databaseNotOnce)],
    ['**external step called after its record / calls not counted by its record**', `${c.calledAfterRecord} / ${c.uncountedCalls}`],
    ['**steps run before the step before them was recorded**', String(c.outOfOrder)],
  ];
}

/** A key-feature profile's rows of the table: its numbers, then its rules (required: 0). */
function keyFeatureRows(s: ChaosSummary): Array<[string, string]> {
  const f = s.keyFeature;
  if (!f) return [];
  return [
    ...f.numbers.map(([label, value]): [string, string] => [`${f.feature}: ${label}`, value]),
    ...f.rules.map((r): [string, string] => [`**${f.feature}: ${r.rule}**`, String(r.failing)]),
  ];
}

/** The job-fault checks' rows of the table (none without job faults). */
function jobFaultRows(s: ChaosSummary): Array<[string, string]> {
  const c = s.jobFaultChecks;
  if (!c) return [];
  const byFault = Object.entries(c.keysByFault)
    .filter(([fault]) => fault !== 'none')
    .map(([fault, n]) => `${fault} ${n}`)
    .join(', ');
  return [
    ['acknowledged keys with a job fault', `${Object.values(c.keysByFault).reduce((a, b) => a + b, 0) - (c.keysByFault.none ?? 0)} (${byFault})`],
    ['effects committed in shared transactions (transactions)', `${c.groupedEffects} (${c.sharedTransactions})`],
    [
      'errors the faults made Postgres log',
      Object.entries(c.serverErrors)
        .map(([cause, n]) => `${cause} ${n}`)
        .join(', '),
    ],
    ['**innocent failures** (keys without a failing fault: lost, failed, or with a failed job)', String(c.innocentFailures)],
    ['**failing faults not failed** (completed, an effect committed, or not ended failed)', String(c.poisonNotFailed)],
    ['**settings seen across jobs** (another\'s tenant, synchronous_commit not on)', String(c.settingsSeenAcross)],
    ['**state faults committed in a shared transaction / not seen by their own job**', `${c.stateFaultsGrouped} / ${c.faultsNotSeen}`],
    ['**jobs with a failing fault failed for another reason** (a fault of the system\'s used up the attempt)', String(c.poisonFailedOtherwise)],
  ];
}

/**
 * Writes the whole history, one JSON object a line ordered by time, to
 * `<dir>/history-<seed>.jsonl`: faults as carried out, worker starts and exits, every worker log
 * line the checker read, and each key's first acknowledgement. Returns its path.
 */
export function writeHistory(run: ChaosRun, dir: string): string {
  mkdirSync(dir, { recursive: true });
  const path = join(dir, `history-${run.options.seed}.jsonl`);
  const entries: Array<{ at: number; text: string }> = [];
  const add = (at: number, entry: object) => entries.push({ at, text: JSON.stringify(entry) });
  for (const event of run.events) add(event.at, { type: 'fault', ...event });
  for (const start of run.history.starts) add(start.at, { type: 'worker-start', ...start });
  for (const exit of run.history.exits) add(exit.at, { type: 'worker-exit', ...exit });
  for (const line of run.history.lines) add(line.time, { type: 'worker', ...line });
  for (const key of run.load.keys.values()) {
    const firstAckAt = key.ackedAt[0];
    if (firstAckAt !== undefined) add(firstAckAt, { type: 'acknowledged', at: firstAckAt, scope: key.scope, key: key.key, adds: key.acks });
  }
  entries.sort((a, b) => a.at - b.at);
  // In chunks: a long run's history is larger than the longest string V8 can build.
  const fd = openSync(path, 'w');
  try {
    for (let i = 0; i < entries.length; i += 10_000) {
      writeSync(fd, `${entries.slice(i, i + 10_000).map((e) => e.text).join('\n')}\n`);
    }
  } finally {
    closeSync(fd);
  }
  return path;
}

/** Writes `<dir>/report-<seed>.json`; returns its path. */
export function writeJsonReport(run: ChaosRun, summary: ChaosSummary, dir: string): string {
  mkdirSync(dir, { recursive: true });
  const path = join(dir, `report-${summary.seed}.json`);
  const cap = (ids: readonly string[]) => ids.slice(0, 100);
  const { log: _log, ...options } = run.options;
  const json = {
    summary,
    options,
    names: run.names,
    queueCountsAfterDrain: run.queueCounts,
    postgresCrashRecoveries: run.postgresRecoveries,
    outcomes: run.check.outcomes,
    violations: {
      lost: cap(run.check.lost),
      unfinished: cap(run.check.unfinished),
      duplicated: cap(run.check.duplicated),
      unexpected: cap(run.check.unexpected),
      committedOverlaps: cap(run.check.committedOverlaps),
      fenceMismatches: cap(run.check.fenceMismatches),
      externalCallsRepeatedWithinLease: cap(run.check.repeatedWithinLease),
      failedKeys: cap(run.check.failedKeys),
      failedJobs: run.check.failedJobs.slice(0, 100),
      keysLeftProcessing: cap(run.check.leftProcessing),
      ...(run.check.steps
        ? {
            databaseStepsNotOnce: cap(run.check.steps.databaseNotOnce),
            externalStepsCalledAfterRecord: cap(run.check.steps.calledAfterRecord),
            externalStepCallsNotCounted: cap(run.check.steps.uncountedCalls),
            stepsOutOfOrder: cap(run.check.steps.outOfOrder),
          }
        : {}),
      ...(run.check.jobFaults
        ? {
            innocentFailures: cap(run.check.jobFaults.innocentFailures),
            poisonNotFailed: cap(run.check.jobFaults.poisonNotFailed),
            settingsSeenAcross: cap(run.check.jobFaults.settingsSeenAcross),
            stateFaultsGrouped: cap(run.check.jobFaults.stateFaultsGrouped),
            faultsNotSeen: cap(run.check.jobFaults.faultsNotSeen),
            poisonFailedOtherwise: cap(run.check.jobFaults.poisonFailedOtherwise),
          }
        : {}),
    },
    ...(run.keyFeature ? { keyFeatureViolations: Object.fromEntries(run.keyFeature.rules.map((r) => [r.rule, r.failing.slice(0, 100)])) } : {}),
    faults: run.events,
    unexpectedWorkerExits: run.unexpectedExits,
    evidence: run.evidence,
  };
  writeFileSync(path, `${JSON.stringify(json, null, 2)}\n`);
  return path;
}
