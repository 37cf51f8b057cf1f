import { z } from 'zod';
import { ConfigError } from '../errors.js';
import { GROUP_COMMIT_DEFAULTS } from '../protocol/group-commit.js';
import { DEFAULT_MAX_JOB_RETENTION_MS, DEFAULT_MAX_JOB_TOMBSTONE_MS, MAX_RETENTION_CEILING_MS } from '../protocol/key-retention.js';
import type { IdempotencyGroupCommitOptions } from '../protocol/idempotency-options.js';
import { assertClusterHashTag, parseClusterNodes } from '../bullmq/redis-cluster.js';
import type { RedisConnectionSettings } from '../bullmq/redis-connection.js';
import { parseQueueRetryPolicies } from '../ops/maintenance-options.js';

const int = (min: number) => z.coerce.number().int().min(min);
const bool = z
  .enum(['true', 'false', '1', '0', 'yes', 'no'])
  .transform((v) => v === 'true' || v === '1' || v === 'yes');

/**
 * Environment variables read by the runnable processes. Each is documented in
 * docs/configuration.md (test/configuration-doc.test.ts checks that every one is there, with
 * its default); names and defaults here are the source of truth.
 */
/**
 * A Postgres connection URL: `postgres://` or `postgresql://`. Another scheme (`mysql://`, a
 * copied `DATABASE_URL` of another service) is refused at start instead of failing later as an
 * unreachable or misread server.
 */
const postgresUrl = z
  .string()
  .url('must be a postgres:// URL')
  .refine((url) => /^postgres(ql)?:\/\//i.test(url), {
    message: 'must be a postgres:// (or postgresql://) URL: the keys are kept in Postgres only (MySQL and other databases are not supported)',
  });

