import type { Kysely } from 'kysely';
import { z } from 'zod';
import { ValidationError } from '../errors.js';
import type { Fingerprinter } from '../fingerprint.js';
import { sha256Fingerprint } from '../fingerprint.js';
import { GROUP_COMMIT_DEFAULTS, type GroupCommitOptions } from './group-commit.js';
import { DEFAULT_MAX_JOB_RETENTION_MS, DEFAULT_MAX_JOB_TOMBSTONE_MS, MAX_RETENTION_CEILING_MS } from './key-retention.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** Options for {@link IdempotencyKeys}: where keys live and how long leases and results last. */
export interface IdempotencyOptions {
  /** The Kysely instance (Postgres dialect). Effects run in transactions opened on it. */
  readonly db: Kysely<any>;
  /**
   * Postgres schema holding the `idempotency_keys` table.
   * @defaultValue `'idempotent_jobs'`
   */
  readonly schema?: string;
  /**
   * How long a claim is leased before another worker may take the key over.
   * Longer than your slowest handler; the worker heartbeats it while a handler runs.
   * @defaultValue `30_000`
   */
  readonly leaseMs?: number;
  /**
   * How long completed and failed keys are kept (and so replayed) before the janitor deletes them.
   * @defaultValue `86_400_000` (24 h, as Stripe keeps keys)
   */
  readonly retentionMs?: number;
  /**
   * Longest retention a job may ask for its own key (`retention.resultMs` of a claim, an enqueue
   * or the wire contract); a job asking for more gets this, with a warning in its log.
   * @defaultValue `2_592_000_000` (30 days)
   */
  readonly maxJobRetentionMs?: number;
  /**
   * Longest tombstone window a job may ask for its own key (`retention.tombstoneMs`); a job
   * asking for more gets this, with a warning in its log.
   * @defaultValue `31_536_000_000` (365 days)
   */
  readonly maxJobTombstoneMs?: number;
  /**
   * Largest JSON result, in bytes, that may be stored; larger results fail the effect.
   * @defaultValue `1_048_576` (1 MiB)
   */
  readonly maxResultBytes?: number;
  /**
   * How long a claim waits on a concurrent uncommitted claim of the same key (a fast-path
   * transaction still running) before it reports `in-progress` instead.
   * @defaultValue `2_000`
   */
  readonly claimLockTimeoutMs?: number;
  /**
   * `false`: leased claims commit without waiting for the WAL flush (`synchronous_commit = off`
   * for the claim statement only; effects and completions stay synchronous), so a claim does not
   * wait for a disk flush. Only a Postgres crash can lose such a claim, and its holder's
   * completion is then fenced out; but after that crash a fence number may be reused, so keep
   * `true` if a downstream system fences on `ctx.fence` alone. See `src/store/sql/claim.ts`.
   * @defaultValue `true`
   */
  readonly claimSynchronousCommit?: boolean;
  /**
   * Computes the fingerprint of what identifies a request.
   * @defaultValue SHA-256 of RFC 8785 canonical JSON
   */
  readonly fingerprint?: Fingerprinter;
  /**
   * Group commit: concurrent effects (`commitEffect`, `runEffect`, `executeOnce`) share
   * transactions, so a group pays one COMMIT and one WAL flush. The outcome is that of running
   * the effects one after another: a group commits whole or not at all (no savepoints, keys
   * written at its end); if anything in it fails, it rolls back, each effect to blame runs again
   * alone, in a transaction of its own, and the others share a transaction again. An effect may
   * therefore run more than once, only one run committing: keep what it does outside its
   * transaction to nothing. A group's effects run at once, their statements gathered into shared
   * round trips, while each sends its statements without a group-mate's in between; one that
   * does not sends its group, and every later one, back to one effect after another. The price:
   * a group commits when its last effect has ended and holds all their row locks until then, so
   * it suits short effects that only touch this database. See `src/protocol/group-commit.ts`.
   *
   * - unset: only database-only effects are grouped (those marked `EffectOptions.databaseOnly`:
   *   the workers mark so their database-only handlers' transactions and their function
   *   handlers' `ctx.transaction` callbacks, unless called with `{ runsAlone: true }`), with the
   *   default settings; every other effect runs in a transaction of its own. A store without
   *   group statements runs them alone too.
   * - `true`, or settings: every effect is grouped (settings with `effects: 'database-only'`:
   *   only database-only ones, with these settings).
   * - `false`: no effect is grouped, database-only ones included.
   *
   * @defaultValue unset: database-only effects only, with the default settings (`maxJobs` 32, `maxGroups` 2, `slowJobMs` 1000)
   */
  readonly groupCommit?: boolean | IdempotencyGroupCommitOptions;
}

/** Which effects group commit groups: every effect, or only those marked database-only. */
export type GroupedEffects = 'all' | 'database-only';

/** {@link IdempotencyOptions.groupCommit}'s settings: the groups' own, and which effects share them. */
export interface IdempotencyGroupCommitOptions extends GroupCommitOptions {
  /**
   * `'all'`: every effect shares group transactions. `'database-only'`: only the effects their
   * caller marks database-only (`EffectOptions.databaseOnly`), which may run again after a
   * group rolled back without anyone outside the database noticing.
   * @defaultValue `'all'`
   */
  readonly effects?: GroupedEffects;
}

