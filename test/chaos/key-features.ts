/**
 * A key-feature profile inside a chaos run: what it adds to the workers' environment and to
 * the producer, the processes and producers it runs during the chaos phase, which rows it takes
 * out of the suite's checks, and its own rule set (`key-feature-checks.ts`).
 *
 * - `tombstones`: short retention (`RETENTION_MS` 4 s) and a janitor (a maintenance process)
 *   leaving tombstones for an hour; duplicates of keys whose row is gone are sent late
 *   ({@link runLateDuplicates}).
 * - `concurrency-limits`: every job names one of 3 tenant keys, limit 2, and the in-all key
 *   `all`, limit 5, so that 5 slots serve 12 worker slots; `CONCURRENCY_STARVATION_MS` 5 s.
 *   Every 20th key's run lasts 3 leases, and every other worker runs on the fast path
 *   (`FAST_PATH`), whose key is not `processing` while it runs: its slots are held by their
 *   renewal alone, through kills and pauses.
 * - `coalescing`: bursts of adds of coalescing keys beside the suite's load, stamped by producer
 *   clocks minutes off both ways ({@link runCoalescingBursts}); the workers' store fails at the
 *   hand-over to a pending successor (`STORE_FAULT_POINTS`, {@link COALESCING_PROFILE}).
 * - `racing-schedulers`: a one-second schedule (`missed: 'all'`, `maxMissed` 1000) on the run's
 *   queue, ticked by 3 maintenance processes that are killed and restarted at seeded times,
 *   their wall clocks (and two workers') off by seeded offsets ({@link racingClockSkews});
 *   duplicates of ticks already enqueued or finished are sent beside them ({@link runTickDuplicates}).
 * - `dst-schedulers`: cron schedules in zones whose clocks change, ticked by 3 maintenance
 *   processes killed and restarted at seeded times, whose database clock runs through Europe's
 *   fall-back of 2026 and spring-forward of 2027 ({@link DstSchedulesRun}).
 */
import { createHash } from 'node:crypto';
import { sql, type Kysely } from 'kysely';
import { Schedules, scheduleScope, tickKey, type ConcurrencyLimit } from '../../src/index.js';
import type { RedisConnectionSettings } from '../../src/process/index.js';
import type { ExecutionRow, FailedJob, KeyRow } from './checker.js';
import {
  checkConcurrencyLimits,
  checkRacingSchedulers,
  checkTombstones,
  firstSightOfTicks,
  type KeyFeature,
  type KeyFeatureCheck,
  type LateDuplicate,
  type CursorSighting,
  type TickDuplicate,
} from './key-feature-checks.js';
import { checkCoalescing, type GenerationRun } from './coalescing-checks.js';
import { COALESCING_SCOPE, runCoalescingBursts, runLateDuplicates, runTickDuplicates, type CoalescingLoad } from './key-feature-load.js';
import { MaintenanceFleet } from './maintenance-fleet.js';
import { DstSchedulesRun } from './dst-schedules.js';
import type { LoadResult, ProducedKey } from './producer-load.js';
import type { NemesisEvent } from './nemesis.js';
import { seededRandom } from './random.js';
import type { WorkerLogLine } from './worker-fleet.js';

/** The tombstone profile's retention of a finished key's row, and how often the janitor runs. */
export const TOMBSTONE_PROFILE = { retentionMs: 4_000, tombstoneMs: 3_600_000, janitorIntervalMs: 1_000 } as const;
/** The concurrency profile's keys: `tenant:0` … `tenant:<groups − 1>`, each with `limit`, and the in-all key every job names too. */
export const CONCURRENCY_PROFILE = { groups: 3, limit: 2, inAll: { key: 'all', limit: 5 }, starvationMs: 5_000, longRunEvery: 20, longRunLeases: 3 } as const;
/** The coalescing profile's store faults at the hand-over (before it reaches Postgres, and after, its answer lost). */
export const COALESCING_PROFILE = { storeFaultPoints: 'before-hand-over:0.15,after-hand-over:0.15' } as const;
/** The scheduler profile's schedule: a tick a second, every missed tick enqueued. */
export const SCHEDULE_PROFILE = { name: 'chaos-tick', everyMs: 1_000, maxMissed: 1_000, schedulers: 3, payload: { n: -1, workMs: 20 } } as const;

