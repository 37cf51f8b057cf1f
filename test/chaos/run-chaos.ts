/**
 * The chaos suite's command:
 *
 *   npm run chaos                                                  # short profile (~2 min, CI)
 *   npm run chaos -- --profile long                                # long profile (about 2 hours; docs/chaos.md)
 *   npm run chaos -- --seed 1234                                   # the same fault schedule again
 *   npm run chaos -- --steps                                       # multi-step jobs (ctx.step), crashes inside and between steps
 *   npm run chaos -- --database-only                               # the { transaction } handler form with its defaults
 *   npm run chaos -- --database-only --job-faults                  # ... with jobs that fail or change settings on their own
 *   npm run chaos -- --redis-cluster                               # on a private Redis Cluster, with failovers of the queue's shard
 *   npm run chaos -- --redis-sentinel                              # on a private Redis Sentinel set-up, with master failovers and crashes, then re-sends around them
 *   npm run chaos -- --patroni                                     # on a private Patroni cluster (synchronous standby, HAProxy): failovers
 *   npm run chaos -- --patroni --async-replication                 # ... with asynchronous replication: counts what a failover loses
 *   npm run chaos -- --patroni --async-replication --reconcile     # ... and what the reconciler brings back
 *   npm run chaos -- --queue-backend postgres                      # the queue in Postgres (BullMQ's PostgreSQL backend), no Redis
 *   npm run chaos -- --broker nats                                 # NATS JetStream consumers (run-nats-chaos.ts)
 *   npm run chaos -- --tombstones                                  # duplicates of keys past retention, their tombstones live
 *   npm run chaos -- --concurrency-limits                          # per-key concurrency limits under kills and pauses
 *   npm run chaos -- --coalescing                                  # bursts of coalescing keys, skewed clocks, store faults at the hand-over
 *   npm run chaos -- --racing-schedulers                           # schedulers with wrong clocks killed and restarted while ticking
 *   npm run chaos -- --dst-schedulers                              # racing schedulers whose database clock goes through DST changes
 *
 * Exits 0 when nothing was lost, duplicated, unexpected, failed or left processing and no two
 * overlapping owners both committed; 1 when a check failed; 2 on bad flags or when the run
 * could not be carried out; 130 when interrupted.
 */
import { randomInt } from 'node:crypto';
import { parseArgs } from 'node:util';
import { runChaos, type ChaosOptions } from './harness.js';
import { parseFaultPoints } from './fault-injection.js';
import { formatTable, summarize, writeHistory, writeJsonReport } from './report.js';
import { KEY_FEATURES, type KeyFeature, type KeyFeatureCheck } from './key-feature-checks.js';
import { CONCURRENCY_PROFILE, SCHEDULE_PROFILE, TOMBSTONE_PROFILE } from './key-features.js';
import { DST_PROFILE } from './dst-schedules.js';

/** Defaults of each profile; any flag overrides its own. */
const PROFILES = {
  short: { jobs: 3_000, minutes: 1.5, workers: 3, concurrency: 4, faultIntervalMs: 3_000, maxWorkMs: 250, drainMinutes: 1.5, progressSeconds: 10 },
  long: { jobs: 1_050_000, minutes: 90, workers: 4, concurrency: 32, faultIntervalMs: 10_000, maxWorkMs: 10, drainMinutes: 20, progressSeconds: 60 },
} as const;
type Profile = keyof typeof PROFILES;

/** The Patroni profile's mean time between faults: a failover and its rejoin take seconds each. */
const PATRONI_FAULT_INTERVAL_MS = 6_000;

