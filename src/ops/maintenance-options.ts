import type { Kysely } from 'kysely';
import type { Logger } from 'pino';
import { z } from 'zod';
import { ValidationError } from '../errors.js';
import type { JobLookup } from './job-lookup.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/**
 * BullMQ retry settings of a queue's jobs (what producers pass as `attempts` and `backoff`).
 * The janitor compares the retry horizon they imply with the retention; the sweeper gives
 * re-enqueued jobs these options.
 */
export interface RetryPolicy {
  /** BullMQ `attempts`. @defaultValue `1` */
  readonly attempts?: number;
  /** BullMQ `backoff`. @defaultValue none (retries at once) */
  readonly backoff?: {
    /** BullMQ backoff type: the same delay each time, or doubling from it. */
    readonly type: 'fixed' | 'exponential';
    /** The (first) delay between attempts. */
    readonly delayMs: number;
  };
}

/** Options of `Janitor`: deleting expired keys and old outbox rows. */
export interface JanitorOptions {
  /** The database holding the keys and outbox tables. */
  readonly db: Kysely<any>;
  /** Postgres schema of the tables. @defaultValue `'idempotent_jobs'` */
  readonly schema?: string;
  /** Rows deleted per statement (one short transaction each). @defaultValue `1_000` */
  readonly batchSize?: number;
  /** Most batches per table in one run, so one run stays bounded; the next run continues. @defaultValue `100` */
  readonly maxBatchesPerRun?: number;
  /**
   * How long keys are kept: the janitor purges outbox rows sent longer ago than this, and warns
   * when a queue's retry horizon exceeds it. (Keys carry their own `expires_at`, set from the
   * `IdempotencyKeys` retention when they finish.)
   * @defaultValue `86_400_000` (24 h)
   */
  readonly retentionMs?: number;
  /** Retry policy per queue, for the retention warning. @defaultValue `{}` */
  readonly retryPolicies?: Readonly<Record<string, RetryPolicy>>;
  /**
   * The deduplication window past retention: a key the janitor deletes leaves a tombstone (no
   * payload, no result) until this long after the key finished, and a duplicate arriving
   * meanwhile is answered "completed, result expired" (or "failed, error expired") and never
   * runs; one with another payload is `KEY_REUSED`. 0: no tombstones, a key deleted after its
   * retention is free again. Counted from when the key finished, so only a window longer
   * than the retention leaves tombstones.
   * @defaultValue `0`
   */
  readonly tombstoneMs?: number;
  /** Structured logger (each run's counts, retention warnings). @defaultValue pino at `LOG_LEVEL`, else `warn` */
  readonly logger?: Logger;
}

/** {@link JanitorOptions} with defaults applied. */
export interface ResolvedJanitorOptions {
  /** See {@link JanitorOptions.db}. */
  readonly db: Kysely<any>;
  /** See {@link JanitorOptions.schema}. */
  readonly schema: string;
  /** See {@link JanitorOptions.batchSize}. */
  readonly batchSize: number;
  /** See {@link JanitorOptions.maxBatchesPerRun}. */
  readonly maxBatchesPerRun: number;
  /** See {@link JanitorOptions.retentionMs}. */
  readonly retentionMs: number;
  /** See {@link JanitorOptions.retryPolicies}. */
  readonly retryPolicies: Readonly<Record<string, RetryPolicy>>;
  /** See {@link JanitorOptions.tombstoneMs}. */
  readonly tombstoneMs: number;
  /** See {@link JanitorOptions.logger}; undefined: pino at `LOG_LEVEL`, else `warn`. */
  readonly logger: Logger | undefined;
}

/** What the sweeper does with a lost job: put it back in its queue, or fail its key for good. */
export type SweeperAction = 'reenqueue' | 'abandon';

