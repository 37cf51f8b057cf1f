/**
 * One chaos run: a private Postgres cluster and a private Redis, K worker processes, the
 * producer and the nemesis at once for the chaos phase; then a drain (faults stop, the system
 * must finish every acknowledged key), a graceful stop, and the check. Everything the run
 * created is removed afterwards, also when it fails or is interrupted.
 */
import { randomBytes } from 'node:crypto';
import { Queue, createPostgresBackend } from 'bullmq';
import { sql, type Kysely } from 'kysely';
import { createPostgresDb, migrate } from '../../src/index.js';
import { VanishedKeyReconciler, openRedisConnection, type ReconcileReport, type RedisConnection } from '../../src/process/index.js';
import { startClusterChaosRedis, startSentinelChaosRedis, startSingleChaosRedis, type ChaosRedis } from './chaos-redis.js';
import { CHAOS_STEPS, createChaosTables } from './chaos-handler.js';
import { TENANT_SETTING, countServerErrorsOfFaults, createJobFaultObjects, type JobFault } from './job-faults.js';
import { FAULT_LOG_MESSAGE } from './fault-injection.js';
import { checkHistory, type CheckResult, type ExecutionRow, type FailedJob, type KeyRow, type StepRecordRow } from './checker.js';
import { abortableSleep, nemesisSchedule, runNemesis, type NemesisEvent, type NemesisOp } from './nemesis.js';
import { PatroniCluster } from '../support/patroni-cluster.js';
import { PgBouncer } from '../support/pgbouncer.js';
import { PrivatePostgres } from './private-postgres.js';
import { keysToResend, resendWindows } from './failover-resend.js';
import { resendKeys, runProducerLoad, type LoadResult } from './producer-load.js';
import { WorkerFleet, type WorkerExit, type WorkerLogLine } from './worker-fleet.js';
import type { KeyFeature, KeyFeatureCheck } from './key-feature-checks.js';
import { KeyFeatureRun } from './key-features.js';

/** Parameters of a run (see `run-chaos.ts` for the command-line flags and defaults). */
export interface ChaosOptions {
  readonly seed: number;
  readonly workers: number;
  readonly jobs: number;
  /** Length of the chaos phase (producer and nemesis running). */
  readonly durationMs: number;
  readonly concurrency: number;
  /** Share of requests that repeat a key, in [0, 1). */
  readonly duplicateRatio: number;
  readonly leaseMs: number;
  /** Mean time between faults. */
  readonly faultIntervalMs: number;
  /** Longest simulated work per job. */
  readonly maxWorkMs: number;
  /** Random crash probabilities for the workers (`FAULT_POINTS`), on top of the scheduled ones. */
  readonly faultPoints: string;
  /** How long the system may take to finish after the faults stop. */
  readonly drainTimeoutMs: number;
  /** Run the workers on the single-transaction fast path (`FAST_PATH=true`) instead of leases. */
  readonly fastPath: boolean;
  /** Workers share transactions between concurrent jobs (`GROUP_COMMIT=true`). */
  readonly groupCommit: boolean;
  /**
   * The multi-step profile: workers run the multi-step handler (`CHAOS_STEPS=true`), the
   * nemesis also crashes inside and between steps, and the checker adds the step checks.
   */
  readonly steps: boolean;
  /**
   * Workers run the database-only handler (`{ transaction }`, `CHAOS_DATABASE_ONLY=true`) with
   * neither `FAST_PATH` nor `GROUP_COMMIT` set: its defaults, the fast path with group commit.
   */
  readonly databaseOnly?: boolean;
  /**
   * Workers write the effect through Drizzle over node-postgres (`CHAOS_DRIZZLE=true`): the
   * chaos handler's `ctx.transaction(drizzleDataLayer(db), fn)`, on a pool of Drizzle's own.
   */
  readonly drizzle?: boolean;
  /**
   * With `databaseOnly`: a seeded share of keys carries a job fault (`job-faults.ts`) that the
   * handler sends in its transaction; the workers watch the tenant setting
   * (`GROUP_COMMIT_WATCH_SETTINGS`), and the checker adds the job-fault checks.
   */
  readonly jobFaults?: boolean;
  /**
   * Workers reach Postgres through a PgBouncer in transaction mode (`DATABASE_URL`), and the
   * private cluster itself for what needs a session (`DATABASE_DIRECT_URL`). The harness and
   * the nemesis use the cluster directly; PgBouncer stays up through every Postgres fault.
   */
  readonly pgBouncer?: boolean;
  /**
   * A private Redis Cluster (3 masters with a replica each) instead of one redis-server: the
   * prefix gets a hash tag, and the Redis faults aim at the queue's shard, plus coordinated
   * failovers of it.
   */
  readonly redisCluster?: boolean;
  /**
   * A private Redis Sentinel set-up (a master, a replica, three sentinels) instead of one
   * redis-server: every process finds the master through the sentinels; the Redis faults are
   * its failovers (`SENTINEL FAILOVER`) and crashes of the master (the replica promoted). After
   * the drain the producer sends again every key acknowledged around a change of master
   * (`failover-resend.ts`), and the system drains once more before the check.
   */
  readonly redisSentinel?: boolean;
  /**
   * The Patroni profile: instead of one private Postgres, a private Patroni cluster (a leader and
   * a standby, etcd, HAProxy routing to the leader) that the workers and the harness reach
   * through HAProxy; the nemesis's Postgres faults are the cluster's (`PATRONI_FAULT_KINDS`).
   * `'synchronous'`: commits wait for the standby (nothing acknowledged can be lost);
   * `'asynchronous'`: they do not, and a failover may lose what the leader acknowledged alone.
   */
  readonly patroni?: 'synchronous' | 'asynchronous';
  /**
   * After the drain, run the `VanishedKeyReconciler` over the whole run (jobs BullMQ completed
   * whose key a failover lost) and drain again before the check.
   */
  readonly reconcile?: boolean;
  /**
   * Where BullMQ keeps the queue: `redis` (a private redis-server), or `postgres` (BullMQ's
   * PostgreSQL backend in the private cluster, no Redis at all: the Redis faults drop out, the
   * Postgres faults hit the queue too, completed jobs are kept and the checker fails the run on
   * a committed job delivered again). @defaultValue `'redis'`
   */
  readonly queueBackend?: 'redis' | 'postgres';
  /**
   * A key-feature profile (`key-features.ts`): tombstones past retention, per-key concurrency
   * limits, coalescing under bursts, or racing schedulers; its rule set is added to the checks.
   */
  readonly keyFeature?: KeyFeature;
  /** Keep the private cluster's directory afterwards (for investigating a failed run). */
  readonly keepData: boolean;
  /** How often a progress line is logged. */
  readonly progressIntervalMs: number;
  /** Progress lines go here. */
  readonly log: (line: string) => void;
}

