import { EventEmitter } from 'node:events';
import type { Kysely } from 'kysely';
import type { Logger } from 'pino';
import { resolveMaintenanceIntervals } from './maintenance-options.js';
import { withMaintenanceLock, type LockedRun, type MaintenanceTask } from '../store/maintenance-lock.js';
import { PostgresOperatorStore } from '../store/operator-store.js';
import { isTransientStoreError } from '../store/pg-errors.js';
import type { Janitor, JanitorReport } from './janitor.js';
import type { SweepReport, Sweeper } from './sweeper.js';
import type { KeyStats } from '../store/records.js';
import { defaultLogger } from '../default-logger.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** Options of {@link Maintenance}. */
export interface MaintenanceOptions {
  /** The database holding the keys table; its advisory locks let one process at a time run each task. */
  readonly db: Kysely<any>;
  /** Postgres schema of the tables (the locks and statistics are per schema). @defaultValue `'idempotent_jobs'` */
  readonly schema?: string;
  /** Run this janitor periodically. @defaultValue none */
  readonly janitor?: Janitor;
  /** Run this sweeper periodically. @defaultValue none */
  readonly sweeper?: Sweeper;
  /** Period of the janitor's runs. @defaultValue `60_000` */
  readonly janitorIntervalMs?: number;
  /** Period of the sweeper's runs. @defaultValue `60_000` */
  readonly sweeperIntervalMs?: number;
  /**
   * Refresh key statistics (for the `idempotent_jobs_keys` gauges) this often; `0` never.
   * @defaultValue `60_000`
   */
  readonly statsIntervalMs?: number;
  /**
   * The sweep horizon the statistics count keys past (`idempotent_jobs_keys_past_sweep_horizon`).
   * @defaultValue the sweeper's `sweepAfterMs`, else `900_000`
   */
  readonly sweepAfterMs?: number;
  /** Structured logger (failed runs; the tasks log through their own). @defaultValue pino at `LOG_LEVEL`, else `warn` */
  readonly logger?: Logger;
}

/** Events of {@link Maintenance}; the metrics module listens to them. */
export interface MaintenanceEvents {
  /** A janitor run finished in this process. */
  janitor: [JanitorReport];
  /** A sweep finished in this process. */
  sweeper: [SweepReport];
  /** Fresh statistics, or `null` when another process is the one refreshing them. */
  stats: [KeyStats | null];
  /** A run failed (logged too); the next interval tries again. */
  error: [MaintenanceTask, unknown];
}

/**
 * Runs the janitor, the sweeper and the statistics refresh periodically, each under its own
 * Postgres advisory lock per schema: with many worker processes, one of them runs each task
 * at a time and the others skip that round (no waiting, no leader election to maintain; a dead
 * process's lock vanishes with its session). Timers are unref'd; {@link stop} waits for runs in
 * progress.
 *
 * @example
 * ```ts
 * import { BullmqJobLookup, Janitor, Maintenance, Sweeper } from 'idempotent-jobs/process';
 *
 * const jobs = new BullmqJobLookup({ connection: { url: 'redis://127.0.0.1:6379' } });
 * const maintenance = new Maintenance({
 *   db,
 *   janitor: new Janitor({ db }),
 *   sweeper: new Sweeper({ db, jobs, queues: ['payments'] }),
 *   janitorIntervalMs: 60_000,
 * });
 * maintenance.on('sweeper', (report) => console.log(`${report.recoveries.length} lost jobs recovered`));
 * maintenance.start();
 * // … on shutdown: waits for runs in progress
 * await maintenance.stop();
 * await jobs.close();
 * ```
 */
export class Maintenance extends EventEmitter<MaintenanceEvents> {
  readonly #db: Kysely<any>;
  readonly #schema: string;
  readonly #janitor: Janitor | undefined;
  readonly #sweeper: Sweeper | undefined;
  readonly #intervals: Record<MaintenanceTask, number>;
  readonly #sweepAfterMs: number | undefined;
  readonly #log: Logger;
  readonly #timers = new Set<NodeJS.Timeout>();
  readonly #running = new Set<Promise<unknown>>();
  #started = false;
  #stopped = false;

