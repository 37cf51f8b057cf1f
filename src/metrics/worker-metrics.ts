import type { EventEmitter } from 'node:events';
import type { WorkerEvent, WorkerEventKind } from '../bullmq/idempotent-worker.js';
import { counter, histogram } from '../metric-registry.js';

// Outcomes of taking a job's key (and losing it), as the issue lists them.
const CLAIM_OUTCOMES: ReadonlySet<WorkerEventKind> = new Set([
  'claimed',
  'taken-over',
  'replayed',
  'replayed-failure',
  'result-expired',
  'deferred',
  'concurrency-limited',
  'coalesced',
  'key-reused',
  'invalid',
  'lease-lost',
  'store-unavailable',
]);
// How a held key ended: committed, released for a retry, failed for good.
const JOB_RESULTS: ReadonlySet<WorkerEventKind> = new Set(['completed', 'released', 'failed']);
// How a call of ctx.step ended, by the `outcome` label of step_outcomes_total.
const STEP_OUTCOMES: ReadonlyMap<WorkerEventKind, string> = new Map([
  ['step-ran', 'ran'],
  ['step-replayed', 'replayed'],
  ['step-lease-lost', 'lease-lost'],
  ['step-failed', 'failed'],
]);

/**
 * Distinct step names per instrumented worker that get a `step` label of their own; later
 * names are counted under `step="other"`. Step names are fixed strings in the handler's code
 * (a few per job type), so a worker normally sees far fewer; the cap only guards against a
 * handler that builds names from data (`charge-${orderId}`), which would otherwise grow one
 * series per name without bound.
 */
export const MAX_STEP_NAMES = 100;
/** The `step` label of names past {@link MAX_STEP_NAMES}. */
export const OTHER_STEP = 'other';

/**
 * Distinct concurrency groups per instrumented worker that get a `group` label of their own;
 * later ones are counted under `group="other"`. A group is the concurrency key's part before
 * its first `:` (`tenant` of `tenant:acme`), so that one series stands for every tenant; a key
 * without `:` is its own group, and the cap keeps keys made from data from growing the series.
 */
export const MAX_CONCURRENCY_GROUPS = 100;

/** The `group` label of a concurrency key: its part before the first `:`, or the whole key. */
export function concurrencyGroupOf(concurrencyKey: string): string {
  const colon = concurrencyKey.indexOf(':');
  return colon > 0 ? concurrencyKey.slice(0, colon) : concurrencyKey;
}

/** Seconds: from a local database write to a handler at the edge of a typical lease. */
const DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

/** The worker metrics (created on first use in the default registry). */
function workerMetrics() {
  return {
    claimOutcomes: counter(
      'claim_outcomes_total',
      'Jobs by what happened when their key was claimed: claimed, taken-over, replayed, replayed-failure, result-expired (a duplicate of a key whose tombstone is all that is left: not run again), coalesced (a coalescing job folded into the run in flight), concurrency-limited, deferred, key-reused, invalid; lease-lost (a held key taken over by another worker); store-unavailable (a transient Postgres fault deferred the job, no attempt used).',
      ['queue', 'outcome'],
    ),
    jobResults: counter(
      'job_results_total',
      'Held keys by how they ended: completed (effect committed), released (retryable error, key freed for the retry), failed (error stored for good).',
      ['queue', 'result'],
    ),
    fencedCommits: counter(
      'fenced_commits_total',
      'Completions refused because another worker had taken the key over (the stale transaction rolled back).',
      ['queue'],
    ),
    leaseExtensions: counter('lease_extensions_total', 'Successful lease heartbeats.', ['queue']),
    concurrencyLimited: counter(
      'concurrency_limited_total',
      `Jobs deferred (no attempt used) because their concurrency key was at its limit, by group: the concurrency key's part before its first ":" (tenant of tenant:acme). At most ${MAX_CONCURRENCY_GROUPS} groups per worker; later ones are counted as group="${OTHER_STEP}".`,
      ['queue', 'group'],
    ),
    retentionClamped: counter(
      'retention_clamped_total',
      "Jobs that asked for a retention above the workers' bound and got the bound, by part: resultMs (maxJobRetentionMs) or tombstoneMs (maxJobTombstoneMs). The job still runs.",
      ['queue', 'part'],
    ),
    stepOutcomes: counter(
      'step_outcomes_total',
      `Calls of ctx.step by step name and how they ended: ran (ran and recorded under this worker's claim), replayed (returned the result an earlier run recorded, without running), lease-lost (the record was refused: another worker had taken the key over), failed (the step threw, or the determinism guard refused it). At most ${MAX_STEP_NAMES} step names per worker; later ones are counted as step="${OTHER_STEP}".`,
      ['queue', 'step', 'outcome'],
    ),
    handlerDuration: histogram(
      'handler_duration_seconds',
      'Time from claim to committed completion of a job whose key this worker held.',
      ['queue'],
      DURATION_BUCKETS,
    ),
    stepDuration: histogram(
      'step_duration_seconds',
      `Time a call of ctx.step took, by step name and outcome (as step_outcomes_total counts them): a replay's time is reading the records. At most ${MAX_STEP_NAMES} step names per worker, as for step_outcomes_total.`,
      ['queue', 'step', 'outcome'],
      DURATION_BUCKETS,
    ),
  };
}