const USAGE = `Usage: npm run chaos -- [flags]
  --profile P            short (default: CI's, about 2 minutes) or long (at least 1,000,000
                         acknowledged jobs, a ${PROFILES.long.minutes}-minute chaos phase; see docs/chaos.md); the flags below
                         override its defaults, shown as short / long
  --seed N               seed of the fault schedule and the producer (default: random, printed)
  --jobs N               enqueue requests, duplicates included (${PROFILES.short.jobs} / ${PROFILES.long.jobs})
  --minutes M            length of the chaos phase, decimals allowed (${PROFILES.short.minutes} / ${PROFILES.long.minutes})
  --workers K            worker processes (${PROFILES.short.workers} / ${PROFILES.long.workers})
  --concurrency C        jobs at once per worker (${PROFILES.short.concurrency} / ${PROFILES.long.concurrency})
  --duplicates P         percent of requests that repeat a key (default 20)
  --lease-ms MS          lease, BullMQ lock duration follows it (default 3000)
  --fault-interval-ms MS mean time between faults (${PROFILES.short.faultIntervalMs} / ${PROFILES.long.faultIntervalMs})
  --max-work-ms MS       longest simulated work per job (${PROFILES.short.maxWorkMs} / ${PROFILES.long.maxWorkMs})
  --fault-points SPEC    extra random crashes, e.g. after-claim:0.001,before-commit:0.001 (default none)
  --drain-minutes M      how long the system may take to finish after the faults stop (${PROFILES.short.drainMinutes} / ${PROFILES.long.drainMinutes})
  --progress-seconds S   how often a progress line is printed (${PROFILES.short.progressSeconds} / ${PROFILES.long.progressSeconds})
  --report-dir DIR       where report-<seed>.json goes (default .chaos)
  --fast-path            workers use the single-transaction fast path (FAST_PATH=true)
  --group-commit         workers share transactions between concurrent jobs (GROUP_COMMIT=true)
  --drizzle              the chaos handler writes its effect with Drizzle over node-postgres, in
                         Drizzle's own transaction on a pool of its own (ctx.transaction(
                         drizzleDataLayer(db), fn)); leased, like the default profile
  --database-only        workers run a database-only handler ({ transaction }: the work and the
                         effect in one transaction, no external call) with FAST_PATH and
                         GROUP_COMMIT unset, so its defaults run: the fast path with group commit
                         (not with --fast-path, --group-commit or --steps)
  --job-faults           with --database-only: 10% of keys (chosen by the seed, the same for every
                         add of a key) carry a fault of the job's own, sent in its transaction:
                         failing ones (a syntax error, a NUL in a parameter, a deferred foreign key
                         broken at COMMIT, a COMMIT of its own) and state changes (SET LOCAL
                         synchronous_commit, set_config of app.tenant, the same inside a PL/pgSQL
                         function); the checker adds: no job without a failing fault fails, every
                         job with one fails and commits nothing, no job sees another's setting
  --steps                multi-step jobs: a database step, an external step, a database step,
                         then the completion; crashes also inside and between steps, and the
                         checker adds the step checks (not with --fast-path, which refuses steps)
  --pgbouncer            workers reach Postgres through a PgBouncer in transaction mode in front of
                         the private cluster (DATABASE_URL), and Postgres itself for sessions
                         (DATABASE_DIRECT_URL: migrations, maintenance locks)
  --redis-cluster        a private Redis Cluster (3 masters with a replica each, ports 7100-7199 or
                         REDIS_CLUSTER_PORTS) instead of one redis-server, the prefix hash-tagged; Redis
                         faults aim at the queue's shard: connections cut on every node, its master
                         crashed and restarted from its AOF, coordinated failovers to its replica
  --redis-sentinel       Redis is a private Sentinel set-up (a master, a replica, three sentinels);
                         every process finds the master through REDIS_SENTINELS; Redis faults add
                         SENTINEL FAILOVER, and a restart is a crash of the master (the replica
                         promoted, the old master rejoining). Neither waits for the replica: adds
                         acknowledged just before can be lost. After the drain the producer sends
                         again, with the same key, every key acknowledged from 10 s before a change
                         of master to 5 s after it was over, and the system drains once more; the
                         report counts the adds lost and the keys sent again
  --patroni              Postgres is a private Patroni cluster (etcd, a leader and a synchronous
                         standby, HAProxy routing to the leader; Debian's patroni, etcd-server,
                         haproxy); the Postgres faults are the cluster's: the leader's Postgres
                         killed, the leader member crashed (failover after the lock's TTL, the old
                         leader rejoining), switchover, manual failover, each waited out until the
                         cluster is healthy, alternating with worker kills, cut connections and
                         crashes around the commit (fault interval default ${PATRONI_FAULT_INTERVAL_MS} ms)
  --async-replication    with --patroni: asynchronous replication (no synchronous standby), to
                         measure what a failover loses; the run is expected to FAIL with lost keys
  --reconcile            after the drain, run the VanishedKeyReconciler (re-sends completed jobs
                         whose key a failover lost) and drain again before the check
  --queue-backend B      redis (default) or postgres: the queue in the private Postgres (BullMQ's
                         PostgreSQL backend, no Redis: the Redis faults drop out, the Postgres ones
                         hit the queue too); completed jobs are kept, and the checker fails the run
                         on a job delivered again after its effect committed
  --tombstones           key feature: RETENTION_MS ${TOMBSTONE_PROFILE.retentionMs} on the workers, a janitor (a maintenance
                         process) leaving tombstones for an hour; duplicates of keys whose row is
                         gone are sent again, with their own payload and with another; the
                         checker adds: none runs again, the first kind is acknowledged, the second
                         refused as KEY_REUSED
  --concurrency-limits   key feature: every job names one of ${CONCURRENCY_PROFILE.groups} concurrency keys, limit ${CONCURRENCY_PROFILE.limit},
                         and the in-all key "${CONCURRENCY_PROFILE.inAll.key}", limit ${CONCURRENCY_PROFILE.inAll.limit}
                         (CONCURRENCY_STARVATION_MS ${CONCURRENCY_PROFILE.starvationMs}); the checker adds: never more runs of
                         a key in flight than its limit, no key deferring jobs with a free slot for
                         longer than twice the starvation bound + 2 leases + 2 s, no slot left held
                         after the drain
  --coalescing           key feature: bursts of adds of coalescing keys (versions 1, 2, …, the last
                         one 0.5-1.5 s after the others) while a run is in flight, stamped by
                         producer clocks minutes off both ways, with store faults at the hand-over;
                         the checker adds: each generation committed once, no payload run twice,
                         runs of a key one after another, the newest payload sent ran last, never
                         a replaced payload run
  --racing-schedulers    key feature: a ${SCHEDULE_PROFILE.everyMs / 1000}-second schedule (missed: all) on the run's queue, ticked by
                         ${SCHEDULE_PROFILE.schedulers} maintenance processes killed and restarted at seeded times, their
                         wall clocks (and two workers') off by seeded offsets, duplicates of ticks sent;
                         the checker adds: each tick's effect once, no tick missed up to the cursor,
                         none seen by the database before its time
  --dst-schedulers       key feature: ${DST_PROFILE.schedules.length} cron schedules in Paris, London and Helsinki (fixed times in
                         the changed hour, daily, hourly, quarter-hourly, seconds), ticked by ${DST_PROFILE.schedulers}
                         maintenance processes killed and restarted, whose database clock (a
                         session now() of their own) runs through Europe's fall-back of 2026, then
                         its spring-forward of 2027, each in half the chaos phase; the checker adds:
                         every tick of the reference model committed once, none else, a daily
                         fixed time once per local day, none seen before its time on that clock
                         (one key feature a run; with the default handler and the queue in Redis)
  --keep-data            keep the private Postgres cluster's directory for investigation
  --help

Postgres and Redis are private to the run (initdb into a temporary directory, redis-server on a
spare port): the servers on DATABASE_URL and REDIS_URL are not used. PG_BINDIR names the
directory of initdb and postgres when they are not found; REDIS_SERVER the redis-server binary.`;