/** How far the scheduler profile's processes' wall clocks are off, in ms (positive: ahead), per slot. */
export interface ClockSkews {
  readonly schedulers: readonly number[];
  readonly workers: readonly number[];
}

/**
 * The scheduler profile's wrong wall clocks, drawn from the seed: one scheduler 2–10 minutes
 * ahead, one 2–10 minutes behind, one 1–30 s either way; the first worker 1–5 minutes behind,
 * the second 1–5 s ahead. A worker is never minutes ahead: BullMQ dates a delayed job (a
 * deferral, a retry's backoff) by the worker's own clock, and workers with the right clock would
 * hold such a job back for those minutes (BullMQ's semantics, not the library's; see docs/chaos.md).
 */
export function racingClockSkews(seed: number, workers: number): ClockSkews {
  const random = seededRandom(seed, 19);
  const minutes = (min: number, max: number) => random.int(min * 60, max * 60) * 1_000;
  const sign = () => (random.next() < 0.5 ? -1 : 1);
  return {
    schedulers: [minutes(2, 10), -minutes(2, 10), sign() * random.int(1_000, 30_000)],
    workers: [-minutes(1, 5), random.int(1_000, 5_000)].slice(0, workers),
  };
}

/** The concurrency keys of produced key number `n` in the concurrency profile: its tenant's, and the in-all key. */
export function concurrencyOf(n: number): readonly ConcurrencyLimit[] {
  return [{ key: `tenant:${n % CONCURRENCY_PROFILE.groups}`, limit: CONCURRENCY_PROFILE.limit }, CONCURRENCY_PROFILE.inAll];
}

/** What the profile needs of the run. */
export interface KeyFeatureRunOptions {
  readonly feature: KeyFeature;
  readonly seed: number;
  readonly db: Kysely<any>;
  readonly schema: string;
  readonly queue: string;
  readonly prefix: string;
  readonly redis: RedisConnectionSettings;
  /** The environment a maintenance process needs to reach the run's Postgres and Redis. */
  readonly processEnv: Readonly<Record<string, string>>;
  /** The workers' lease. */
  readonly leaseMs: number;
  /** The suite's worker processes (the scheduler profile skews the clocks of the first two). */
  readonly workers: number;
  /** The suite's request count: the coalescing keys are a share of it. */
  readonly jobs: number;
  /** Over how long the producer spreads its requests. */
  readonly spreadMs: number;
  /** The chaos phase's length (the DST profile's clock runs through its two windows in it). */
  readonly chaosMs: number;
  readonly log: (line: string) => void;
}

/** The rows the check reads (the harness's `readRows`, before the profile takes its own out). */
export interface RunRows {
  readonly effects: readonly ExecutionRow[];
  readonly externalCalls: readonly ExecutionRow[];
  readonly keys: readonly KeyRow[];
}

/** One key-feature profile during a run. */
export class KeyFeatureRun {
  readonly #options: KeyFeatureRunOptions;
  readonly #keys = new Map<string, ProducedKey>();
  #maintenance: MaintenanceFleet | undefined;
  #dst: DstSchedulesRun | undefined;
  #giveUp: AbortSignal | undefined;
  #running: Promise<unknown> | undefined;
  #late: LateDuplicate[] = [];
  #tickDuplicates: TickDuplicate[] = [];
  #cursorSightings: CursorSighting[] = [];
  #jobName = '';
  #coalescing: CoalescingLoad | undefined;
  #schedulersStoppedAt = 0;

  constructor(options: KeyFeatureRunOptions) {
    this.#options = options;
  }

  get feature(): KeyFeature {
    return this.#options.feature;
  }

  /** Added to every worker's environment. */
  workerEnv(): Record<string, string> {
    switch (this.feature) {
      case 'tombstones':
        // A worker runs a janitor of its own too (JANITOR_ENABLED defaults to true): without
        // TOMBSTONE_MS it would delete keys leaving no tombstone, and their duplicates would run.
        return { RETENTION_MS: String(TOMBSTONE_PROFILE.retentionMs), TOMBSTONE_MS: String(TOMBSTONE_PROFILE.tombstoneMs) };
      case 'concurrency-limits':
        return { CONCURRENCY_STARVATION_MS: String(CONCURRENCY_PROFILE.starvationMs) };
      case 'coalescing':
        return { STORE_FAULT_POINTS: COALESCING_PROFILE.storeFaultPoints };
      default:
        return {};
    }
  }