/** Everything a run produced: the input to the report. */
export interface ChaosRun {
  readonly options: ChaosOptions;
  readonly names: { readonly schema: string; readonly queue: string; readonly prefix: string; readonly redisPort: number; readonly postgresPort: number };
  readonly schedule: readonly NemesisOp[];
  readonly events: readonly NemesisEvent[];
  readonly load: LoadResult;
  readonly check: CheckResult;
  readonly drained: boolean;
  /** BullMQ job counts after the drain (all should be 0). */
  readonly queueCounts: Record<string, number>;
  /** Times the private Postgres started with crash recovery. */
  readonly postgresRecoveries: number;
  readonly workerStarts: number;
  /** The raw history: every kept worker log line, process start and exit. */
  readonly history: {
    readonly lines: readonly WorkerLogLine[];
    readonly starts: ReadonlyArray<{ pid: number; slot: number; at: number }>;
    readonly exits: readonly WorkerExit[];
  };
  readonly timings: { readonly chaosMs: number; readonly drainMs: number; readonly totalMs: number };
  /** For keys that failed a check: their log lines and rows, to read the history. */
  readonly evidence: Record<string, unknown>;
  /** With job faults: the errors they made Postgres log, by cause (`countServerErrorsOfFaults`). */
  readonly serverErrorsOfFaults?: Readonly<Record<string, number>>;
  /** On Redis Sentinel: what the failovers lost, and what the producer sent again (see {@link FailoverResend}). */
  readonly resent?: FailoverResend;
  /** With `reconcile`: what the reconciler found after the first drain, and sent again. */
  readonly reconciled?: { readonly checked: number; readonly vanished: number; readonly unfinished: number; readonly reenqueued: number };
  /** With a key-feature profile: its rules' verdict and numbers. */
  readonly keyFeature?: KeyFeatureCheck;
  /** Workers that died during the run neither by the nemesis's SIGKILL nor by an injected crash. */
  readonly unexpectedExits: ReadonlyArray<WorkerExit & { readonly stderr: string }>;
}

/**
 * The Sentinel profile's re-sending after the first drain: how many changes of master there
 * were, which acknowledged keys had not completed then (with no job left: adds the failovers
 * lost), and the keys the producer sent again (those acknowledged around a change of master).
 */
export interface FailoverResend {
  /** `SENTINEL FAILOVER`s and crashes of the master carried out. */
  readonly masterChanges: number;
  /** Acknowledged keys not completed after the first drain, with no job waiting, delayed or active. */
  readonly lost: number;
  /** Of `lost`, keys with no add acknowledged in a re-sending window: the re-sending cannot bring them back. */
  readonly lostOutsideWindows: number;
  /** Keys with an add acknowledged in a window, each sent again once. */
  readonly resent: number;
  /** Re-sends acknowledged; retried attempts; given up. */
  readonly acknowledged: number;
  readonly retries: number;
  readonly unacknowledged: number;
}