class UsageError extends Error {}

function parseOptions(argv: string[]): (ChaosOptions & { reportDir: string; profile: Profile }) | undefined {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      profile: { type: 'string' },
      seed: { type: 'string' },
      jobs: { type: 'string' },
      minutes: { type: 'string' },
      workers: { type: 'string' },
      concurrency: { type: 'string' },
      duplicates: { type: 'string' },
      'lease-ms': { type: 'string' },
      'fault-interval-ms': { type: 'string' },
      'max-work-ms': { type: 'string' },
      'fault-points': { type: 'string' },
      'drain-minutes': { type: 'string' },
      'progress-seconds': { type: 'string' },
      'report-dir': { type: 'string' },
      'keep-data': { type: 'boolean' },
      'fast-path': { type: 'boolean' },
      'group-commit': { type: 'boolean' },
      drizzle: { type: 'boolean' },
      'database-only': { type: 'boolean' },
      'job-faults': { type: 'boolean' },
      steps: { type: 'boolean' },
      pgbouncer: { type: 'boolean' },
      'redis-cluster': { type: 'boolean' },
      'redis-sentinel': { type: 'boolean' },
      patroni: { type: 'boolean' },
      'async-replication': { type: 'boolean' },
      reconcile: { type: 'boolean' },
      tombstones: { type: 'boolean' },
      'concurrency-limits': { type: 'boolean' },
      coalescing: { type: 'boolean' },
      'racing-schedulers': { type: 'boolean' },
      'dst-schedulers': { type: 'boolean' },
      'queue-backend': { type: 'string' },
      help: { type: 'boolean' },
    },
  });
  if (values.help) return undefined;
  const profile = values.profile ?? 'short';
  if (!(profile in PROFILES)) throw new UsageError(`--profile: expected short or long, got "${profile}"`);
  const defaults = PROFILES[profile as Profile];
  const number = (flag: keyof typeof values, fallback: number, min: number, max: number, integer = true) => {
    const raw = values[flag];
    if (raw === undefined) return fallback;
    const value = Number(raw);
    if (typeof raw !== 'string' || raw.trim() === '' || !Number.isFinite(value) || (integer && !Number.isInteger(value)) || value < min || value > max) {
      throw new UsageError(`--${flag}: expected ${integer ? 'an integer' : 'a number'} from ${min} to ${max}, got "${String(raw)}"`);
    }
    return value;
  };
  if (values['redis-sentinel'] && values['redis-cluster']) throw new UsageError('--redis-sentinel: not with --redis-cluster (Redis is one or the other)');
  if (values['async-replication'] && !values.patroni) throw new UsageError('--async-replication: add --patroni (it sets the Patroni cluster\'s replication)');
  const faultPoints = values['fault-points'] ?? '';
  try {
    parseFaultPoints(faultPoints);
  } catch (error) {
    throw new UsageError(`--fault-points: ${(error as Error).message}`);
  }
  const leaseMs = number('lease-ms', 3_000, 500, 60_000);
  if (values.steps && values['fast-path']) throw new UsageError('--steps: the fast path refuses steps (the whole handler is one transaction there); drop --fast-path');
  for (const flag of ['fast-path', 'group-commit', 'steps'] as const) {
    if (values['database-only'] && values[flag]) {
      throw new UsageError(`--database-only: it runs the database-only handler's defaults (FAST_PATH and GROUP_COMMIT unset, no steps); drop --${flag}`);
    }
  }
  const queueBackend = values['queue-backend'] ?? 'redis';
  if (queueBackend !== 'redis' && queueBackend !== 'postgres') throw new UsageError(`--queue-backend: expected redis or postgres, got "${queueBackend}"`);
  if (queueBackend === 'postgres' && (values['redis-cluster'] || values['redis-sentinel'])) throw new UsageError('--queue-backend postgres: there is no Redis then; drop --redis-cluster and --redis-sentinel');
  if (queueBackend === 'postgres' && values.reconcile) throw new UsageError('--reconcile reads the completed jobs BullMQ keeps in Redis; drop it with --queue-backend postgres');
  const keyFeatures = KEY_FEATURES.filter((feature) => values[feature]);
  if (keyFeatures.length > 1) throw new UsageError(`--${keyFeatures[0]}: one key feature a run; drop --${keyFeatures.slice(1).join(' and --')}`);
  const keyFeature: KeyFeature | undefined = keyFeatures[0];
  if (keyFeature) {
    for (const flag of ['steps', 'database-only', 'drizzle'] as const) {
      if (values[flag]) throw new UsageError(`--${keyFeature}: the key features run the default handler (its effect rows record what they check); drop --${flag}`);
    }
    if (queueBackend === 'postgres') throw new UsageError(`--${keyFeature}: the key features run with the queue in Redis; drop --queue-backend postgres`);
  }
  if (values['job-faults'] && !values['database-only']) {
    throw new UsageError('--job-faults: add --database-only (the faults are sent by the database-only handler, run with its defaults)');
  }
  return {
    profile: profile as Profile,
    seed: number('seed', randomInt(1, 2 ** 31 - 1), 0, 2 ** 31 - 1),
    jobs: number('jobs', defaults.jobs, 1, 10_000_000),
    durationMs: Math.round(number('minutes', defaults.minutes, 0.1, 24 * 60, false) * 60_000),
    workers: number('workers', defaults.workers, 1, 64),
    concurrency: number('concurrency', defaults.concurrency, 1, 256),
    duplicateRatio: number('duplicates', 20, 0, 90) / 100,
    leaseMs,
    faultIntervalMs: number('fault-interval-ms', values.patroni ? PATRONI_FAULT_INTERVAL_MS : defaults.faultIntervalMs, 100, 3_600_000),
    maxWorkMs: number('max-work-ms', Math.min(defaults.maxWorkMs, leaseMs), 0, leaseMs),
    faultPoints,
    drainTimeoutMs: Math.round(number('drain-minutes', defaults.drainMinutes, 0.1, 24 * 60, false) * 60_000),
    progressIntervalMs: number('progress-seconds', defaults.progressSeconds, 1, 3_600) * 1_000,
    keepData: values['keep-data'] ?? false,
    fastPath: values['fast-path'] ?? false,
    groupCommit: values['group-commit'] ?? false,
    steps: values.steps ?? false,
    databaseOnly: values['database-only'] ?? false,
    drizzle: values.drizzle ?? false,
    jobFaults: values['job-faults'] ?? false,
    pgBouncer: values.pgbouncer ?? false,
    redisCluster: values['redis-cluster'] ?? false,
    redisSentinel: values['redis-sentinel'] ?? false,
    reconcile: values.reconcile ?? false,
    ...(values.patroni ? { patroni: values['async-replication'] ? ('asynchronous' as const) : ('synchronous' as const) } : {}),
    queueBackend,
    ...(keyFeature ? { keyFeature } : {}),
    reportDir: values['report-dir'] ?? '.chaos',
    log: (line) => console.log(`[chaos] ${new Date().toISOString().slice(11, 19)} ${line}`),
  };
}