const envSchema = z.object({
  /** Postgres (may be a transaction-mode pooler: see DATABASE_DIRECT_URL). @defaultValue `postgres://postgres@127.0.0.1:5432/postgres` */
  DATABASE_URL: postgresUrl.default('postgres://postgres@127.0.0.1:5432/postgres'),
  /**
   * Postgres itself, for what needs a session of its own: migrations' and maintenance's advisory
   * locks, the listener's LISTEN. Set it when DATABASE_URL is a transaction-mode pooler
   * (PgBouncer).
   * @defaultValue DATABASE_URL
   */
  DATABASE_DIRECT_URL: postgresUrl.optional(),
  /**
   * Where BullMQ keeps the queues: `redis` (REDIS_URL, REDIS_PREFIX) or `postgres` (BullMQ's
   * PostgreSQL backend, in QUEUE_SCHEMA of the database at DATABASE_DIRECT_URL, else
   * DATABASE_URL).
   * @defaultValue `redis`
   */
  QUEUE_BACKEND: z.enum(['redis', 'postgres']).default('redis'),
  /** With QUEUE_BACKEND=postgres: the schema BullMQ keeps the jobs in (created by BullMQ's migrations). @defaultValue `bullmq` */
  QUEUE_SCHEMA: z.string().regex(/^[a-z_][a-z0-9_]{0,62}$/, 'must be a lower-case Postgres identifier').default('bullmq'),
  /** Redis for BullMQ. @defaultValue `redis://127.0.0.1:6379` */
  REDIS_URL: z.string().url('must be a redis:// URL').default('redis://127.0.0.1:6379'),
  /** Postgres schema of the keys and outbox tables. @defaultValue `idempotent_jobs` */
  SCHEMA: z.string().regex(/^[a-z_][a-z0-9_]{0,62}$/, 'must be a lower-case Postgres identifier').default('idempotent_jobs'),
  /**
   * Redis Cluster startup nodes (`host:port` or `redis://[user:password@]host:port`, separated
   * by commas); when set, REDIS_URL is not used and REDIS_PREFIX must contain a hash tag (`{ij}`).
   * @defaultValue unset (one server, REDIS_URL)
   */
  REDIS_CLUSTER_NODES: z.string().optional(),
  /**
   * Redis Sentinel addresses (`host:port` or `redis://[user:password@]host:port` for the
   * sentinels' own credentials, separated by commas): the master is the one they name
   * REDIS_SENTINEL_MASTER, and follows their failovers. REDIS_URL then gives only the master's
   * password and database. Not with REDIS_CLUSTER_NODES.
   * @defaultValue unset (REDIS_URL is the server)
   */
  REDIS_SENTINELS: z.string().optional(),
  /** The master's name in the sentinels' configuration (`sentinel monitor <name> …`). @defaultValue `mymaster` */
  REDIS_SENTINEL_MASTER: z.string().min(1).default('mymaster'),
  /** BullMQ key prefix (on Redis Cluster it must contain a hash tag, e.g. `{ij}`). @defaultValue `bull` */
  REDIS_PREFIX: z.string().min(1).default('bull'),
  /** Queue name. @defaultValue `payments` */
  QUEUE: z.string().min(1).default('payments'),
  /** Jobs at once per worker process. @defaultValue `8` */
  CONCURRENCY: int(1).default(8),
  /** Lease per claim; longer than the slowest handler's run between heartbeats. @defaultValue `30000` */
  LEASE_MS: int(100).default(30_000),
  /** Lease extension period (at most half the lease). @defaultValue LEASE_MS / 3 */
  HEARTBEAT_MS: int(10).optional(),
  /** BullMQ `lockDuration`. @defaultValue LEASE_MS */
  LOCK_DURATION_MS: int(100).optional(),
  /** BullMQ `stalledInterval` (at most the lock duration). @defaultValue LEASE_MS / 2, at least 1 s */
  STALLED_INTERVAL_MS: int(100).optional(),
  /** Longest deferral of a duplicate while its key is held. @defaultValue `2000` */
  DEFER_MAX_MS: int(1).optional(),
  /** A job deferred this long by its concurrency limit goes before the group's jobs that waited less. @defaultValue `30000` */
  CONCURRENCY_STARVATION_MS: int(1).optional(),
  /** How long a kept concurrency slot is lent to the next fast-path job of its key; `0`: none kept. @defaultValue `1000` */
  CONCURRENCY_SLOT_REUSE_MS: int(0).optional(),
  /** Before deferring a duplicate, wait this long for the owner to finish (LISTEN/NOTIFY) and replay. @defaultValue `0` */
  WAIT_MS: int(0).default(0),
  /** On SIGTERM, how long active jobs may finish before their keys are released. @defaultValue `30000` */
  SHUTDOWN_TIMEOUT_MS: int(0).default(30_000),
  /** How long a starting process waits for Postgres and Redis (refused, starting up) before it exits with an error. @defaultValue `60000` */
  STARTUP_WAIT_MS: int(0).default(60_000),
  /** First deferral of a job after a transient store fault (Postgres restarting, say), using no attempt; doubles per deferral. @defaultValue `250` */
  STORE_RETRY_MIN_MS: int(1).optional(),
  /** Longest such deferral, before jitter. @defaultValue `15000` */
  STORE_RETRY_MAX_MS: int(1).optional(),
  /** How long a key's store faults in a row are deferred without using an attempt; past it, each counts as one. @defaultValue `3600000` */
  STORE_RETRY_WINDOW_MS: int(1).optional(),
  /** How long completed and failed keys are kept, and replayed. @defaultValue `86400000` (24 h) */
  RETENTION_MS: int(1).default(86_400_000),
  /**
   * Longest result retention a job may ask for its own key (`retention.resultMs`); a job asking
   * for more gets this, with a warning in its log. At most 100 years.
   * @defaultValue `2592000000` (30 days)
   */
  MAX_JOB_RETENTION_MS: int(1).max(MAX_RETENTION_CEILING_MS).default(DEFAULT_MAX_JOB_RETENTION_MS),
  /**
   * Longest tombstone window a job may ask for its own key (`retention.tombstoneMs`); a job asking
   * for more gets this, with a warning in its log. At most 100 years.
   * @defaultValue `31536000000` (365 days)
   */
  MAX_JOB_TOMBSTONE_MS: int(0).max(MAX_RETENTION_CEILING_MS).default(DEFAULT_MAX_JOB_TOMBSTONE_MS),
  /**
   * The single-transaction fast path. Unset: on for a database-only handler (`{ transaction }`),
   * off for a function handler; `true` or `false`: for both.
   * @defaultValue unset
   */
  FAST_PATH: bool.optional(),
  /**
   * Group commit: concurrent jobs' effects share transactions (see IdempotencyOptions.groupCommit).
   * Unset: a database-only handler's transactions and a function handler's `ctx.transaction`
   * callbacks (which may run more than once, one run committing); `true`: every effect, those
   * run through `IdempotencyKeys` directly too; `false`: none.
   * @defaultValue unset
   */
  GROUP_COMMIT: bool.optional(),
  /** Most jobs in one group transaction (1-63): a failed group's jobs all run again. @defaultValue `32` */
  GROUP_COMMIT_MAX_JOBS: int(1).max(63).default(GROUP_COMMIT_DEFAULTS.maxJobs),
  /** Group transactions open at once, each on its own connection. @defaultValue `2` */
  GROUP_COMMIT_GROUPS: int(1).max(64).default(GROUP_COMMIT_DEFAULTS.maxGroups),
  /**
   * Custom settings a group watches besides the built-in ones, those declared for the database
   * or role and those the database's functions and policies name by a literal, comma-separated
   * (`app.tenant,app.user_id`): name those your handlers' functions set under a name they
   * compute (`set_config(v_name, …)`).
   * @defaultValue unset (none)
   */
  GROUP_COMMIT_WATCH_SETTINGS: z
    .string()
    .regex(/^\s*[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$.]*(\s*,\s*[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$.]*)*\s*$/, 'must be custom setting names like app.tenant, separated by commas')
    .optional(),
  /**
   * Longest a job's callback may hold its group open, in ms (1-3600000): past it, the group goes
   * on without it and it runs alone. @defaultValue `1000`
   */
  GROUP_COMMIT_SLOW_JOB_MS: int(1).max(3_600_000).default(GROUP_COMMIT_DEFAULTS.slowJobMs),
  /** Keep payloads on keys, which lets the sweeper re-enqueue lost jobs. @defaultValue `false` */
  STORE_PAYLOAD: bool.default(false),
  /** Postgres pool size per process. @defaultValue CONCURRENCY + 2 */
  PG_POOL_SIZE: int(1).optional(),
  /**
   * Send the store's hot statements over DATABASE_URL as named prepared statements (parsed once
   * per connection). Off behind a pooler that keeps no prepared statements (PgBouncer before
   * 1.21, or without `max_prepared_statements`).
   * @defaultValue `true`, unless DATABASE_DIRECT_URL names another server than DATABASE_URL (a pooler)
   */
  PG_PREPARED_STATEMENTS: bool.optional(),
  /** Port of /metrics and /healthz; 0 picks a free port. @defaultValue unset (no metrics server) */
  METRICS_PORT: int(0).max(65_535).optional(),
  /** pino log level. @defaultValue `info` */
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  /**
   * Hash partitions of the keys table the migrations create (0: one plain table). Against an
   * existing table it must match its layout.
   * @defaultValue unset: new tables are plain, existing ones used as they are
   */
  KEYS_PARTITIONS: int(0).max(1024).optional(),
  /** Run migrations at start (safe with many processes). @defaultValue `true` */
  MIGRATE: bool.default(true),
  /** Janitor (expired keys, old outbox rows) in this process, one active across processes. @defaultValue `true` */
  JANITOR_ENABLED: bool.default(true),
  /** Janitor period. @defaultValue `60000` */
  JANITOR_INTERVAL_MS: int(100).default(60_000),
  /** Rows the janitor deletes per statement. @defaultValue `1000` */
  JANITOR_BATCH_SIZE: int(1).max(100_000).default(1_000),
  /**
   * Deduplication window past retention, counted from when a key finished: the janitor leaves a
   * tombstone of each key it deletes until then, and duplicates are not run. 0: no tombstones,
   * except for keys whose job asked for a window of its own (`retention.tombstoneMs`).
   * @defaultValue `0`
   */
  TOMBSTONE_MS: int(0).default(0),
  /**
   * Scheduler in the maintenance process: enqueues each schedule's due ticks (any number of
   * schedulers may run; each tick is one key). Workers never run it. @defaultValue `true`
   */
  SCHEDULER_ENABLED: bool.default(true),
  /** The longest wait between scheduler rounds (it also wakes at the next tick). @defaultValue `1000` */
  SCHEDULER_INTERVAL_MS: int(100).default(1_000),
  /** Sweeper (lost jobs) in this process, one active across processes. @defaultValue `true` */
  SWEEPER_ENABLED: bool.default(true),
  /** Sweeper period. @defaultValue `60000` */
  SWEEPER_INTERVAL_MS: int(100).default(60_000),
  /** How long after its lease ended a processing key may sit before the sweeper checks its job. @defaultValue `900000` */
  SWEEP_AFTER_MS: int(0).default(900_000),
  /** Lost jobs: `reenqueue` (needs STORE_PAYLOAD, else abandons) or `abandon` (the key fails with `ABANDONED`). @defaultValue `reenqueue` */
  SWEEPER_ACTION: z.enum(['reenqueue', 'abandon']).default('reenqueue'),
  /** Queues the sweeper covers: comma-separated names, or `*` for every key in SCHEMA. @defaultValue QUEUE */
  SWEEPER_QUEUES: z.string().regex(/^\s*(\*|[^,\s]+(\s*,\s*[^,\s]+)*)\s*$/, 'must be * or queue names separated by commas').optional(),
  /** Per-queue sweeper actions: `payments=reenqueue,emails=abandon`. @defaultValue unset (SWEEPER_ACTION for every queue) */
  SWEEPER_QUEUE_ACTIONS: z.string().regex(/^\s*[^=,\s]+\s*=\s*(reenqueue|abandon)\s*(,\s*[^=,\s]+\s*=\s*(reenqueue|abandon)\s*)*$/, 'must look like payments=reenqueue,emails=abandon').optional(),
  /** Key statistics refresh (the idempotent_jobs_keys gauges); 0 turns it off. @defaultValue `60000` */
  STATS_INTERVAL_MS: int(0).default(60_000),
  /** The BullMQ attempts producers give QUEUE's jobs: the retry horizon is checked against RETENTION_MS; re-enqueued jobs get it. @defaultValue `1` */
  JOB_ATTEMPTS: int(1).default(1),
  /** Their backoff delay. @defaultValue `0` */
  JOB_BACKOFF_MS: int(0).default(0),
  /** Their backoff type, `fixed` or `exponential`. @defaultValue `fixed` */
  JOB_BACKOFF_TYPE: z.enum(['fixed', 'exponential']).default('fixed'),
  /**
   * The retry policies of other queues' jobs, by queue: `reports=5:exponential:1000,rates=3`
   * (attempts, then optionally the backoff type and its delay in ms). The scheduler gives each
   * schedule's ticks its queue's policy; the janitor checks each against RETENTION_MS; the
   * sweeper's re-enqueued jobs get it. QUEUE's own is JOB_ATTEMPTS and JOB_BACKOFF_*.
   * @defaultValue unset (other queues' jobs: BullMQ's defaults, one attempt)
   */
  JOB_RETRY_POLICIES: z
    .string()
    .regex(/^\s*[^=,\s]+\s*=\s*\d+(\s*:\s*(fixed|exponential)\s*:\s*\d+)?\s*(,\s*[^=,\s]+\s*=\s*\d+(\s*:\s*(fixed|exponential)\s*:\s*\d+)?\s*)*$/, 'must look like reports=5:exponential:1000,rates=3')
    .optional(),
});

