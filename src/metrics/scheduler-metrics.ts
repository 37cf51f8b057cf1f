import type { EventEmitter } from 'node:events';
import type { SchedulerEvents, SchedulerReport } from '../ops/scheduler.js';
import { counter, gauge } from '../metric-registry.js';

/**
 * Distinct schedules per instrumented scheduler that get a `schedule` label of their own; later
 * ones are counted under `schedule="other"`. Schedules are few and named by operators, but a
 * program that makes one per customer would otherwise grow a series per customer.
 */
export const MAX_SCHEDULE_LABELS = 100;

/** The `schedule` label of the schedules past {@link MAX_SCHEDULE_LABELS}. */
export const OTHER_SCHEDULE = 'other';

function schedulerMetrics() {
  return {
    ticksEnqueued: counter(
      'schedule_ticks_enqueued_total',
      `Ticks a scheduler of this process handed to the queue, by schedule (a tick another scheduler had enqueued too is counted by both; its key runs it once). At most ${MAX_SCHEDULE_LABELS} schedules; later ones as schedule="${OTHER_SCHEDULE}".`,
      ['schema', 'schedule'],
    ),
    ticksSkipped: counter(
      'schedule_ticks_skipped_total',
      'Missed ticks (no scheduler ran at their time) that the schedule\'s missed-ticks policy left out: all but the latest with missed="latest", those past maxMissed with missed="all".',
      ['schema', 'schedule'],
    ),
    tickLag: gauge(
      'schedule_tick_lag_seconds',
      'How late the latest tick of the schedule was enqueued: the database\'s now at its enqueue minus the tick\'s time.',
      ['schema', 'schedule'],
    ),
    rounds: counter('scheduler_rounds_total', 'Scheduler rounds of this process that read the schedules.', ['schema']),
    failures: counter('schedule_round_failures_total', 'Schedules whose round failed to enqueue (retried next round, same keys).', ['schema', 'schedule']),
  };
}

/**
 * Turns a `Scheduler`'s rounds into Prometheus metrics (prefix `idempotent_jobs_`, labels
 * `schema` and `schedule`, at most {@link MAX_SCHEDULE_LABELS} schedule names). Returns a
 * function that stops listening.
 */
export function instrumentScheduler(scheduler: Pick<EventEmitter<SchedulerEvents>, 'on' | 'off'>, schema: string): () => void {
  const m = schedulerMetrics();
  const named = new Set<string>();
  const label = (schedule: string): string => {
    if (named.has(schedule)) return schedule;
    if (named.size >= MAX_SCHEDULE_LABELS) return OTHER_SCHEDULE;
    named.add(schedule);
    return schedule;
  };
  const onRound = (report: SchedulerReport) => {
    m.rounds.inc({ schema });
    for (const round of report.schedules) {
      const labels = { schema, schedule: label(round.schedule) };
      m.ticksEnqueued.inc(labels, round.enqueued);
      m.ticksSkipped.inc(labels, round.skipped);
      if (round.failed) m.failures.inc(labels);
      if (round.lagMs !== null) m.tickLag.set(labels, round.lagMs / 1000);
    }
  };
  m.rounds.inc({ schema }, 0);
  scheduler.on('round', onRound);
  return () => scheduler.off('round', onRound);
}