/** Options of `Sweeper`: finding keys left `processing` whose job is gone. */
export interface SweeperOptions {
  /** The database holding the keys table. */
  readonly db: Kysely<any>;
  /** Postgres schema of the keys table. @defaultValue `'idempotent_jobs'` */
  readonly schema?: string;
  /** BullMQ access. */
  readonly jobs: JobLookup;
  /**
   * How long after its lease ended a `processing` key may sit before the sweeper looks at its
   * job. Longer than BullMQ's own recovery (`max(lockDuration + stalledInterval, lease)`) and
   * than your longest retry backoff, so it only ever sees truly lost jobs.
   * @defaultValue `900_000` (15 min)
   */
  readonly sweepAfterMs?: number;
  /**
   * What to do with a lost job. `'reenqueue'` re-adds it (same deterministic job id) when its
   * payload was stored (`storePayload`), else abandons it.
   * @defaultValue `'reenqueue'`
   */
  readonly action?: SweeperAction;
  /** Per-queue override of {@link SweeperOptions.action}. @defaultValue `{}` */
  readonly queueActions?: Readonly<Record<string, SweeperAction>>;
  /**
   * Which queues' keys to sweep: a list, or `'*'` for every key in the schema. The sweeper asks
   * BullMQ under its own connection and prefix, so list only queues that live there: a key of a
   * queue under another prefix or Redis would look lost. Sweepers of different queue lists do
   * not exclude each other.
   * @defaultValue `'*'`
   */
  readonly queues?: readonly string[] | '*';
  /** How long an abandoned key is kept (replaying its failure). @defaultValue `86_400_000` */
  readonly retentionMs?: number;
  /** Retry policy per queue, given to re-enqueued jobs. @defaultValue `{}` (BullMQ defaults) */
  readonly retryPolicies?: Readonly<Record<string, RetryPolicy>>;
  /** Keys read per page. @defaultValue `100` */
  readonly batchSize?: number;
  /** Most keys examined in one run; the next run continues. @defaultValue `1_000` */
  readonly maxKeysPerRun?: number;
  /** Structured logger (each recovery, each run's report). @defaultValue pino at `LOG_LEVEL`, else `warn` */
  readonly logger?: Logger;
}

/** {@link SweeperOptions} with defaults applied. */
export interface ResolvedSweeperOptions {
  /** See {@link SweeperOptions.db}. */
  readonly db: Kysely<any>;
  /** See {@link SweeperOptions.schema}. */
  readonly schema: string;
  /** See {@link SweeperOptions.jobs}. */
  readonly jobs: JobLookup;
  /** See {@link SweeperOptions.sweepAfterMs}. */
  readonly sweepAfterMs: number;
  /** See {@link SweeperOptions.action}. */
  readonly action: SweeperAction;
  /** See {@link SweeperOptions.queueActions}. */
  readonly queueActions: Readonly<Record<string, SweeperAction>>;
  /** See {@link SweeperOptions.queues}. */
  readonly queues: readonly string[] | '*';
  /** See {@link SweeperOptions.retentionMs}. */
  readonly retentionMs: number;
  /** See {@link SweeperOptions.retryPolicies}. */
  readonly retryPolicies: Readonly<Record<string, RetryPolicy>>;
  /** See {@link SweeperOptions.batchSize}. */
  readonly batchSize: number;
  /** See {@link SweeperOptions.maxKeysPerRun}. */
  readonly maxKeysPerRun: number;
  /** See {@link SweeperOptions.logger}; undefined: pino at `LOG_LEVEL`, else `warn`. */
  readonly logger: Logger | undefined;
}

const schemaName = z
  .string()
  .regex(/^[a-z_][a-z0-9_]{0,62}$/, 'must be a lower-case Postgres identifier (letters, digits, _; at most 63)')
  .default('idempotent_jobs');
const positive = z.number().int().positive();
const action = z.enum(['reenqueue', 'abandon']);
const retryPolicy = z.object({
  attempts: positive.optional(),
  backoff: z.object({ type: z.enum(['fixed', 'exponential']), delayMs: z.number().int().min(0) }).optional(),
});