/** Variables that no longer mean anything, each with what to do instead: refused rather than ignored. */
const REMOVED_VARIABLES: Readonly<Record<string, string>> = {
  GROUP_COMMIT_OPTIMISTIC:
    'no longer used: a group of jobs now always rolls back whole when anything fails, and each job to blame runs alone (there are no savepoint groups); remove it',
};

/** `JOB_RETRY_POLICIES` parses, names each queue once, and leaves QUEUE's policy to `JOB_ATTEMPTS` and `JOB_BACKOFF_*` (one place for it). */
function assertQueueRetryPolicies(config: Pick<EnvConfig, 'JOB_RETRY_POLICIES' | 'QUEUE'>): void {
  let policies: Record<string, unknown>;
  try {
    policies = parseQueueRetryPolicies(config.JOB_RETRY_POLICIES);
  } catch (error) {
    throw new ConfigError(`Invalid configuration:\n  JOB_RETRY_POLICIES: ${(error as Error).message}`);
  }
  if (Object.hasOwn(policies, config.QUEUE)) {
    throw new ConfigError(
      `Invalid configuration:\n  JOB_RETRY_POLICIES: names QUEUE (${config.QUEUE}), whose retry policy is JOB_ATTEMPTS, JOB_BACKOFF_MS and JOB_BACKOFF_TYPE; remove "${config.QUEUE}" from JOB_RETRY_POLICIES.`,
    );
  }
}

