import type { Kysely } from 'kysely';
import type { Logger } from 'pino';
import {
  resolveJanitorOptions,
  retryHorizonMs,
  type JanitorOptions,
  type ResolvedJanitorOptions,
} from './maintenance-options.js';
import { PostgresOperatorStore, type OperatorStore } from '../store/operator-store.js';
import { defaultLogger } from '../default-logger.js';

/** What one janitor run did. */
export interface JanitorReport {
  /** Completed and failed keys deleted because their retention ran out, and released keys whose expiry passed (HTTP request keys nobody retried). */
  readonly keysDeleted: number;
  /** Tombstones deleted because their window ran out (see {@link JanitorOptions.tombstoneMs}). */
  readonly tombstonesDeleted: number;
  /** Sent outbox rows deleted because they were older than the retention. */
  readonly outboxRowsDeleted: number;
  /** Records of the concurrency key a key ran under, deleted once older than the retention with their key no longer processing. */
  readonly concurrencyRecordsDeleted: number;
  /** Slot rows of concurrency keys that held nothing (a run that ended without freeing its slot: its worker died), deleted once their time was up for longer than the retention. */
  readonly concurrencySlotsDeleted: number;
  /**
   * Coalescing keys' rows deleted: idle for longer than the retention, with no run in flight and
   * no successor pending (see {@link Janitor.runOnce}).
   */
  readonly coalescingKeysDeleted: number;
  /** Remembered send times of coalescing jobs (those without a trustworthy one) deleted, once older than the retention. */
  readonly coalescingArrivalsDeleted: number;
  /** True when a table's deletion stopped at `maxBatchesPerRun` full batches: expired rows may remain for the next run. */
  readonly more: boolean;
}

/** One queue whose retries can outlive the keys that deduplicate them. */
export interface RetentionWarning {
  /** The queue whose retry policy is at fault. */
  readonly queue: string;
  /** How long its jobs can keep being retried ({@link retryHorizonMs} of its policy). */
  readonly retryHorizonMs: number;
  /** The retention it exceeds. */
  readonly retentionMs: number;
  /** The warning as logged: what can go wrong and what to change. */
  readonly message: string;
}

/**
 * Deletes completed and failed keys past their `expires_at` (and released keys past theirs:
 * HTTP request keys nobody retried, see `store/sql/delete-expired-keys.ts`), sent outbox rows
 * older than the retention, and coalescing keys' rows idle for longer than the retention (and their
 * remembered send times older than it), in small batches (`FOR UPDATE SKIP LOCKED`): any number of janitors may run
 * at once, each row is deleted by exactly one of them, and live keys are never touched.
 * Usually run by `Maintenance` (one active at a time via an advisory lock), but safe without.
 * A hash-partitioned keys table is cleaned partition by partition (see `store/sql/delete-expired-keys.ts`).
 * With `tombstoneMs`, each deleted key leaves a tombstone in the same statement, and tombstones
 * whose window ran out are deleted in batches too (see `store/sql/tombstones.ts`). A key whose
 * job asked for a tombstone window of its own (`retention.tombstoneMs`) leaves a tombstone for
 * that window, with or without `tombstoneMs` (0: none for that key).
 *
 * @example
 * ```ts
 * import { Janitor } from 'idempotent-jobs/process';
 *
 * const janitor = new Janitor({ db, schema: 'idempotent_jobs', retryPolicies: { payments: { attempts: 5, backoff: { type: 'exponential', delayMs: 1_000 } } } });
 * janitor.checkRetention(); // warns when a queue's retries outlive its keys
 * const { keysDeleted, more } = await janitor.runOnce();
 * console.log(`${keysDeleted} expired keys deleted${more ? '; more remain for the next run' : ''}`);
 * ```
 */
export class Janitor {
  readonly #options: ResolvedJanitorOptions;
  readonly #log: Logger;
  /** Where the next run starts among the keys table's partitions, so that a run cut short by `maxBatchesPerRun` does not always spend its batches on the same ones. */
  #firstPartition = 0;