/**
 * Counts an `IdempotentWorker`'s outcomes in Prometheus metrics (prefix `idempotent_jobs_`, label `queue`),
 * by listening to its `'event'`s. Returns a function that stops listening.
 *
 * @example
 * ```ts
 * import { IdempotencyKeys, createIdempotentWorker } from 'idempotent-jobs';
 * import { instrumentWorker, startMetricsServer } from 'idempotent-jobs/process';
 *
 * const worker = createIdempotentWorker({
 *   queue: 'payments',
 *   connection: { host: '127.0.0.1', port: 6379 },
 *   keys: new IdempotencyKeys({ db }),
 *   handler: (ctx) => ctx.transaction((tx) => tx.insertInto('ledger').values({ order_id: ctx.key }).execute()),
 * });
 * const stop = instrumentWorker(worker, 'payments');
 * const metrics = await startMetricsServer({ port: 9464 }); // GET /metrics
 * // … on shutdown
 * stop();
 * await metrics.close();
 * ```
 */
export function instrumentWorker(worker: Pick<EventEmitter<{ event: [WorkerEvent] }>, 'on' | 'off'>, queue: string): () => void {
  const metrics = workerMetrics();
  // Initialised at zero so dashboards and alerts see every series from the start.
  for (const outcome of CLAIM_OUTCOMES) metrics.claimOutcomes.inc({ queue, outcome }, 0);
  for (const result of JOB_RESULTS) metrics.jobResults.inc({ queue, result }, 0);
  metrics.fencedCommits.inc({ queue }, 0);
  metrics.leaseExtensions.inc({ queue }, 0);
  // Step series appear with a step's first call (the names are not known before).
  const stepNames = new Set<string>();
  const stepLabel = (name: string) => {
    if (stepNames.has(name)) return name;
    if (stepNames.size >= MAX_STEP_NAMES) return OTHER_STEP;
    stepNames.add(name);
    return name;
  };
  const groups = new Set<string>();
  const groupLabel = (concurrencyKey: string) => {
    const group = concurrencyGroupOf(concurrencyKey);
    if (groups.has(group)) return group;
    if (groups.size >= MAX_CONCURRENCY_GROUPS) return OTHER_STEP;
    groups.add(group);
    return group;
  };
  const onEvent = (event: WorkerEvent) => {
    if (event.kind === 'concurrency-limited') metrics.concurrencyLimited.inc({ queue, group: groupLabel(event.concurrencyKey ?? OTHER_STEP) });
    const stepOutcome = STEP_OUTCOMES.get(event.kind);
    if (stepOutcome !== undefined) {
      const labels = { queue, step: stepLabel(event.step ?? OTHER_STEP), outcome: stepOutcome };
      metrics.stepOutcomes.inc(labels);
      if (event.durationMs !== undefined) metrics.stepDuration.observe(labels, event.durationMs / 1000);
      return;
    }
    if (CLAIM_OUTCOMES.has(event.kind)) metrics.claimOutcomes.inc({ queue, outcome: event.kind });
    if (JOB_RESULTS.has(event.kind)) metrics.jobResults.inc({ queue, result: event.kind });
    if (event.kind === 'fenced') metrics.fencedCommits.inc({ queue });
    if (event.kind === 'lease-extended') metrics.leaseExtensions.inc({ queue });
    if (event.kind === 'retention-clamped') metrics.retentionClamped.inc({ queue, part: event.retentionPart ?? 'resultMs' });
    if (event.kind === 'completed' && event.durationMs !== undefined) {
      metrics.handlerDuration.observe({ queue }, event.durationMs / 1000);
    }
  };
  worker.on('event', onEvent);
  return () => worker.off('event', onEvent);
}