/** The names of the variables {@link loadEnvConfig} reads, in the schema's order. */
export const ENV_VARIABLES: readonly (keyof EnvConfig)[] = Object.freeze(Object.keys(envSchema.shape) as (keyof EnvConfig)[]);

/**
 * The validated process configuration: one property per environment variable, with its
 * default applied.
 *
 * @useDeclaredType
 */
export type EnvConfig = z.infer<typeof envSchema>;

/**
 * Where the parts that need a session of their own connect (`DATABASE_DIRECT_URL`, else
 * `DATABASE_URL`): a session advisory lock or a LISTEN through a transaction-mode pooler would
 * land on whichever server connection the pooler lends, and stay there after the client moved on.
 */
export function directDatabaseUrl(config: Pick<EnvConfig, 'DATABASE_URL' | 'DATABASE_DIRECT_URL'>): string {
  return config.DATABASE_DIRECT_URL ?? config.DATABASE_URL;
}

/**
 * Whether the pool over `DATABASE_URL` names the store's hot statements (`PG_PREPARED_STATEMENTS`):
 * as set, else on unless `DATABASE_DIRECT_URL` is another address than `DATABASE_URL`, which means
 * `DATABASE_URL` is a pooler, and a pooler in transaction mode may keep no prepared statements.
 * Connections to `DATABASE_DIRECT_URL` are Postgres's own sessions: they always may.
 */