const QUEUE_STATES = ['wait', 'active', 'delayed', 'prioritized', 'waiting-children', 'failed'] as const;

/** Runs one chaos run. Rejects when the run itself could not be carried out (not on a failed check). */
export async function runChaos(options: ChaosOptions, interrupt: AbortSignal): Promise<ChaosRun> {
  const began = Date.now();
  const suffix = randomBytes(3).toString('hex');
  const queue = `chaos_${suffix}`;
  const prefix = `ijchaos-${options.seed}-${suffix}`;
  // On a cluster a hash tag keeps every key of the queue in one slot (BullMQ's scripts need it).
  const names = { schema: `chaos_${options.seed}_${suffix}`, queue, prefix: options.redisCluster ? `{${prefix}}` : prefix, redisPort: 0, postgresPort: 0 };
  const applicationName = `idempotent-jobs:worker:${queue}`;
  const { log } = options;
  const queueInPostgres = options.queueBackend === 'postgres';

  let postgres: PrivatePostgres | undefined;
  let patroni: PatroniCluster | undefined;
  let bouncer: PgBouncer | undefined;
  let db: Kysely<any> | undefined;
  let redis: ChaosRedis | undefined;
  let redisConnection: RedisConnection | undefined;
  let bullQueue: Queue | undefined;
  let fleet: WorkerFleet | undefined;
  let featureRun: KeyFeatureRun | undefined;
  try {
    // Its binaries: PG_BINDIR, else pg_config --bindir, else /usr/lib/postgresql/<newest>/bin.
    if (options.patroni) patroni = await PatroniCluster.start({ synchronous: options.patroni === 'synchronous', maxConnections: maxConnectionsFor(options) });
    else postgres = await PrivatePostgres.start({ maxConnections: maxConnectionsFor(options) });
    const postgresUrl = patroni ? patroni.url : postgres!.url;
    names.postgresPort = Number(new URL(postgresUrl).port);
    // The harness's own pool: a connection that a fault killed is dropped, and the next query
    // opens a new one.
    db = createPostgresDb({ connectionString: postgresUrl, maxConnections: 3, applicationName: 'idempotent-jobs:chaos-harness' }, () => {});
    await migrate(db, { schema: names.schema });
    await createChaosTables(db, names.schema);
    if (options.jobFaults) await createJobFaultObjects(db, names.schema);
    if (options.pgBouncer) bouncer = await PgBouncer.start({ upstream: postgresUrl, poolSize: pgBouncerPoolSizeFor(options) });
    const where = patroni
      ? `a private Patroni cluster (${options.patroni} replication; members ${patroni.memberNames.join(', ')}) behind HAProxy on port ${names.postgresPort} (${patroni.dir})`
      : `private postgres on port ${postgres!.port} (${postgres!.dir})`;
    const queueSchema = `${names.schema}_queue`;
    if (queueInPostgres) {
      log(`${where}, schema ${names.schema}; queue ${queue} in Postgres (BullMQ's PostgreSQL backend, schema ${queueSchema}), no Redis`);
      bullQueue = new Queue(queue, { connection: { connectionString: postgresUrl, schema: queueSchema, migrate: true } }, createPostgresBackend) as unknown as Queue;
    } else {
      redis = options.redisCluster
        ? await startClusterChaosRedis(`${names.prefix}:${queue}:wait`)
        : options.redisSentinel
          ? await startSentinelChaosRedis()
          : await startSingleChaosRedis();
      names.redisPort = redis.port;
      log(`${where}, schema ${names.schema}; ${redis.description}; queue ${queue}`);
      redisConnection = openRedisConnection(redis.settings);
      bullQueue = new Queue(queue, { connection: redisConnection.connection, prefix: names.prefix });
    }
    if (bouncer) log(`workers through PgBouncer (transaction mode, ${pgBouncerPoolSizeFor(options)} server connections) on port ${bouncer.port} (${bouncer.dir})`);
    bullQueue.on('error', () => {});
    if (options.keyFeature) {
      if (!redis) throw new Error('the key-feature profiles run on Redis (not with --queue-backend postgres)');
      featureRun = new KeyFeatureRun({
        feature: options.keyFeature,
        seed: options.seed,
        db,
        schema: names.schema,
        queue,
        prefix: names.prefix,
        redis: redis.settings,
        processEnv: { DATABASE_URL: postgresUrl, ...redis.workerEnv },
        leaseMs: options.leaseMs,
        workers: options.workers,
        jobs: options.jobs,
        spreadMs: options.durationMs * 0.85,
        chaosMs: options.durationMs,
        log,
      });
    }

    fleet = new WorkerFleet({
      count: options.workers,
      clockSkewsMs: featureRun?.workerClockSkews() ?? [],
      envPerSlot: featureRun?.workerEnvPerSlot() ?? [],
      env: {
        DATABASE_URL: bouncer ? bouncer.url() : postgresUrl,
        DATABASE_DIRECT_URL: postgresUrl,
        ...(redis ? redis.workerEnv : { QUEUE_BACKEND: 'postgres', QUEUE_SCHEMA: queueSchema }),
        SCHEMA: names.schema,
        REDIS_PREFIX: names.prefix,
        QUEUE: queue,
        CONCURRENCY: String(options.concurrency),
        LEASE_MS: String(options.leaseMs),
        DEFER_MAX_MS: String(Math.min(1_000, options.leaseMs)),
        SHUTDOWN_TIMEOUT_MS: '5000',
        PG_POOL_SIZE: String(options.concurrency + 2),
        LOG_LEVEL: 'info',
        // As in production: each worker migrates at start (the harness already did; a no-op).
        MIGRATE: 'true',
        FAULT_POINTS: options.faultPoints,
        FAULT_SEED: String(options.seed),
        // Empty is unset (loadEnvConfig): also over a value in the harness's own environment.
        FAST_PATH: options.databaseOnly ? '' : String(options.fastPath),
        GROUP_COMMIT: options.databaseOnly ? '' : String(options.groupCommit),
        CHAOS_STEPS: String(options.steps),
        CHAOS_DATABASE_ONLY: String(options.databaseOnly ?? false),
        CHAOS_DRIZZLE: String(options.drizzle ?? false),
        // The tenant faults set a custom setting no catalog declares: name it to be watched.
        GROUP_COMMIT_WATCH_SETTINGS: options.jobFaults ? TENANT_SETTING : '',
        ...featureRun?.workerEnv(),
      },
    });
    await fleet.start();
    await featureRun?.start();
    log(`${options.workers} workers ready; chaos for ${Math.round(options.durationMs / 1000)} s`);

    // Chaos phase: producer and nemesis together.
    const schedule = nemesisSchedule({
      seed: options.seed,
      durationMs: options.durationMs,
      intervalMs: options.faultIntervalMs,
      workers: options.workers,
      leaseMs: options.leaseMs,
      steps: options.steps,
      // Sentinel's failovers are drawn as the cluster's are.
      redisCluster: (options.redisCluster || options.redisSentinel) ?? false,
      patroni: options.patroni !== undefined,
      queueInPostgres,
    });
    const chaosStart = Date.now();
    const stopProducer = new AbortController();
    const giveUp = new AbortController();
    const stopNemesis = new AbortController();
    const onInterrupt = () => {
      stopProducer.abort();
      giveUp.abort();
      stopNemesis.abort();
    };
    interrupt.addEventListener('abort', onInterrupt, { once: true });
    const loadDone = runProducerLoad({
      seed: options.seed,
      jobs: options.jobs,
      duplicateRatio: options.duplicateRatio,
      spreadMs: options.durationMs * 0.85,
      maxWorkMs: options.maxWorkMs,
      jobFaults: options.jobFaults ?? false,
      keepCompleted: options.reconcile ?? false,
      queue,
      prefix: names.prefix,
      ...(redis ? { redis: redis.settings } : { postgresQueue: { url: postgresUrl, schema: queueSchema } }),
      stop: stopProducer.signal,
      giveUp: giveUp.signal,
      ...featureRun?.producerOptions(),
    });
    // The profile's own load and faults run for the chaos phase, as the nemesis does.
    featureRun?.runDuringChaos(stopNemesis.signal, giveUp.signal);
    const targets = { fleet, redis, ...(postgres ? { postgres } : {}), ...(patroni ? { patroni } : {}), db, applicationName };
    const nemesisDone = runNemesis(schedule, targets, chaosStart, stopNemesis.signal, options.seed);
    const harnessDb = db;
    let reconciled: ReconcileReport | undefined;
    const progress = setInterval(() => void reportProgress(harnessDb, bullQueue!, names.schema, fleet!, chaosStart, log), options.progressIntervalMs);
    try {
      await abortableSleep(options.durationMs, interrupt);
      stopNemesis.abort();
      const events = await nemesisDone;
      const chaosMs = Date.now() - chaosStart;
      log(`faults stopped after ${Math.round(chaosMs / 1000)} s (${events.filter((e) => !e.skipped).length} carried out); draining`);

      // Drain: the producer finishes its requests, then every acknowledged key must complete.
      const drainStart = Date.now();
      let drainDeadline = drainStart + options.drainTimeoutMs;
      const giveUpTimer = setTimeout(() => giveUp.abort(), options.drainTimeoutMs);
      const load = await loadDone;
      await featureRun?.endChaos();
      clearTimeout(giveUpTimer);
      const acknowledged = [...load.keys.values()].filter((k) => k.acks > 0).length;
      let drained = false;
      let queueCounts: Record<string, number> = {};
      const drainQueue = bullQueue;
      const drainFleet = fleet;
      const waitForDrain = async () => {
        drained = false;
        // Settled: nothing queued and nothing changing for a while, although keys are missing
        // (their jobs failed, or were lost). Waiting longer cannot help; the checker says why.
        let unchanged = { state: '', since: Date.now() };
        while (!interrupt.aborted && Date.now() < drainDeadline) {
          if (drainFleet.failure) throw drainFleet.failure;
          try {
            const completed = await countCompleted(harnessDb, names.schema);
            queueCounts = await drainQueue.getJobCounts(...QUEUE_STATES);
            const pending = QUEUE_STATES.filter((s) => s !== 'failed').reduce((sum, s) => sum + (queueCounts[s] ?? 0), 0);
            if (completed >= acknowledged && pending === 0) {
              drained = true;
              break;
            }
            const state = `${completed}/${JSON.stringify(queueCounts)}`;
            if (state !== unchanged.state) unchanged = { state, since: Date.now() };
            else if (pending === 0 && Date.now() - unchanged.since >= settleMsFor(options)) {
              log(`queue empty and nothing changed for ${Math.round(settleMsFor(options) / 1000)} s, but only ${completed} of ${acknowledged} keys completed (${queueCounts.failed ?? 0} jobs failed)`);
              drained = true;
              break;
            }
          } catch {
            // A connection left over from a fault; the next round opens a new one.
          }
          await abortableSleep(500, interrupt);
        }
      };
      await waitForDrain();
      let resent: FailoverResend | undefined;
      if (options.redisSentinel && redis && !interrupt.aborted) {
        // What a producer does after a Sentinel failover (docs/operations.md): send every request
        // acknowledged around it again with the same key. First, what the failovers lost: keys
        // acknowledged, not completed, and with no job left to run them.
        const windows = resendWindows(events);
        const completedKeys = await retrying(() => readCompletedKeys(harnessDb, names.schema));
        const queued = await retrying(() => pendingKeys(drainQueue));
        const lostIds = new Set(
          [...load.keys].filter(([id, key]) => key.acks > 0 && !completedKeys.has(id) && !queued.has(id)).map(([id]) => id),
        );
        const again = keysToResend(load.keys.values(), windows);
        const againIds = new Set(again.map((key) => `${key.scope}/${key.key}`));
        const resendGiveUp = AbortSignal.any([interrupt, AbortSignal.timeout(options.drainTimeoutMs)]);
        const sent = await resendKeys(again, { queue, prefix: names.prefix, redis: redis.settings, keepCompleted: options.reconcile ?? false, giveUp: resendGiveUp });
        resent = {
          masterChanges: windows.length,
          lost: lostIds.size,
          lostOutsideWindows: [...lostIds].filter((id) => !againIds.has(id)).length,
          resent: again.length,
          ...sent,
        };
        log(
          `re-sending: ${resent.lost} acknowledged keys lost by ${resent.masterChanges} changes of master (${resent.lostOutsideWindows} outside the windows); ` +
            `${resent.resent} keys acknowledged around them sent again (${sent.retries} retries, ${sent.unacknowledged} given up)`,
        );
        drainDeadline = Date.now() + options.drainTimeoutMs;
        await waitForDrain();
      }
      if (options.reconcile && redisConnection && !interrupt.aborted) {
        // What a failover of an asynchronous standby lost: jobs BullMQ holds as completed whose
        // key vanished (or kept its claim but lost its completion). The reconciler sends them
        // again; then the system drains once more.
        const reconciler = new VanishedKeyReconciler({ queue, connection: redisConnection.connection, prefix: names.prefix, db: harnessDb, schema: names.schema, windowMs: Date.now() - began });
        try {
          reconciled = await reconciler.run();
        } finally {
          await reconciler.close();
        }
        log(`reconciler: ${reconciled.checked} completed jobs checked, ${reconciled.vanished.length} had lost their key (${reconciled.vanished.filter((v) => v.found === 'unfinished').length} left processing), ${reconciled.reenqueued} sent again`);
        await waitForDrain();
      }
      if (interrupt.aborted) throw new Error('interrupted');
      const drainMs = Date.now() - drainStart;
      clearInterval(progress);
      log(drained ? `queue drained in ${Math.round(drainMs / 1000)} s` : `NOT drained within ${Math.round(options.drainTimeoutMs / 1000)} s`);

      const stoppedAt = Date.now();
      await fleet.stop(10_000);
      const rows = await retrying(() => readRows(harnessDb, names.schema, options.steps));
      if (featureRun) rows.keys.push(...(await retrying(() => featureRun!.tombstonedKeyRows(load, rows.keys, rows.effects))));
      const pending = drained ? new Set<string>() : await pendingKeys(bullQueue);
      const failedJobs = await retrying(() => readFailedJobs(bullQueue!));
      queueCounts = await retrying(() => bullQueue!.getJobCounts(...QUEUE_STATES));
      const keyFeature = featureRun ? await retrying(() => featureRun!.check(rows, fleet!.lines, failedJobs, load, events)) : undefined;
      const check = checkHistory({
        produced: load.keys,
        // A profile's own keys (coalescing generations, schedule ticks) are checked by its rules.
        effects: featureRun ? rows.effects.filter((row) => !featureRun!.ownsEffect(row)) : rows.effects,
        externalCalls: rows.externalCalls,
        keys: rows.keys,
        ...(rows.steps ? { steps: { sequence: CHAOS_STEPS, ...rows.steps } } : {}),
        lines: fleet.lines,
        exits: fleet.exits,
        stoppedAt,
        pending,
        failedJobs: featureRun ? failedJobs.filter((job) => !featureRun!.expectsFailure(job)) : failedJobs,
        // A database-only handler runs on the fast path by default.
        fastPath: options.fastPath || (options.databaseOnly ?? false),
        completedJobsKept: queueInPostgres,
        jobFinishedInEffect: queueInPostgres,
        ...(options.jobFaults ? { jobFaults: jobFaultsOf(load) } : {}),
      });
      return {
        options,
        names,
        schedule,
        events,
        load,
        check,
        drained,
        queueCounts,
        postgresRecoveries: postgres?.recoveries ?? 0,
        workerStarts: fleet.starts.length,
        history: { lines: fleet.lines, starts: fleet.starts, exits: fleet.exits },
        timings: { chaosMs, drainMs, totalMs: Date.now() - began },
        ...(options.jobFaults && postgres ? { serverErrorsOfFaults: countServerErrorsOfFaults(postgres.logTail(Number.MAX_SAFE_INTEGER)) } : {}),
        evidence: evidenceFor(check, rows, fleet.lines, fleet.exits, failedJobs, options.jobFaults ? jobFaultsOf(load) : undefined),
        unexpectedExits: unexpectedExits(fleet, events, stoppedAt),
        ...(keyFeature ? { keyFeature } : {}),
        ...(resent ? { resent } : {}),
        ...(reconciled ? { reconciled: { checked: reconciled.checked, vanished: reconciled.vanished.length, unfinished: reconciled.vanished.filter((v) => v.found === 'unfinished').length, reenqueued: reconciled.reenqueued } } : {}),
      };
    } finally {
      clearInterval(progress);
      interrupt.removeEventListener('abort', onInterrupt);
      stopProducer.abort();
      giveUp.abort();
      stopNemesis.abort();
      await Promise.allSettled([loadDone, nemesisDone]);
    }
  } finally {
    await featureRun?.close();
    await fleet?.killAll().catch(() => {});
    await bullQueue?.close().catch(() => {});
    await redisConnection?.close().catch(() => {});
    await db?.destroy().catch(() => {});
    // The private servers hold only this run's data; stopping them and deleting their
    // directories removes it all.
    await redis?.destroy().catch(() => {});
    await bouncer?.stop().catch(() => {});
    await patroni?.stop().catch(() => {});
    if (postgres && options.keepData) {
      log(`private postgres data kept in ${postgres.dataDir} (start it with: postgres -D ${postgres.dataDir} -p ${postgres.port} -k ${postgres.dir})`);
      await postgres.crash().catch(() => {});
    } else await postgres?.destroy().catch(() => {});
  }
}

