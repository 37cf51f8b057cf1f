import type { MaintenanceTask } from '../store/maintenance-lock.js';
import type { JanitorReport } from '../ops/janitor.js';
import type { EventEmitter } from 'node:events';
import type { MaintenanceEvents } from '../ops/maintenance.js';
import type { SweepRecovery, SweepReport } from '../ops/sweeper.js';
import { counter, gauge } from '../metric-registry.js';
import type { KeyStats } from '../store/records.js';

function maintenanceMetrics() {
  return {
    janitorDeleted: counter('janitor_deleted_total', 'Rows deleted by the janitor: table="keys" (expired completed/failed keys), "tombstones" (tombstones whose window ended), "outbox" (old sent rows) or "key_concurrency_limits" (the concurrency key a key ran under, once it no longer runs).', ['schema', 'table']),
    janitorRuns: counter('janitor_runs_total', 'Janitor runs performed by this process (it held the janitor lock).', ['schema']),
    sweeperRecoveries: counter(
      'sweeper_recoveries_total',
      'Lost jobs (key processing long after its lease, BullMQ job gone or finished) recovered by the sweeper: action="reenqueued" or "abandoned".',
      ['schema', 'queue', 'action'],
    ),
    sweeperUnverifiable: gauge(
      'sweeper_unverifiable_keys',
      'Processing keys with an ended lease and no BullMQ job recorded, seen by the last sweep of this process (left alone; inspect them).',
      ['schema'],
    ),
    sweeperRuns: counter('sweeper_runs_total', 'Sweeps performed by this process (it held the sweeper lock).', ['schema']),
    maintenanceErrors: counter('maintenance_errors_total', 'Failed janitor, sweeper or stats runs (retried at the next interval).', ['schema', 'task']),
    keys: gauge('keys', 'Keys by status (exported only by the process that refreshed the statistics last).', ['schema', 'status']),
    expiredLeases: gauge('expired_leases', 'Processing keys whose lease has ended (waiting for a takeover, a retry or the sweeper).', ['schema']),
    pastSweepHorizon: gauge(
      'keys_past_sweep_horizon',
      'Processing keys whose lease ended more than the sweep horizon (SWEEP_AFTER_MS) ago: no retry or takeover picked them up, and the sweeper has not recovered them.',
      ['schema'],
    ),
    expiredKeys: gauge('expired_keys', 'Completed or failed keys past expires_at (and released HTTP request keys past theirs), waiting for the janitor.', ['schema']),
    tombstones: gauge('key_tombstones', 'Live tombstones: keys deleted after their retention whose duplicates are still refused (TOMBSTONE_MS).', ['schema']),
    oldestProcessingAge: gauge('oldest_processing_key_age_seconds', 'Age of the oldest processing key (0 when none).', ['schema']),
    outboxUnsent: gauge('outbox_unsent_rows', 'Outbox rows not yet relayed to BullMQ.', ['schema']),
    outboxOldestUnsentAge: gauge('outbox_oldest_unsent_age_seconds', 'Age of the oldest unsent outbox row (0 when none).', ['schema']),
  };
}

/** Options of {@link instrumentMaintenance}. */
export interface InstrumentMaintenanceOptions {
  /**
   * Queues the sweeper covers: their recovery counters start at zero, so that the first
   * recovery is an increase an alert sees (a counter born at 1 shows no `increase()`).
   * @defaultValue `[]` (series appear with the first recovery)
   */
  readonly sweeperQueues?: readonly string[];
}

const MAINTENANCE_TASKS: readonly MaintenanceTask[] = ['janitor', 'sweeper', 'stats'];
const RECOVERY_ACTIONS: readonly SweepRecovery['action'][] = ['reenqueued', 'abandoned'];

/**
 * Turns a `Maintenance`'s reports into Prometheus metrics (prefix `idempotent_jobs_`,
 * label `schema`). The key gauges come from the statistics refresh, which one process at a time
 * performs; the others clear their gauges, so a query should aggregate with `max by (status)`.
 * Returns a function that stops listening.
 */