export function preparedStatementsOverDatabaseUrl(config: Pick<EnvConfig, 'DATABASE_URL' | 'DATABASE_DIRECT_URL' | 'PG_PREPARED_STATEMENTS'>): boolean {
  return config.PG_PREPARED_STATEMENTS ?? directDatabaseUrl(config) === config.DATABASE_URL;
}

/**
 * `IdempotencyOptions.groupCommit` from `GROUP_COMMIT` and its settings (`GROUP_COMMIT_MAX_JOBS`,
 * `GROUP_COMMIT_GROUPS`, `GROUP_COMMIT_WATCH_SETTINGS`, `GROUP_COMMIT_SLOW_JOB_MS`): every effect
 * grouped when `true`, none when `false`, and when unset only those marked database-only (the
 * workers' transactions and `ctx.transaction` callbacks), with those settings either way.
 */
export function groupCommitFromEnv(
  config: Pick<EnvConfig, 'GROUP_COMMIT' | 'GROUP_COMMIT_MAX_JOBS' | 'GROUP_COMMIT_GROUPS' | 'GROUP_COMMIT_WATCH_SETTINGS' | 'GROUP_COMMIT_SLOW_JOB_MS'>,
): IdempotencyGroupCommitOptions | false {
  if (config.GROUP_COMMIT === false) return false;
  return {
    maxJobs: config.GROUP_COMMIT_MAX_JOBS,
    maxGroups: config.GROUP_COMMIT_GROUPS,
    slowJobMs: config.GROUP_COMMIT_SLOW_JOB_MS,
    watchSettings: config.GROUP_COMMIT_WATCH_SETTINGS?.split(',').map((name) => name.trim()) ?? [],
    effects: config.GROUP_COMMIT === true ? 'all' : 'database-only',
  };
}