/**
 * The private cluster's `max_connections`: every worker's pool and listener, twice over (a
 * killed worker's backends linger while its replacement connects; a frozen one keeps its own),
 * and the harness.
 */
function maxConnectionsFor(options: ChaosOptions): number {
  // With the queue in Postgres, each worker also holds BullMQ's pool (10) and its LISTEN connection.
  const queue = options.queueBackend === 'postgres' ? 11 : 0;
  return Math.max(100, options.workers * (options.concurrency + 2 + 4 + queue) * 2 + 20 + queue * 3);
}

/**
 * PgBouncer's server connections: half the jobs the workers run at once (at least 4), so that
 * the workers' transactions share and queue for them, as behind a pooler sized for the load.
 */
function pgBouncerPoolSizeFor(options: ChaosOptions): number {
  return Math.max(4, Math.ceil((options.workers * options.concurrency) / 2));
}

/** How long an empty queue must stay unchanged before a drain with keys missing ends. */
function settleMsFor(options: ChaosOptions): number {
  return Math.max(10_000, 3 * options.leaseMs);
}

/** Retries `read` for a while: a harness query may meet a connection a fault left broken. */
async function retrying<T>(read: () => Promise<T>, attempts = 20): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await read();
    } catch (error) {
      if (attempt >= attempts) throw error;
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
  }
}