  constructor(options: JanitorOptions) {
    this.#options = resolveJanitorOptions(options);
    this.#log = (options.logger ?? defaultLogger()).child({ component: 'janitor', schema: this.#options.schema });
    const { tombstoneMs, retentionMs } = this.#options;
    if (tombstoneMs > 0 && tombstoneMs <= retentionMs) {
      // Counted from when a key finished, a window no longer than the retention has ended by the time the key is deleted.
      this.#log.warn(
        { tombstoneMs, retentionMs },
        `tombstoneMs (${tombstoneMs} ms) is not longer than the retention (${retentionMs} ms): no key will leave a tombstone but those whose job asked for a longer window. ` +
          'Set TOMBSTONE_MS longer than RETENTION_MS for duplicates to be refused past retention, or 0.',
      );
    }
  }

  /**
   * A janitor without a tombstone window deletes keys without tombstones, even where another
   * process's janitor leaves them: workers run a janitor of their own by default, so
   * `TOMBSTONE_MS` set on the maintenance process alone lets duplicates of keys these janitors
   * deleted run again. Live tombstones in the schema say the window is wanted; this says so at
   * each run that deleted keys, rather than silently.
   */
  async #warnOfTombstonesElsewhere(store: PostgresOperatorStore, keysDeleted: number): Promise<void> {
    if (!(await store.hasLiveTombstones())) return;
    this.#log.warn(
      { keysDeleted },
      `deleted ${keysDeleted} keys without tombstones while the schema holds live tombstones (another janitor has TOMBSTONE_MS): ` +
        'duplicates of these keys will run again. Set the same TOMBSTONE_MS on every process that runs a janitor ' +
        '(workers do by default), or JANITOR_ENABLED=false on those that should not.',
    );
  }

  /** The resolved options. */
  get options(): ResolvedJanitorOptions {
    return this.#options;
  }

  /**
   * Queues whose retry horizon (from their retry policy: the sum of backoff delays) is longer
   * than the retention. A duplicate of such a job arriving after its key was deleted would run
   * again. Logged as warnings; also returned.
   */
  checkRetention(): RetentionWarning[] {
    const { retentionMs, retryPolicies } = this.#options;
    const warnings: RetentionWarning[] = [];
    for (const [queue, policy] of Object.entries(retryPolicies)) {
      const horizon = retryHorizonMs(policy);
      if (horizon <= retentionMs) continue;
      const message =
        `Queue "${queue}": jobs may be retried for up to ${horizon} ms (attempts ${policy.attempts ?? 1}, ` +
        `${policy.backoff?.type ?? 'no'} backoff ${policy.backoff?.delayMs ?? 0} ms), longer than the key retention of ` +
        `${retentionMs} ms. A retry or duplicate arriving after its key was deleted runs again. ` +
        'Raise RETENTION_MS above the retry horizon or shorten the backoff.';
      warnings.push({ queue, retryHorizonMs: horizon, retentionMs, message });
      this.#log.warn({ queue, retryHorizonMs: horizon, retentionMs }, message);
    }
    return warnings;
  }

  /**
   * Deletes expired rows, batch by batch, until a batch comes back short or `maxBatchesPerRun`
   * batches were deleted per table (the keys table's partitions share its budget; each
   * partition is done when one of its batches comes back short). `executor` defaults to the
   * options' db (pass the maintenance lock's connection to run on it).
   */
  async runOnce(executor: Kysely<any> = this.#options.db): Promise<JanitorReport> {
    const { schema, batchSize, maxBatchesPerRun, retentionMs, tombstoneMs } = this.#options;
    const store = new PostgresOperatorStore(executor, schema);
    let keysDeleted = 0;
    let finishedKeysDeleted = 0;
    let more = false;
    let batches = 0;
    const tables = await this.#keysTables(store);
    for (let i = 0; i < tables.length && !more; i++) {
      const table = tables[(this.#firstPartition + i) % tables.length]!;
      for (;;) {
        if (batches === maxBatchesPerRun) {
          more = true;
          this.#firstPartition = (this.#firstPartition + i) % tables.length;
          break;
        }
        batches++;
        const deletedKeys = await store.deleteExpiredKeys(batchSize, table, tombstoneMs);
        keysDeleted += deletedKeys.length;
        finishedKeysDeleted += deletedKeys.filter((key) => key.finished).length;
        if (deletedKeys.length < batchSize) break;
      }
    }
    // Released keys never leave a tombstone, whatever the window: only finished ones count here.
    if (finishedKeysDeleted > 0 && tombstoneMs === 0) await this.#warnOfTombstonesElsewhere(store, finishedKeysDeleted);
    // Deleted whatever tombstoneMs is now: a window shortened (or turned off) ends the old tombstones on time.
    let tombstonesDeleted = 0;
    for (let batch = 0; ; batch++) {
      if (batch === maxBatchesPerRun) {
        more = true;
        break;
      }
      const deleted = await store.deleteExpiredTombstones(batchSize);
      tombstonesDeleted += deleted;
      if (deleted < batchSize) break;
    }
    let outboxRowsDeleted = 0;
    for (let batch = 0; ; batch++) {
      if (batch === maxBatchesPerRun) {
        more = true;
        break;
      }
      const deleted = await store.deleteSentOutboxRows(retentionMs, batchSize);
      outboxRowsDeleted += deleted;
      if (deleted < batchSize) break;
    }
    // What concurrency key a key ran under is needed while the key may be swept (processing), not after.
    let concurrencyRecordsDeleted = 0;
    for (let batch = 0; ; batch++) {
      if (batch === maxBatchesPerRun) {
        more = true;
        break;
      }
      const deleted = await store.deleteStaleConcurrencyLimits(retentionMs, batchSize);
      concurrencyRecordsDeleted += deleted;
      if (deleted < batchSize) break;
    }
    const coalescing = await this.#deleteCoalescingRows(store);
    more ||= coalescing.more;
    const { coalescingKeysDeleted, coalescingArrivalsDeleted, concurrencySlotsDeleted } = coalescing;
    const deletedAny = keysDeleted > 0 || tombstonesDeleted > 0 || outboxRowsDeleted > 0 || concurrencyRecordsDeleted > 0 || concurrencySlotsDeleted > 0;
    const counts = { keysDeleted, tombstonesDeleted, outboxRowsDeleted, concurrencyRecordsDeleted, concurrencySlotsDeleted, coalescingKeysDeleted, coalescingArrivalsDeleted };
    if (deletedAny || coalescingKeysDeleted > 0 || coalescingArrivalsDeleted > 0) this.#log.info({ ...counts, more }, 'janitor deleted expired rows');
    return { ...counts, more };
  }

  /**
   * Coalescing keys' rows idle for longer than the retention, remembered send times older than
   * it, and concurrency slot rows that hold nothing (see `store/sql/coalescing-janitor.ts`). The retention is the bound because what is
   * deleted orders a key's payloads: when the newest payload was sent, and when a job without a
   * trustworthy send time first arrived. A delivery held back past the bound and sent before the
   * newest payload could run as the newest. The retention is what {@link Janitor.checkRetention}
   * holds above every queue's retries.
   */
  async #deleteCoalescingRows(
    store: OperatorStore,
  ): Promise<{ coalescingKeysDeleted: number; coalescingArrivalsDeleted: number; concurrencySlotsDeleted: number; more: boolean }> {
    const { batchSize, maxBatchesPerRun, retentionMs } = this.#options;
    const inBatches = async (deleteBatch: () => Promise<number>): Promise<{ deleted: number; more: boolean }> => {
      let deleted = 0;
      for (let batch = 0; batch < maxBatchesPerRun; batch++) {
        const count = await deleteBatch();
        deleted += count;
        if (count < batchSize) return { deleted, more: false };
      }
      return { deleted, more: true };
    };
    const rows = await inBatches(() => store.deleteIdleCoalescingKeys(retentionMs, batchSize));
    const arrivals = await inBatches(() => store.deleteOldCoalescingArrivals(retentionMs, batchSize));
    // Slot rows that hold nothing: any such row could go, the retention only keeps the janitor
    // clear of a run renewing its slot right as its time runs out (see sql/concurrency-slot-wakes.ts).
    const slots = await inBatches(() => store.deleteStaleConcurrencySlots(retentionMs, batchSize));
    const more = rows.more || arrivals.more || slots.more;
    return { coalescingKeysDeleted: rows.deleted, coalescingArrivalsDeleted: arrivals.deleted, concurrencySlotsDeleted: slots.deleted, more };
  }

  /** The keys table's partitions, or the table itself when it has none (read each run: cheap, and a conversion needs no restart). */
  async #keysTables(store: OperatorStore): Promise<readonly string[]> {
    const { partitions } = await store.tableLayout();
    return partitions.length > 0 ? partitions : ['idempotency_keys'];
  }
}