/**
 * Where BullMQ's Redis is, from the environment: `REDIS_URL`, `REDIS_CLUSTER_NODES`,
 * `REDIS_SENTINELS` and `REDIS_SENTINEL_MASTER`, for {@link openRedisConnection}.
 */
export function redisSettingsFromEnv(config: Pick<EnvConfig, 'REDIS_URL' | 'REDIS_CLUSTER_NODES' | 'REDIS_SENTINELS' | 'REDIS_SENTINEL_MASTER'>): RedisConnectionSettings {
  return {
    url: config.REDIS_URL,
    ...(config.REDIS_CLUSTER_NODES !== undefined ? { clusterNodes: config.REDIS_CLUSTER_NODES } : {}),
    ...(config.REDIS_SENTINELS !== undefined ? { sentinels: config.REDIS_SENTINELS, sentinelMaster: config.REDIS_SENTINEL_MASTER } : {}),
  };
}

/**
 * Reads and validates the environment. Throws a {@link ConfigError} that names each wrong
 * variable and why, e.g. `CONCURRENCY: Too small: expected number to be >=1 (got "0")`.
 */
export function loadEnvConfig(env: NodeJS.ProcessEnv = process.env): EnvConfig {
  const present = Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined && v !== ''));
  const removed = Object.keys(REMOVED_VARIABLES).filter((name) => present[name] !== undefined);
  if (removed.length > 0) {
    throw new ConfigError(`Invalid configuration:\n${removed.map((name) => `  ${name}: ${REMOVED_VARIABLES[name]} (got ${JSON.stringify(env[name])})`).join('\n')}`);
  }
  const parsed = envSchema.safeParse(present);
  if (parsed.success) {
    if (parsed.data.REDIS_SENTINELS !== undefined) {
      if (parsed.data.REDIS_CLUSTER_NODES !== undefined) {
        throw new ConfigError('Invalid configuration:\n  REDIS_SENTINELS: set with REDIS_CLUSTER_NODES; Redis is either a Redis Cluster or a master that Sentinel names. Unset one.');
      }
      parseClusterNodes(parsed.data.REDIS_SENTINELS, 'REDIS_SENTINELS');
    }
    if (parsed.data.REDIS_CLUSTER_NODES !== undefined) {
      parseClusterNodes(parsed.data.REDIS_CLUSTER_NODES);
      assertClusterHashTag(parsed.data.REDIS_PREFIX, parsed.data.QUEUE);
    }
    assertQueueRetryPolicies(parsed.data);
    return parsed.data;
  }
  const problems = parsed.error.issues.map((issue) => {
    const name = String(issue.path[0]);
    return `  ${name}: ${issue.message} (got ${JSON.stringify(env[name])})`;
  });
  throw new ConfigError(`Invalid configuration:\n${problems.join('\n')}`);
}