/** Every job BullMQ holds as failed: whose key it was, and why it failed. */
async function readFailedJobs(queue: Queue): Promise<FailedJob[]> {
  const jobs = await queue.getJobs(['failed'], 0, -1);
  return jobs.filter(Boolean).map((job) => ({
    id: `${job.data?.scope}/${job.data?.idempotencyKey}`,
    jobId: String(job.id),
    attemptsMade: job.attemptsMade,
    reason: String(job.failedReason ?? ''),
  }));
}

/** Keys of the jobs still waiting, delayed or active in BullMQ (after a drain that timed out). */
async function pendingKeys(queue: Queue): Promise<Set<string>> {
  const jobs = await queue.getJobs(['wait', 'delayed', 'active', 'prioritized'], 0, -1);
  return new Set(jobs.filter(Boolean).map((job) => `${job.data?.scope}/${job.data?.idempotencyKey}`));
}

/** The completed keys, by `scope/key`. */
async function readCompletedKeys(db: Kysely<any>, schema: string): Promise<Set<string>> {
  const { rows } = await sql<{ scope: string; key: string }>`
    select scope, key from ${sql.id(schema, 'idempotency_keys')} where status = 'completed'`.execute(db);
  return new Set(rows.map((row) => `${row.scope}/${row.key}`));
}