const janitorSchema = z.object({
  schema: schemaName,
  batchSize: positive.max(100_000).default(1_000),
  maxBatchesPerRun: positive.default(100),
  retentionMs: positive.default(86_400_000),
  retryPolicies: z.record(z.string(), retryPolicy).default({}),
  tombstoneMs: z.number().int().min(0).default(0),
});

const sweeperSchema = z.object({
  schema: schemaName,
  sweepAfterMs: z.number().int().min(0).default(900_000),
  action: action.default('reenqueue'),
  queueActions: z.record(z.string(), action).default({}),
  queues: z.union([z.literal('*'), z.array(z.string().min(1)).min(1, 'must name at least one queue (or be "*")')]).default('*'),
  retentionMs: positive.default(86_400_000),
  retryPolicies: z.record(z.string(), retryPolicy).default({}),
  batchSize: positive.max(10_000).default(100),
  maxKeysPerRun: positive.default(1_000),
});

/** Applies defaults and validates; throws a {@link ValidationError} naming the bad option. */
export function resolveJanitorOptions(options: JanitorOptions): ResolvedJanitorOptions {
  refuseUnknownOptions(
    options,
    optionNames<JanitorOptions>()(['db', 'schema', 'batchSize', 'maxBatchesPerRun', 'retentionMs', 'retryPolicies', 'tombstoneMs', 'logger']),
    'new Janitor(options)',
  );
  if (!options?.db) throw new ValidationError('INVALID_OPTIONS', 'db', 'JanitorOptions.db is required: pass a Kysely<any> instance.');
  const parsed = parse('JanitorOptions', janitorSchema, {
    schema: options.schema,
    batchSize: options.batchSize,
    maxBatchesPerRun: options.maxBatchesPerRun,
    retentionMs: options.retentionMs,
    retryPolicies: options.retryPolicies,
    tombstoneMs: options.tombstoneMs,
  });
  return Object.freeze({ ...parsed, db: options.db, logger: options.logger });
}

const SWEEPER_OPTION_NAMES = optionNames<SweeperOptions>()([
  'db', 'schema', 'jobs', 'sweepAfterMs', 'action', 'queueActions', 'queues', 'retentionMs', 'retryPolicies', 'batchSize', 'maxKeysPerRun', 'logger',
]);

/** Applies defaults and validates; throws a {@link ValidationError} naming the bad option. */
export function resolveSweeperOptions(options: SweeperOptions): ResolvedSweeperOptions {
  refuseUnknownOptions(options, SWEEPER_OPTION_NAMES, 'new Sweeper(options)');
  if (!options?.db) throw new ValidationError('INVALID_OPTIONS', 'db', 'SweeperOptions.db is required: pass a Kysely<any> instance.');
  if (!options.jobs) throw new ValidationError('INVALID_OPTIONS', 'jobs', 'SweeperOptions.jobs is required: pass a BullmqJobLookup.');
  const parsed = parse('SweeperOptions', sweeperSchema, {
    schema: options.schema,
    sweepAfterMs: options.sweepAfterMs,
    action: options.action,
    queueActions: options.queueActions,
    queues: options.queues,
    retentionMs: options.retentionMs,
    retryPolicies: options.retryPolicies,
    batchSize: options.batchSize,
    maxKeysPerRun: options.maxKeysPerRun,
  });
  return Object.freeze({ ...parsed, db: options.db, jobs: options.jobs, logger: options.logger });
}

/** Periods of the maintenance tasks, in milliseconds (`stats: 0` turns the refresh off). */
export interface MaintenanceIntervals {
  /** Period of the janitor's runs. */
  readonly janitor: number;
  /** Period of the sweeper's runs. */
  readonly sweeper: number;
  /** Period of the key statistics refresh; 0: off. */
  readonly stats: number;
}

const intervalsSchema = z.object({
  janitorIntervalMs: positive.default(60_000),
  sweeperIntervalMs: positive.default(60_000),
  statsIntervalMs: z.number().int().min(0).default(60_000),
});