  /** Per worker slot, environment of its own: the concurrency profile runs every other worker on the fast path. */
  workerEnvPerSlot(): ReadonlyArray<Record<string, string>> {
    if (this.feature !== 'concurrency-limits') return [];
    return Array.from({ length: this.#options.workers }, (_, slot) => (slot % 2 === 1 ? { FAST_PATH: 'true' } : ({} as Record<string, string>)));
  }

  /** Per worker slot, how far its wall clock is off (ms); empty when the profile skews none. */
  workerClockSkews(): readonly number[] {
    return this.feature === 'racing-schedulers' || this.feature === 'dst-schedulers' ? this.#clockSkews().workers : [];
  }

  #clockSkews(): ClockSkews {
    return racingClockSkews(this.#options.seed, this.#options.workers);
  }

  /** Added to the suite's producer's options. */
  producerOptions(): { keys: Map<string, ProducedKey>; concurrencyFor?: (n: number) => readonly ConcurrencyLimit[]; workMsFor?: (n: number) => number | undefined } {
    if (this.feature !== 'concurrency-limits') return { keys: this.#keys };
    const longMs = CONCURRENCY_PROFILE.longRunLeases * this.#options.leaseMs;
    return { keys: this.#keys, concurrencyFor: concurrencyOf, workMsFor: (n) => (n % CONCURRENCY_PROFILE.longRunEvery === 0 ? longMs : undefined) };
  }

  /** Before the chaos phase: the schedule, and the maintenance processes. */
  async start(): Promise<void> {
    const base = { ...this.#options.processEnv, SCHEMA: this.#options.schema, QUEUE: this.#options.queue, REDIS_PREFIX: this.#options.prefix, MIGRATE: 'false', LOG_LEVEL: 'silent', SWEEPER_ENABLED: 'false', STATS_INTERVAL_MS: '0' };
    if (this.feature === 'tombstones') {
      this.#maintenance = new MaintenanceFleet({
        count: 1,
        env: {
          ...base,
          SCHEDULER_ENABLED: 'false',
          RETENTION_MS: String(TOMBSTONE_PROFILE.retentionMs),
          TOMBSTONE_MS: String(TOMBSTONE_PROFILE.tombstoneMs),
          JANITOR_INTERVAL_MS: String(TOMBSTONE_PROFILE.janitorIntervalMs),
        },
      });
    }
    if (this.feature === 'racing-schedulers') {
      await new Schedules({ db: this.#options.db, schema: this.#options.schema }).upsert({
        name: SCHEDULE_PROFILE.name,
        every: SCHEDULE_PROFILE.everyMs,
        queue: this.#options.queue,
        data: SCHEDULE_PROFILE.payload,
        missed: 'all',
        maxMissed: SCHEDULE_PROFILE.maxMissed,
      });
      this.#jobName = (await new Schedules({ db: this.#options.db, schema: this.#options.schema }).get(SCHEDULE_PROFILE.name))!.jobName;
      const skews = this.#clockSkews();
      this.#options.log(`racing-schedulers: wall clocks off by ${skews.schedulers.map((ms) => `${ms} ms`).join(', ')} (schedulers), ${skews.workers.map((ms) => `${ms} ms`).join(', ')} (workers)`);
      this.#maintenance = new MaintenanceFleet({
        count: SCHEDULE_PROFILE.schedulers,
        env: { ...base, JANITOR_ENABLED: 'false', SCHEDULER_INTERVAL_MS: '200' },
        clockSkewsMs: skews.schedulers,
      });
    }
    if (this.feature === 'dst-schedulers') {
      const skews = this.#clockSkews();
      this.#options.log(`dst-schedulers: wall clocks off by ${skews.schedulers.map((ms) => `${ms} ms`).join(', ')} (schedulers), ${skews.workers.map((ms) => `${ms} ms`).join(', ')} (workers)`);
      this.#dst = new DstSchedulesRun({
        db: this.#options.db,
        schema: this.#options.schema,
        queue: this.#options.queue,
        env: { ...base, JANITOR_ENABLED: 'false' },
        clockSkewsMs: skews.schedulers,
      });
      this.#maintenance = this.#dst.fleet;
      await this.#dst.start();
      return;
    }
    this.#maintenance?.start();
    await this.#maintenance?.ready();
  }

  /** The profile's own load and faults during the chaos phase, until `stop` (new work) and `giveUp` (retries). */
  runDuringChaos(stop: AbortSignal, giveUp: AbortSignal): void {
    const { seed, queue, prefix, redis } = this.#options;
    const tasks: Array<Promise<unknown>> = [];
    if (this.feature === 'dst-schedulers') {
      this.#giveUp = giveUp;
      tasks.push(this.#dst!.runClock(this.#options.chaosMs, giveUp));
      tasks.push(this.#maintenance!.chaos(seed, stop));
    }
    if (this.feature === 'racing-schedulers') {
      tasks.push(this.#maintenance!.chaos(seed, stop));
      tasks.push(
        runTickDuplicates({
          seed, queue, prefix, redis, db: this.#options.db, schema: this.#options.schema,
          schedule: SCHEDULE_PROFILE.name,
          jobName: this.#jobName,
          payload: SCHEDULE_PROFILE.payload,
          stop,
          giveUp,
        }).then((load) => {
          this.#tickDuplicates = load.duplicates;
          this.#cursorSightings = load.cursors;
        }),
      );
    }
    if (this.feature === 'tombstones') {
      tasks.push(
        runLateDuplicates({
          seed, queue, prefix, redis, db: this.#options.db, schema: this.#options.schema,
          acknowledged: () => this.#keys.values(),
          olderThanMs: TOMBSTONE_PROFILE.retentionMs + 2 * TOMBSTONE_PROFILE.janitorIntervalMs,
          intervalMs: 1_500,
          perRound: 12,
          stop,
          giveUp,
        }).then((late) => (this.#late = late)),
      );
    }
    if (this.feature === 'coalescing') {
      tasks.push(
        runCoalescingBursts({ seed, queue, prefix, redis, keys: Math.max(10, Math.round(this.#options.jobs / 25)), spreadMs: this.#options.spreadMs, stop, giveUp }).then(
          (load) => (this.#coalescing = load),
        ),
      );
    }
    this.#running = Promise.all(tasks);
  }

  /** At the end of the chaos phase: waits for its load; the schedulers stop (gracefully) so that the ticks to check end. */
  async endChaos(): Promise<void> {
    await this.#running;
    if (this.feature === 'dst-schedulers') await this.#dst!.stop(this.#giveUp!);
    if (this.feature === 'racing-schedulers') {
      await this.#maintenance?.stop();
      this.#schedulersStoppedAt = Date.now();
    }
    const sent = this.#coalescing ? `; coalescing adds acknowledged: ${[...this.#coalescing.sent.values()].reduce((s, v) => s + v.length, 0)}` : '';
    const late = this.feature === 'tombstones' ? `; late duplicates sent: ${this.#late.length}` : '';
    const killed = this.#maintenance ? `; maintenance processes killed ${this.#maintenance.kills} times` : '';
    const ticks = this.feature === 'racing-schedulers' ? `; duplicates of ticks sent: ${this.#tickDuplicates.length}` : '';
    this.#options.log(`${this.feature}: profile load done${sent}${late}${ticks}${killed}`);
  }

  /** Whether an effect row belongs to the profile's own check rather than to the suite's keys. */
  ownsEffect(row: ExecutionRow): boolean {
    return row.scope === COALESCING_SCOPE || row.scope === scheduleScope(SCHEDULE_PROFILE.name) || (this.#dst?.owns(row) ?? false);
  }

  /** Failed jobs that the profile expects (late duplicates with another payload: `KEY_REUSED`). */
  expectsFailure(job: FailedJob): boolean {
    return this.feature === 'tombstones' && job.jobId.startsWith('late-other-');
  }

  /**
   * The key rows of keys the janitor deleted, from their tombstones: completed (or failed), with
   * the fence of their effect (the tombstone keeps none), so the suite's checks count them done.
   */
  async tombstonedKeyRows(load: LoadResult, keys: readonly KeyRow[], effects: readonly ExecutionRow[]): Promise<KeyRow[]> {
    if (this.feature !== 'tombstones') return [];
    const { rows } = await sql<{ scope: string; key_hash: string; failed: boolean }>`
      select scope, encode(key_hash, 'hex') as key_hash, failed from ${sql.id(this.#options.schema, 'key_tombstones')}`.execute(this.#options.db);
    const tombstones = new Map(rows.map((row) => [`${row.scope}/${row.key_hash}`, row.failed]));
    const present = new Set(keys.map((row) => `${row.scope}/${row.key}`));
    const fenceOf = new Map(effects.map((row) => [`${row.scope}/${row.key}`, row.fence]));
    const found: KeyRow[] = [];
    for (const [id, produced] of load.keys) {
      if (present.has(id)) continue;
      const failed = tombstones.get(`${produced.scope}/${createHash('sha256').update(produced.key).digest('hex')}`);
      if (failed === undefined) continue;
      found.push({ scope: produced.scope, key: produced.key, status: failed ? 'failed' : 'completed', fence: fenceOf.get(id) ?? 0 });
    }
    return found;
  }

  /** The profile's rules, after the drain and the workers' stop. */
  async check(rows: RunRows, lines: readonly WorkerLogLine[], failedJobs: readonly FailedJob[], load: LoadResult, faults: readonly NemesisEvent[]): Promise<KeyFeatureCheck> {
    const { db, schema } = this.#options;
    switch (this.feature) {
      case 'tombstones': {
        const { rows: count } = await sql<{ n: number }>`select count(*)::int as n from ${sql.id(schema, 'key_tombstones')} where expires_at > now()`.execute(db);
        return checkTombstones({ late: this.#late, effects: rows.effects, failedJobs, lines, tombstones: count[0]!.n });
      }
      case 'concurrency-limits': {
        const groups = new Map([...load.keys].map(([id, produced]) => [id, concurrencyOf(produced.payload.n)]));
        const { rows: live } = await sql<{ group_key: string; slot: number; scope: string; key: string }>`
          select s.group_key, s.slot, s.scope, s.key from ${sql.id(schema, 'concurrency_slots')} as s
           where s.acquired_until > now()`.execute(db);
        return checkConcurrencyLimits({
          groups,
          effects: rows.effects,
          externalCalls: rows.externalCalls,
          lines,
          liveSlots: live.map((slot) => `${slot.group_key}/${slot.slot} by ${slot.scope}/${slot.key}`),
          leaseMs: this.#options.leaseMs,
          // A killed worker's slot is held for its lease; a free slot is kept for a starving waiter
          // until it comes back or has not been seen for the starvation bound, and the next
          // starving waiter may hold it the same way: two such holds, two leases and 2 s.
          starvedBoundMs: 2 * CONCURRENCY_PROFILE.starvationMs + 2 * this.#options.leaseMs + 2_000,
          faultWindows: faults
            .filter((fault) => !fault.skipped)
            .map((fault) => ({ from: fault.at, to: Math.max(fault.endedAt, fault.at + (fault.pauseMs ?? 0) + (fault.downMs ?? 0)) + this.#options.leaseMs })),
        });
      }
      case 'coalescing':
        return this.#checkCoalescing(rows, lines);
      case 'dst-schedulers':
        return this.#dst!.check(rows.effects);
      case 'racing-schedulers': {
        const info = await new Schedules({ db, schema }).get(SCHEDULE_PROFILE.name);
        const { rows: created } = await sql<{ created_at: Date }>`
          select created_at from ${sql.id(schema, 'schedules')} where name = ${SCHEDULE_PROFILE.name}`.execute(db);
        const every = SCHEDULE_PROFILE.everyMs;
        const first = Math.floor(created[0]!.created_at.getTime() / every) * every + every;
        const effects = rows.effects.filter((row) => row.scope === scheduleScope(SCHEDULE_PROFILE.name));
        // With missed: 'all', a round enqueues every tick after the cursor, oldest first: every
        // tick up to the newest one enqueued (by its effect; one killed before moving the cursor
        // counts too) or up to the cursor must have run. A tick after the schedulers stopped is no tick.
        const cursor = info?.lastTick?.getTime() ?? 0;
        const newest = Math.max(0, ...effects.map((row) => Date.parse(row.key)).filter((tick) => Number.isFinite(tick) && tick <= this.#schedulersStoppedAt));
        const expectedTicks: string[] = [];
        for (let tick = first; tick <= Math.max(cursor, newest); tick += every) expectedTicks.push(tickKey(new Date(tick)));
        let upToCursor = 0;
        for (let tick = first; tick <= cursor; tick += every) upToCursor++;
        // The database's first sight of each tick's job, all after its enqueue: the key row's
        // creation (the first claim), the first external call, the first effect, and the first
        // read of a cursor at or past the tick (a round moves the cursor after its enqueues).
        const scope = scheduleScope(SCHEDULE_PROFILE.name);
        const { rows: claimed } = await sql<{ key: string; at: number }>`
          select key, extract(epoch from created_at)::float8 * 1000 as at from ${sql.id(schema, 'idempotency_keys')} where scope = ${scope}`.execute(db);
        const firstSeenAt = firstSightOfTicks([...claimed, ...rows.externalCalls.filter((row) => row.scope === scope), ...effects], this.#cursorSightings);
        return checkRacingSchedulers({
          expectedTicks,
          upToCursor,
          effects,
          firstSeenAt,
          duplicates: this.#tickDuplicates,
          clockSkewsMs: this.#clockSkews(),
          kills: this.#maintenance?.kills ?? 0,
          starts: this.#maintenance?.starts ?? 0,
        });
      }
    }
  }

  /**
   * The coalescing profile's rules: its generations' runs (from the effects, which record the
   * payload's version, and the external calls, each run's start), the key rows of its generations,
   * and when each version counts as sent: its producer's stamp, or, for a stamp that was ahead of
   * the database's clock at its first arrival, the time that arrival was given (`coalescing_arrivals`).
   */
  async #checkCoalescing(rows: RunRows, lines: readonly WorkerLogLine[]): Promise<KeyFeatureCheck> {
    const { db, schema } = this.#options;
    const { rows: versions } = await sql<{ key: string; fence: string; version: number | null }>`
      select key, fence, version from ${sql.id(schema, 'effects')} where scope = ${COALESCING_SCOPE}`.execute(db);
    const versionOf = new Map(versions.map((row) => [`${row.key}#${row.fence}`, row.version ?? 0]));
    const calls = rows.externalCalls.filter((row) => row.scope === COALESCING_SCOPE);
    const runs: GenerationRun[] = rows.effects
      .filter((row) => row.scope === COALESCING_SCOPE)
      .map((row) => {
        const [base, generation] = splitGeneration(row.key);
        const starts = calls.filter((call) => call.key === row.key && call.fence === row.fence && call.at <= row.at).map((call) => call.at);
        return {
          id: `${COALESCING_SCOPE}/${base}`,
          generation,
          version: versionOf.get(`${row.key}#${row.fence}`) ?? 0,
          start: starts.length > 0 ? Math.max(...starts) : undefined,
          end: row.at,
        };
      });
    const generations = new Map<string, number[]>();
    for (const row of rows.keys.filter((k) => k.scope === COALESCING_SCOPE)) {
      const [base, generation] = splitGeneration(row.key);
      const id = `${COALESCING_SCOPE}/${base}`;
      generations.set(id, [...(generations.get(id) ?? []), generation]);
    }
    const { rows: given } = await sql<{ job_id: string; sent_at: number }>`
      select job_id, extract(epoch from sent_at)::float8 * 1000 as sent_at
        from ${sql.id(schema, 'coalescing_arrivals')} where scope = ${COALESCING_SCOPE}`.execute(db);
    const load = this.#coalescing;
    const sentAt = coalescingSentAt(load, new Map(given.map((row) => [row.job_id, Number(row.sent_at)])));
    return checkCoalescing({
      sent: load?.sent ?? new Map(),
      runs,
      generations,
      versionOfJob: load?.versionOfJob ?? new Map(),
      lines,
      sentAt,
      skewOfJob: load?.skewOfJob ?? new Map(),
    });
  }

  /** Stops what the profile started (also after a failure). */
  async close(): Promise<void> {
    await this.#maintenance?.stop(2_000).catch(() => {});
  }
}

/**
 * Per coalescing key, per version: when the database counts it as sent: the time its first
 * arrival was given (`given`, by job id) when there is one, else its producer's stamp.
 */
export function coalescingSentAt(load: CoalescingLoad | undefined, given: ReadonlyMap<string, number>): Map<string, Map<number, number>> {
  const sentAt = new Map<string, Map<number, number>>();
  if (!load) return sentAt;
  for (const [jobId, version] of load.versionOfJob) {
    const stamp = load.stampOfJob.get(jobId);
    const id = load.keyOfJob.get(jobId);
    if (stamp === undefined || id === undefined) continue;
    const versions = sentAt.get(id) ?? new Map<number, number>();
    versions.set(version, given.get(jobId) ?? stamp);
    sentAt.set(id, versions);
  }
  return sentAt;
}

/** `entity-3#2` → [`entity-3`, 2]. */
function splitGeneration(key: string): [string, number] {
  const at = key.lastIndexOf('#');
  return [key.slice(0, at), Number(key.slice(at + 1))];
}