/** Completed keys, those the janitor deleted and left a tombstone for included (the tombstone profile). */
async function countCompleted(db: Kysely<any>, schema: string): Promise<number> {
  const { rows } = await sql<{ n: string }>`
    select (select count(*) from ${sql.id(schema, 'idempotency_keys')} where status = 'completed')
         + (select count(*) from ${sql.id(schema, 'key_tombstones')} where not failed) as n`.execute(db);
  return Number(rows[0]!.n);
}

async function reportProgress(db: Kysely<any>, queue: Queue, schema: string, fleet: WorkerFleet, start: number, log: (line: string) => void) {
  // A count that could not be read (Postgres or Redis down at that moment) is shown as "?".
  const completed = await countCompleted(db, schema).catch(() => '?');
  const counts = await queue.getJobCounts('wait', 'delayed', 'active', 'failed').catch(() => undefined);
  const backlog = counts ? (counts.wait ?? 0) + (counts.delayed ?? 0) + (counts.active ?? 0) : '?';
  log(
    `  t+${Math.round((Date.now() - start) / 1000)} s: ${completed} keys completed, ${backlog} jobs queued, ${counts?.failed ?? '?'} failed; ` +
      `${fleet.starts.length} worker starts, ${fleet.exits.length} exits`,
  );
}