/** {@link IdempotencyOptions} with every default applied and every value checked. */
export interface ResolvedIdempotencyOptions {
  /** See {@link IdempotencyOptions.db}. */
  readonly db: Kysely<any>;
  /** See {@link IdempotencyOptions.schema}. */
  readonly schema: string;
  /** See {@link IdempotencyOptions.leaseMs}. */
  readonly leaseMs: number;
  /** See {@link IdempotencyOptions.retentionMs}. */
  readonly retentionMs: number;
  /** See {@link IdempotencyOptions.maxJobRetentionMs}. */
  readonly maxJobRetentionMs: number;
  /** See {@link IdempotencyOptions.maxJobTombstoneMs}. */
  readonly maxJobTombstoneMs: number;
  /** See {@link IdempotencyOptions.maxResultBytes}. */
  readonly maxResultBytes: number;
  /** See {@link IdempotencyOptions.claimLockTimeoutMs}. */
  readonly claimLockTimeoutMs: number;
  /** See {@link IdempotencyOptions.claimSynchronousCommit}. */
  readonly claimSynchronousCommit: boolean;
  /** See {@link IdempotencyOptions.fingerprint}. */
  readonly fingerprint: Fingerprinter;
  /** Group commit's settings and the effects it groups, or false when no effect is grouped. */
  readonly groupCommit: Required<IdempotencyGroupCommitOptions> | false;
}

const positiveMs = z.number().int().positive();

const optionsSchema = z.object({
  schema: z
    .string()
    .regex(/^[a-z_][a-z0-9_]{0,62}$/, 'must be a lower-case Postgres identifier (letters, digits, _; at most 63)')
    .default('idempotent_jobs'),
  leaseMs: positiveMs.default(30_000),
  retentionMs: positiveMs.default(86_400_000),
  maxJobRetentionMs: positiveMs.max(MAX_RETENTION_CEILING_MS).default(DEFAULT_MAX_JOB_RETENTION_MS),
  maxJobTombstoneMs: z.number().int().min(0).max(MAX_RETENTION_CEILING_MS).default(DEFAULT_MAX_JOB_TOMBSTONE_MS),
  maxResultBytes: positiveMs.default(1_048_576),
  claimLockTimeoutMs: positiveMs.default(2_000),
  claimSynchronousCommit: z.boolean().default(true),
  groupCommit: z
    .union([
      z.boolean().transform((on) => (on ? ({ ...GROUP_COMMIT_DEFAULTS, effects: 'all' } as const) : false)),
      z.object({
        // A group that fails runs all its jobs again: the bound keeps that cost small.
        maxJobs: z.number().int().min(1).max(63).default(GROUP_COMMIT_DEFAULTS.maxJobs),
        maxGroups: z.number().int().min(1).max(64).default(GROUP_COMMIT_DEFAULTS.maxGroups),
        watchSettings: z
          .array(z.string().regex(/^[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$.]*$/, 'must be custom setting names like app.tenant'))
          .readonly()
          .default([]),
        slowJobMs: z.number().int().min(1).max(3_600_000).default(GROUP_COMMIT_DEFAULTS.slowJobMs),
        effects: z.enum(['all', 'database-only']).default('all'),
      }),
    ])
    // Unset: database-only effects may share transactions (they are safe to run again); no other.
    .default({ ...GROUP_COMMIT_DEFAULTS, effects: 'database-only' }),
});

const IDEMPOTENCY_OPTION_NAMES = optionNames<IdempotencyOptions>()([
  'db', 'schema', 'leaseMs', 'retentionMs', 'maxJobRetentionMs', 'maxJobTombstoneMs', 'maxResultBytes', 'claimLockTimeoutMs',
  'claimSynchronousCommit', 'fingerprint', 'groupCommit',
]);
const GROUP_COMMIT_OPTION_NAMES = optionNames<IdempotencyGroupCommitOptions>()(['effects', 'maxJobs', 'maxGroups', 'watchSettings', 'slowJobMs']);

/** Applies defaults and validates; throws a {@link ValidationError} naming the bad option. */
export function resolveIdempotencyOptions(options: IdempotencyOptions): ResolvedIdempotencyOptions {
  if (!options || !options.db) {
    throw new ValidationError('INVALID_OPTIONS', 'db', 'IdempotencyOptions.db is required: pass a Kysely<any> instance.');
  }
  refuseUnknownOptions(options, IDEMPOTENCY_OPTION_NAMES, 'new IdempotencyKeys(options)');
  if (typeof options.groupCommit === 'object' && options.groupCommit !== null && 'optimistic' in options.groupCommit) {
    throw new ValidationError(
      'INVALID_OPTIONS',
      'groupCommit.optimistic',
      'groupCommit.optimistic is gone: a group always rolls back whole when anything fails, and each job to blame runs alone; remove the option.',
    );
  }
  refuseUnknownOptions(options.groupCommit, GROUP_COMMIT_OPTION_NAMES, 'new IdempotencyKeys(options), in groupCommit');
  const parsed = optionsSchema.safeParse({
    schema: options.schema,
    leaseMs: options.leaseMs,
    retentionMs: options.retentionMs,
    maxJobRetentionMs: options.maxJobRetentionMs,
    maxJobTombstoneMs: options.maxJobTombstoneMs,
    maxResultBytes: options.maxResultBytes,
    claimLockTimeoutMs: options.claimLockTimeoutMs,
    claimSynchronousCommit: options.claimSynchronousCommit,
    groupCommit: options.groupCommit,
  });
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const field = issue.path.join('.');
    throw new ValidationError('INVALID_OPTIONS', field, `Invalid option ${field}: ${issue.message}`);
  }
  return Object.freeze({ ...parsed.data, db: options.db, fingerprint: options.fingerprint ?? sha256Fingerprint });
}
