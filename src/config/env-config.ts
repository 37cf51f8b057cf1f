import { z } from 'zod';
import { ConfigError } from '../errors.js';
import { GROUP_COMMIT_DEFAULTS } from '../protocol/group-commit.js';
import type { IdempotencyGroupCommitOptions } from './idempotency-options.js';
import { assertClusterHashTag, parseClusterNodes } from './redis-cluster.js';

const int = (min: number) => z.coerce.number().int().min(min);
const bool = z
  .enum(['true', 'false', '1', '0', 'yes', 'no'])
  .transform((v) => v === 'true' || v === '1' || v === 'yes');

/**
 * Environment variables read by the runnable processes. Each is documented in
 * docs/configuration.md (test/configuration-doc.test.ts checks that every one is there, with
 * its default); names and defaults here are the source of truth.
 */
const envSchema = z.object({
  /** Postgres (may be a transaction-mode pooler: see DATABASE_DIRECT_URL). @defaultValue `postgres://postgres@127.0.0.1:5432/postgres` */
  DATABASE_URL: z.string().url('must be a postgres:// URL').default('postgres://postgres@127.0.0.1:5432/postgres'),
  /**
   * Postgres itself, for what needs a session of its own: migrations' and maintenance's advisory
   * locks, the listener's LISTEN. Set it when DATABASE_URL is a transaction-mode pooler
   * (PgBouncer).
   * @defaultValue DATABASE_URL
   */
  DATABASE_DIRECT_URL: z.string().url('must be a postgres:// URL').optional(),
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
  /** How long completed and failed keys are kept, and replayed. @defaultValue `86400000` (24 h) */
  RETENTION_MS: int(1).default(86_400_000),
  /**
   * The single-transaction fast path. Unset: on for a database-only handler (`{ transaction }`),
   * off for a function handler; `true` or `false`: for both.
   * @defaultValue unset
   */
  FAST_PATH: bool.optional(),
  /**
   * Group commit: concurrent jobs' effects share transactions (see IdempotencyOptions.groupCommit).
   * Unset: a database-only handler's jobs only; `true`: every job's; `false`: none.
   * @defaultValue unset
   */
  GROUP_COMMIT: bool.optional(),
  /** Most jobs in one group transaction (1-63). @defaultValue `32` */
  GROUP_COMMIT_MAX_JOBS: int(1).max(63).default(GROUP_COMMIT_DEFAULTS.maxJobs),
  /** Group transactions open at once, each on its own connection. @defaultValue `2` */
  GROUP_COMMIT_GROUPS: int(1).max(64).default(GROUP_COMMIT_DEFAULTS.maxGroups),
  /** Optimistic groups first (no savepoints; a failure re-runs the group's jobs carefully). @defaultValue `true` */
  GROUP_COMMIT_OPTIMISTIC: bool.default(GROUP_COMMIT_DEFAULTS.optimistic),
  /** Keep payloads on keys, which lets the sweeper re-enqueue lost jobs. @defaultValue `false` */
  STORE_PAYLOAD: bool.default(false),
  /** Postgres pool size per process. @defaultValue CONCURRENCY + 2 */
  PG_POOL_SIZE: int(1).optional(),
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
});

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
 * `IdempotencyOptions.groupCommit` from `GROUP_COMMIT` and its settings (`GROUP_COMMIT_MAX_JOBS`,
 * `GROUP_COMMIT_GROUPS`, `GROUP_COMMIT_OPTIMISTIC`): every effect grouped when `true`, none when
 * `false`, and when unset only database-only ones (a database-only handler's), with those
 * settings either way.
 */
export function groupCommitFromEnv(
  config: Pick<EnvConfig, 'GROUP_COMMIT' | 'GROUP_COMMIT_MAX_JOBS' | 'GROUP_COMMIT_GROUPS' | 'GROUP_COMMIT_OPTIMISTIC'>,
): IdempotencyGroupCommitOptions | false {
  if (config.GROUP_COMMIT === false) return false;
  return {
    maxJobs: config.GROUP_COMMIT_MAX_JOBS,
    maxGroups: config.GROUP_COMMIT_GROUPS,
    optimistic: config.GROUP_COMMIT_OPTIMISTIC,
    effects: config.GROUP_COMMIT === true ? 'all' : 'database-only',
  };
}

/**
 * Reads and validates the environment. Throws a {@link ConfigError} that names each wrong
 * variable and why, e.g. `CONCURRENCY: Too small: expected number to be >=1 (got "0")`.
 */
export function loadEnvConfig(env: NodeJS.ProcessEnv = process.env): EnvConfig {
  const present = Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined && v !== ''));
  const parsed = envSchema.safeParse(present);
  if (parsed.success) {
    if (parsed.data.REDIS_CLUSTER_NODES !== undefined) {
      parseClusterNodes(parsed.data.REDIS_CLUSTER_NODES);
      assertClusterHashTag(parsed.data.REDIS_PREFIX, parsed.data.QUEUE);
    }
    return parsed.data;
  }
  const problems = parsed.error.issues.map((issue) => {
    const name = String(issue.path[0]);
    return `  ${name}: ${issue.message} (got ${JSON.stringify(env[name])})`;
  });
  throw new ConfigError(`Invalid configuration:\n${problems.join('\n')}`);
}