interface Rows {
  effects: ExecutionRow[];
  externalCalls: ExecutionRow[];
  keys: KeyRow[];
  /** The multi-step profile's database step writes and step records. */
  steps?: { effects: ExecutionRow[]; records: StepRecordRow[] };
}

/** The fault of each key that carries one, by `scope/key`. */
function jobFaultsOf(load: LoadResult): Map<string, JobFault> {
  const faults = new Map<string, JobFault>();
  for (const [id, produced] of load.keys) if (produced.payload.fault) faults.set(id, produced.payload.fault);
  return faults;
}

/** Milliseconds since the epoch with the microseconds as the fraction: steps are ordered finer than 1 ms. */
const EPOCH_MS = (column: string) => sql.raw(`extract(epoch from ${column}) * 1000`);

async function readRows(db: Kysely<any>, schema: string, steps: boolean): Promise<Rows> {
  const executions = async (table: string, withStep: boolean, withFastPath = false) => {
    const { rows } = await sql<{ scope: string; key: string; fence: string; worker_pid: number; at: string; step: string | null; fast_path: boolean }>`
      select scope, key, fence, worker_pid, ${EPOCH_MS('at')} as at, ${withStep ? sql.ref('step') : sql`null::text`} as step,
             ${withFastPath ? sql.ref('fast_path') : sql`false`} as fast_path
        from ${sql.id(schema, table)} order by id`.execute(db);
    return rows.map((r) => ({
      scope: r.scope,
      key: r.key,
      fence: Number(r.fence),
      workerPid: r.worker_pid,
      at: Number(r.at),
      ...(r.step !== null ? { step: r.step } : {}),
      ...(r.fast_path ? { fastPath: true } : {}),
    }));
  };
  // The database-only handler's rows: the transaction that committed each, and the settings it saw.
  const { rows: effectRows } = await sql<{
    scope: string; key: string; fence: string; worker_pid: number; at: string; txid: string; seen_tenant: string | null; seen_synchronous_commit: string | null;
  }>`
    select scope, key, fence, worker_pid, ${EPOCH_MS('at')} as at, txid, seen_tenant, seen_synchronous_commit
      from ${sql.id(schema, 'effects')} order by id`.execute(db);
  const effects: ExecutionRow[] = effectRows.map((r) => ({
    scope: r.scope,
    key: r.key,
    fence: Number(r.fence),
    workerPid: r.worker_pid,
    at: Number(r.at),
    txid: Number(r.txid),
    seenTenant: r.seen_tenant,
    seenSynchronousCommit: r.seen_synchronous_commit,
  }));
  const { rows: keyRows } = await sql<{ scope: string; key: string; status: string; fence: string; error: unknown }>`
    select scope, key, status, fence, error from ${sql.id(schema, 'idempotency_keys')}`.execute(db);
  const rows: Rows = {
    effects,
    externalCalls: await executions('external_calls', true, true),
    keys: keyRows.map((r) => ({ scope: r.scope, key: r.key, status: r.status, fence: Number(r.fence), ...(r.error !== null ? { error: r.error } : {}) })),
  };
  if (!steps) return rows;
  const { rows: records } = await sql<{ scope: string; key: string; name: string; position: number; fence: string; starts: number; recorded_at: string | null }>`
    select scope, key, name, position, fence, starts, ${EPOCH_MS('recorded_at')} as recorded_at
      from ${sql.id(schema, 'job_steps')}`.execute(db);
  return {
    ...rows,
    steps: {
      effects: await executions('step_effects', true),
      records: records.map((r) => ({
        scope: r.scope,
        key: r.key,
        name: r.name,
        position: r.position,
        fence: Number(r.fence),
        starts: r.starts,
        recordedAt: r.recorded_at === null ? null : Number(r.recorded_at),
      })),
    },
  };
}