/** Defaults and checks `Maintenance`'s intervals (see `MaintenanceOptions`). */
export function resolveMaintenanceIntervals(options: {
  readonly janitorIntervalMs?: number;
  readonly sweeperIntervalMs?: number;
  readonly statsIntervalMs?: number;
}): MaintenanceIntervals {
  const parsed = parse('MaintenanceOptions', intervalsSchema, {
    janitorIntervalMs: options.janitorIntervalMs,
    sweeperIntervalMs: options.sweeperIntervalMs,
    statsIntervalMs: options.statsIntervalMs,
  });
  return Object.freeze({ janitor: parsed.janitorIntervalMs, sweeper: parsed.sweeperIntervalMs, stats: parsed.statsIntervalMs });
}

/**
 * The longest a job can keep being retried by BullMQ after its first attempt: the sum of the
 * backoff delays between its attempts. Fixed backoff: `(attempts − 1) × delay`; exponential:
 * `delay × (2^(attempts − 1) − 1)` (BullMQ waits `delay × 2^(n − 1)` before retry n).
 */
export function retryHorizonMs(policy: RetryPolicy): number {
  const retries = Math.max(0, (policy.attempts ?? 1) - 1);
  const delay = policy.backoff?.delayMs ?? 0;
  if (retries === 0 || delay === 0) return 0;
  return policy.backoff?.type === 'exponential' ? delay * (2 ** retries - 1) : delay * retries;
}

/**
 * Parses `SWEEPER_QUEUE_ACTIONS`-style text, `payments=reenqueue,emails=abandon`, into a map.
 * Throws a {@link ValidationError} naming the bad entry.
 */
export function parseQueueActions(text: string | undefined): Record<string, SweeperAction> {
  const actions: Record<string, SweeperAction> = {};
  if (!text) return actions;
  for (const entry of text.split(',').map((e) => e.trim()).filter(Boolean)) {
    const [queue, value, ...rest] = entry.split('=').map((p) => p.trim());
    if (!queue || rest.length > 0 || (value !== 'reenqueue' && value !== 'abandon')) {
      throw new ValidationError(
        'INVALID_OPTIONS',
        'queueActions',
        `Invalid sweeper queue action "${entry}": expected <queue>=reenqueue or <queue>=abandon, separated by commas.`,
      );
    }
    actions[queue] = value;
  }
  return actions;
}

/**
 * Parses `JOB_RETRY_POLICIES`-style text, `reports=5:exponential:1000,rates=3`, into retry
 * policies by queue: the attempts, then optionally the backoff type and its (first) delay in ms.
 * Throws a {@link ValidationError} naming the bad entry.
 */
export function parseQueueRetryPolicies(text: string | undefined): Record<string, RetryPolicy> {
  const policies: Record<string, RetryPolicy> = {};
  if (!text) return policies;
  for (const entry of text.split(',').map((e) => e.trim()).filter(Boolean)) {
    const match = /^([^=\s]+)\s*=\s*(\d+)(?:\s*:\s*(fixed|exponential)\s*:\s*(\d+))?$/.exec(entry);
    const attempts = Number(match?.[2]);
    if (!match || !Number.isSafeInteger(attempts) || attempts < 1 || policies[match[1]!] !== undefined) {
      throw new ValidationError(
        'INVALID_OPTIONS',
        'retryPolicies',
        `Invalid queue retry policy "${entry}": expected <queue>=<attempts> or <queue>=<attempts>:fixed|exponential:<delay ms>, attempts at least 1, each queue once, separated by commas.`,
      );
    }
    const [, queue, , type, delay] = match;
    policies[queue!] = { attempts, ...(type ? { backoff: { type: type as 'fixed' | 'exponential', delayMs: Number(delay) } } : {}) };
  }
  return policies;
}

function parse<T extends z.ZodType>(what: string, schema: T, input: unknown): z.infer<T> {
  const parsed = schema.safeParse(input);
  if (parsed.success) return parsed.data;
  const issue = parsed.error.issues[0]!;
  const field = issue.path.join('.');
  throw new ValidationError('INVALID_OPTIONS', field, `Invalid option ${what}.${field}: ${issue.message}`);
}