export function instrumentMaintenance(
  maintenance: Pick<EventEmitter<MaintenanceEvents>, 'on' | 'off'>,
  schema: string,
  options: InstrumentMaintenanceOptions = {},
): () => void {
  const m = maintenanceMetrics();
  const statGauges = [m.keys, m.expiredLeases, m.pastSweepHorizon, m.expiredKeys, m.tombstones, m.oldestProcessingAge, m.outboxUnsent, m.outboxOldestUnsentAge];
  const onJanitor = (report: JanitorReport) => {
    m.janitorRuns.inc({ schema });
    m.janitorDeleted.inc({ schema, table: 'keys' }, report.keysDeleted);
    m.janitorDeleted.inc({ schema, table: 'outbox' }, report.outboxRowsDeleted);
    m.janitorDeleted.inc({ schema, table: 'tombstones' }, report.tombstonesDeleted);
    m.janitorDeleted.inc({ schema, table: 'key_concurrency_limits' }, report.concurrencyRecordsDeleted);
    m.janitorDeleted.inc({ schema, table: 'concurrency_slots' }, report.concurrencySlotsDeleted);
    m.janitorDeleted.inc({ schema, table: 'coalescing_keys' }, report.coalescingKeysDeleted);
    m.janitorDeleted.inc({ schema, table: 'coalescing_arrivals' }, report.coalescingArrivalsDeleted);
  };
  const onSweeper = (report: SweepReport) => {
    m.sweeperRuns.inc({ schema });
    m.sweeperUnverifiable.set({ schema }, report.unverifiable);
    for (const recovery of report.recoveries) m.sweeperRecoveries.inc({ schema, queue: recovery.queue, action: recovery.action });
  };
  const onStats = (stats: KeyStats | null) => {
    if (!stats) {
      for (const g of statGauges) g.remove({ schema });
      for (const status of ['processing', 'completed', 'failed']) m.keys.remove({ schema, status });
      return;
    }
    m.keys.set({ schema, status: 'processing' }, stats.processing);
    m.keys.set({ schema, status: 'completed' }, stats.completed);
    m.keys.set({ schema, status: 'failed' }, stats.failed);
    m.expiredLeases.set({ schema }, stats.expiredLeases);
    m.pastSweepHorizon.set({ schema }, stats.pastSweepHorizon);
    m.expiredKeys.set({ schema }, stats.expiredKeys);
    m.tombstones.set({ schema }, stats.tombstones);
    m.oldestProcessingAge.set({ schema }, (stats.oldestProcessing?.ageMs ?? 0) / 1000);
    m.outboxUnsent.set({ schema }, stats.outboxUnsent);
    m.outboxOldestUnsentAge.set({ schema }, (stats.oldestUnsentAgeMs ?? 0) / 1000);
  };
  const onError = (task: MaintenanceTask) => m.maintenanceErrors.inc({ schema, task });
  // Zero-initialised so the series exist before the first run.
  m.janitorDeleted.inc({ schema, table: 'keys' }, 0);
  m.janitorDeleted.inc({ schema, table: 'outbox' }, 0);
  m.janitorDeleted.inc({ schema, table: 'tombstones' }, 0);
  m.janitorDeleted.inc({ schema, table: 'key_concurrency_limits' }, 0);
  m.janitorDeleted.inc({ schema, table: 'coalescing_keys' }, 0);
  m.janitorDeleted.inc({ schema, table: 'coalescing_arrivals' }, 0);
  m.janitorRuns.inc({ schema }, 0);
  m.sweeperRuns.inc({ schema }, 0);
  for (const task of MAINTENANCE_TASKS) m.maintenanceErrors.inc({ schema, task }, 0);
  for (const queue of options.sweeperQueues ?? []) {
    for (const action of RECOVERY_ACTIONS) m.sweeperRecoveries.inc({ schema, queue, action }, 0);
  }
  maintenance.on('janitor', onJanitor);
  maintenance.on('sweeper', onSweeper);
  maintenance.on('stats', onStats);
  maintenance.on('error', onError);
  return () => {
    maintenance.off('janitor', onJanitor);
    maintenance.off('sweeper', onSweeper);
    maintenance.off('stats', onStats);
    maintenance.off('error', onError);
  };
}