/**
 * Deaths before the stop that the nemesis did not cause: a worker that crashed by itself. A
 * worker that exits at start because a server was down is not one (the fleet starts it again).
 */
function unexpectedExits(fleet: WorkerFleet, events: readonly NemesisEvent[], stoppedAt: number) {
  const killed = new Set(events.filter((e) => e.kind === 'kill' && e.pid !== undefined).map((e) => e.pid));
  const crashed = new Set(fleet.lines.filter((l) => l.msg === FAULT_LOG_MESSAGE).map((l) => l.pid));
  return fleet.exits
    .filter((exit) => exit.at < stoppedAt && !exit.beforeReady && !killed.has(exit.pid) && !crashed.has(exit.pid))
    .map((exit) => ({ ...exit, stderr: fleet.stderrOf(exit.pid).slice(-2_000) }));
}

/** The full history of up to 20 keys that failed a check, and the deaths around them. */
function evidenceFor(
  check: CheckResult,
  rows: Rows,
  lines: readonly WorkerLogLine[],
  exits: readonly WorkerExit[],
  failedJobs: readonly FailedJob[],
  jobFaults: ReadonlyMap<string, JobFault> | undefined,
): Record<string, unknown> {
  const bad = [
    ...check.lost,
    ...check.unfinished.slice(0, 5),
    ...check.failedJobs.slice(0, 5).map((job) => job.id),
    ...check.leftProcessing.slice(0, 5),
    ...check.duplicated,
    ...check.unexpected,
    ...check.committedOverlaps,
    ...check.fenceMismatches,
    ...check.repeatedWithinLease.map((id) => id.split('#')[0]!),
    ...(check.redeliveredCommittedJobs ?? []).slice(0, 5),
    ...(check.steps
      ? [...check.steps.databaseNotOnce, ...check.steps.calledAfterRecord, ...check.steps.uncountedCalls, ...check.steps.outOfOrder].map((id) => id.slice(0, id.lastIndexOf(':')))
      : []),
    ...(check.jobFaults
      ? [
          ...check.jobFaults.innocentFailures,
          ...check.jobFaults.poisonNotFailed,
          ...check.jobFaults.settingsSeenAcross,
          ...check.jobFaults.stateFaultsGrouped,
          ...check.jobFaults.faultsNotSeen,
          ...check.jobFaults.poisonFailedOtherwise.slice(0, 5),
        ]
      : []),
  ];
  const evidence: Record<string, unknown> = {};
  for (const id of [...new Set(bad)].slice(0, 20)) {
    const match = (row: { scope?: string; key?: string }) => `${row.scope}/${row.key}` === id;
    const keyLines = lines.filter(match);
    const pids = new Set(keyLines.map((l) => l.pid));
    evidence[id] = {
      ...(jobFaults ? { jobFault: jobFaults.get(id) ?? null } : {}),
      key: rows.keys.find(match),
      effects: rows.effects.filter(match),
      externalCalls: rows.externalCalls.filter(match),
      ...(rows.steps ? { stepEffects: rows.steps.effects.filter(match), stepRecords: rows.steps.records.filter(match) } : {}),
      failedJobs: failedJobs.filter((job) => job.id === id),
      lines: keyLines,
      exitsOfItsWorkers: exits.filter((e) => pids.has(e.pid)),
    };
  }
  return evidence;
}
