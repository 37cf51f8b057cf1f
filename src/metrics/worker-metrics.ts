import type { EventEmitter } from 'node:events';
import type { WorkerEvent, WorkerEventKind } from '../bullmq/idempotent-worker.js';
import { counter, histogram } from './metric-registry.js';

// Outcomes of taking a job's key (and losing it), as the issue lists them.
const CLAIM_OUTCOMES: ReadonlySet<WorkerEventKind> = new Set([
  'claimed',
  'taken-over',
  'replayed',
  'replayed-failure',
  'deferred',
  'key-reused',
  'invalid',
  'lease-lost',
  'store-unavailable',
]);
// How a held key ended: committed, released for a retry, failed for good.
const JOB_RESULTS: ReadonlySet<WorkerEventKind> = new Set(['completed', 'released', 'failed']);

/** The worker metrics (created on first use in the default registry). */
function workerMetrics() {
  return {
    claimOutcomes: counter(
      'claim_outcomes_total',
      'Jobs by what happened when their key was claimed: claimed, taken-over, replayed, replayed-failure, deferred, key-reused, invalid; lease-lost (a held key taken over by another worker); store-unavailable (a transient Postgres fault deferred the job, no attempt used).',
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
    handlerDuration: histogram(
      'handler_duration_seconds',
      'Time from claim to committed completion of a job whose key this worker held.',
      ['queue'],
      [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300],
    ),
  };
}

/**
 * Counts an `IdempotentWorker`'s outcomes in Prometheus metrics (prefix `idempotent_jobs_`, label `queue`),
 * by listening to its `'event'`s. Returns a function that stops listening.
 *
 * @example
 * ```ts
 * const stop = instrumentWorker(worker, 'payments');
 * ```
 */
export function instrumentWorker(worker: Pick<EventEmitter<{ event: [WorkerEvent] }>, 'on' | 'off'>, queue: string): () => void {
  const metrics = workerMetrics();
  // Initialised at zero so dashboards and alerts see every series from the start.
  for (const outcome of CLAIM_OUTCOMES) metrics.claimOutcomes.inc({ queue, outcome }, 0);
  for (const result of JOB_RESULTS) metrics.jobResults.inc({ queue, result }, 0);
  metrics.fencedCommits.inc({ queue }, 0);
  metrics.leaseExtensions.inc({ queue }, 0);
  const onEvent = (event: WorkerEvent) => {
    if (CLAIM_OUTCOMES.has(event.kind)) metrics.claimOutcomes.inc({ queue, outcome: event.kind });
    if (JOB_RESULTS.has(event.kind)) metrics.jobResults.inc({ queue, result: event.kind });
    if (event.kind === 'fenced') metrics.fencedCommits.inc({ queue });
    if (event.kind === 'lease-extended') metrics.leaseExtensions.inc({ queue });
    if (event.kind === 'completed' && event.durationMs !== undefined) {
      metrics.handlerDuration.observe({ queue }, event.durationMs / 1000);
    }
  };
  worker.on('event', onEvent);
  return () => worker.off('event', onEvent);
}