  constructor(options: MaintenanceOptions) {
    super();
    refuseUnknownOptions(
      options,
      optionNames<MaintenanceOptions>()(['db', 'schema', 'janitor', 'sweeper', 'janitorIntervalMs', 'sweeperIntervalMs', 'statsIntervalMs', 'sweepAfterMs', 'logger']),
      'new Maintenance(options)',
    );
    this.#db = options.db;
    this.#schema = options.schema ?? 'idempotent_jobs';
    this.#janitor = options.janitor;
    this.#sweeper = options.sweeper;
    this.#intervals = resolveMaintenanceIntervals(options);
    this.#sweepAfterMs = options.sweepAfterMs ?? options.sweeper?.options.sweepAfterMs;
    this.#log = (options.logger ?? defaultLogger()).child({ component: 'maintenance', schema: this.#schema });
    // An EventEmitter throws on an unheard 'error'; failures are logged, so listening is optional.
    this.on('error', () => {});
  }

  /** Warns about retention (janitor), then runs each task now and every interval until {@link stop}. */
  start(): void {
    if (this.#started) return;
    this.#started = true;
    this.#janitor?.checkRetention();
    if (this.#janitor) this.#schedule('janitor', () => this.runJanitor(), 0);
    if (this.#sweeper) this.#schedule('sweeper', () => this.runSweeper(), 0);
    if (this.#intervals.stats > 0) this.#schedule('stats', () => this.refreshStats(), 0);
  }

  /** Stops the timers and waits for runs in progress. */
  async stop(): Promise<void> {
    this.#stopped = true;
    for (const timer of this.#timers) clearTimeout(timer);
    this.#timers.clear();
    await Promise.allSettled([...this.#running]);
  }

  /** One janitor run, if no other process is running one; emits `'janitor'`. */
  async runJanitor(): Promise<LockedRun<JanitorReport>> {
    const janitor = this.#janitor;
    if (!janitor) throw new Error('Maintenance has no janitor.');
    const run = await withMaintenanceLock(this.#db, this.#schema, 'janitor', (connection) => janitor.runOnce(connection));
    if (run.ran) this.emit('janitor', run.result);
    return run;
  }

  /** One sweep, if no other process is sweeping the same queues; emits `'sweeper'`. */
  async runSweeper(): Promise<LockedRun<SweepReport>> {
    const sweeper = this.#sweeper;
    if (!sweeper) throw new Error('Maintenance has no sweeper.');
    const run = await withMaintenanceLock(
      this.#db,
      this.#schema,
      'sweeper',
      (connection) => sweeper.runOnce(connection),
      sweeper.lockScope,
    );
    if (run.ran) this.emit('sweeper', run.result);
    return run;
  }

  /** Reads key statistics, if no other process is refreshing them; emits `'stats'` (null when skipped). */
  async refreshStats(): Promise<LockedRun<KeyStats>> {
    const run = await withMaintenanceLock(this.#db, this.#schema, 'stats', (connection) =>
      new PostgresOperatorStore(connection, this.#schema).keyStats({ sweepAfterMs: this.#sweepAfterMs }),
    );
    this.emit('stats', run.ran ? run.result : null);
    return run;
  }

  #schedule(task: MaintenanceTask, run: () => Promise<unknown>, delayMs: number): void {
    if (this.#stopped) return;
    const timer = setTimeout(async () => {
      this.#timers.delete(timer);
      // A failed run changed nothing it had not finished (each statement is its own transaction,
      // and the sweeper acts on a key only after reading it whole); the next interval starts over.
      // A dropped connection or a restarting server is expected now and then: a warning.
      const running = run().catch((error: unknown) => {
        const level = isTransientStoreError(error) ? 'warn' : 'error';
        this.#log[level]({ err: error, task }, `${task} run failed; retrying at the next interval`);
        this.emit('error', task, error);
      });
      this.#running.add(running);
      await running;
      this.#running.delete(running);
      this.#schedule(task, run, this.#intervals[task]);
    }, delayMs);
    timer.unref();
    this.#timers.add(timer);
  }
}