async function main(argv: string[]): Promise<number> {
  let options;
  try {
    options = parseOptions(argv);
  } catch (error) {
    console.error(`${(error as Error).message}\n\n${USAGE}`);
    return 2;
  }
  if (!options) {
    console.log(USAGE);
    return 0;
  }
  const interrupt = new AbortController();
  let signals = 0;
  const onSignal = (signal: NodeJS.Signals) => {
    if (++signals > 1) process.exit(130);
    console.error(`[chaos] ${signal}: stopping and cleaning up (again to exit at once)`);
    interrupt.abort();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  options.log(
    `${options.profile} profile${options.drizzle ? ' with the Drizzle data layer' : ''}${options.steps ? ' with steps' : ''}${options.databaseOnly ? ` with the database-only handler${options.jobFaults ? ' and job faults' : ''}` : ''}${options.redisCluster ? ' on Redis Cluster' : ''}${options.redisSentinel ? ' on Redis Sentinel' : ''}${options.patroni ? ` on Patroni (${options.patroni} replication)` : ''}${options.queueBackend === 'postgres' ? ' with the queue in Postgres' : ''}${options.keyFeature ? `, key feature ${options.keyFeature}` : ''}, seed ${options.seed} (reproduce with --seed ${options.seed}); ${options.jobs} jobs, ${options.workers} workers × ${options.concurrency}; ` +
      `at most ${Math.round((options.durationMs + options.drainTimeoutMs) / 60_000)} minutes of chaos and drain`,
  );
  let run;
  try {
    run = await runChaos(options, interrupt.signal);
  } catch (error) {
    console.error(`[chaos] the run could not be carried out: ${(error as Error).stack ?? String(error)}`);
    return interrupt.signal.aborted ? 130 : 2;
  }
  const summary = summarize(run);
  const path = writeJsonReport(run, summary, options.reportDir);
  console.log(`\n${formatTable(summary)}\n`);
  console.log(`[chaos] report: ${path}; history: ${writeHistory(run, options.reportDir)}`);
  if (summary.verdict === 'FAIL') {
    console.error(`[chaos] FAILED (seed ${summary.seed}): the history of each failing key is under "evidence" in ${path}`);
    printEvidence(run.evidence);
    if (run.keyFeature) printKeyFeatureFailures(run.keyFeature);
    return 1;
  }
  return 0;
}

/**
 * The first failing keys' evidence on standard error, shortened: where only the console is kept
 * (a CI log), it still says what failed and how.
 */
function printEvidence(evidence: Readonly<Record<string, unknown>> | undefined): void {
  for (const [id, history] of Object.entries(evidence ?? {}).slice(0, 3)) {
    const text = JSON.stringify(history);
    console.error(`[chaos] evidence of ${id}: ${text.length > 6000 ? `${text.slice(0, 6000)}… (${text.length} characters)` : text}`);
  }
}

/** A key-feature profile's broken rules on standard error, the first failures of each. */
function printKeyFeatureFailures(check: KeyFeatureCheck): void {
  for (const { rule, failing } of check.rules) {
    if (failing.length > 0) console.error(`[chaos] ${check.feature}: ${rule}: ${failing.length}, e.g. ${failing.slice(0, 5).join('; ')}`);
  }
}

/** `--broker amqp|nats`: the same checker against RabbitMQ (amqp-chaos.ts) or JetStream consumers (run-nats-chaos.ts). Default: BullMQ. */
async function mainForBroker(argv: string[]): Promise<number> {
  const at = argv.findIndex((arg) => arg === '--broker' || arg.startsWith('--broker='));
  const broker = at < 0 ? 'bullmq' : argv[at]!.includes('=') ? argv[at]!.split('=')[1] : argv[at + 1];
  const withoutBroker = at < 0 ? argv : argv.filter((_, i) => i !== at && (argv[at]!.includes('=') || i !== at + 1));
  if (broker === 'amqp') return (await import('./amqp-chaos.js')).runAmqpChaos(argv);
  if (broker === 'nats') return (await import('./run-nats-chaos.js')).runNatsChaosCommand(withoutBroker);
  if (broker !== 'bullmq') {
    console.error(`--broker: expected bullmq, amqp or nats, got "${broker}"`);
    return 2;
  }
  return main(withoutBroker);
}

process.exitCode = await mainForBroker(process.argv.slice(2));
