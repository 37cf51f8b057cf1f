import type { Kysely } from 'kysely';
import { pino, type Logger } from 'pino';
import {
  resolveJanitorOptions,
  retryHorizonMs,
  type JanitorOptions,
  type ResolvedJanitorOptions,
} from '../config/maintenance-options.js';
import { deleteExpiredKeys } from '../store/sql/delete-expired-keys.js';
import { deleteSentOutboxRows } from '../store/sql/delete-sent-outbox-rows.js';
import { keysTableLayout } from '../store/sql/keys-table-layout.js';

/** What one janitor run did. */
export interface JanitorReport {
  /** Completed and failed keys deleted because their retention ran out. */
  readonly keysDeleted: number;
  /** Sent outbox rows deleted because they were older than the retention. */
  readonly outboxRowsDeleted: number;
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
 * Deletes completed and failed keys past their `expires_at`, and sent outbox rows older than
 * the retention, in small batches (`FOR UPDATE SKIP LOCKED`): any number of janitors may run
 * at once, each row is deleted by exactly one of them, and live keys are never touched.
 * Usually run by `Maintenance` (one active at a time via an advisory lock), but safe without.
 * A hash-partitioned keys table is cleaned partition by partition (see deleteExpiredKeys).
 *
 * @example
 * ```ts
 * import { Janitor } from 'idempotent-jobs';
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
    this.#log = (options.logger ?? pino()).child({ component: 'janitor', schema: this.#options.schema });
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
    const { schema, batchSize, maxBatchesPerRun, retentionMs } = this.#options;
    let keysDeleted = 0;
    let more = false;
    let batches = 0;
    const tables = await this.#keysTables(executor);
    for (let i = 0; i < tables.length && !more; i++) {
      const table = tables[(this.#firstPartition + i) % tables.length]!;
      for (;;) {
        if (batches === maxBatchesPerRun) {
          more = true;
          this.#firstPartition = (this.#firstPartition + i) % tables.length;
          break;
        }
        batches++;
        const deleted = (await deleteExpiredKeys(executor, schema, batchSize, table)).length;
        keysDeleted += deleted;
        if (deleted < batchSize) break;
      }
    }
    let outboxRowsDeleted = 0;
    for (let batch = 0; ; batch++) {
      if (batch === maxBatchesPerRun) {
        more = true;
        break;
      }
      const deleted = await deleteSentOutboxRows(executor, schema, retentionMs, batchSize);
      outboxRowsDeleted += deleted;
      if (deleted < batchSize) break;
    }
    if (keysDeleted > 0 || outboxRowsDeleted > 0) {
      this.#log.info({ keysDeleted, outboxRowsDeleted, more }, 'janitor deleted expired rows');
    }
    return { keysDeleted, outboxRowsDeleted, more };
  }

  /** The keys table's partitions, or the table itself when it has none (read each run: cheap, and a conversion needs no restart). */
  async #keysTables(executor: Kysely<any>): Promise<readonly string[]> {
    const { partitions } = await keysTableLayout(executor, this.#options.schema);
    return partitions.length > 0 ? partitions : ['idempotency_keys'];
  }
}
