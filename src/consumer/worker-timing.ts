import { z } from 'zod';
import { ValidationError } from '../errors.js';
import { optionNames } from '../config/unknown-options.js';

/**
 * How a worker's lease relates to BullMQ's stall detection. When a worker dies mid-job:
 *
 * 1. BullMQ stops renewing the job's lock; after `lockDurationMs` it expires.
 * 2. The next stalled check (every `stalledIntervalMs`, on any live worker) moves the job back
 *    to waiting; a live worker picks it up.
 * 3. That worker claims the key. If the dead worker's lease (`leaseMs`) is still live, the job
 *    is deferred until about when it expires, then it takes the key over.
 *
 * So a dead worker's job runs again after about `max(lockDurationMs + stalledIntervalMs, leaseMs)`.
 * The defaults (`lockDurationMs = leaseMs`, `stalledIntervalMs = leaseMs / 2`) keep that near
 * 1.5 × lease. `maxStalledCount` defaults to effectively unlimited: BullMQ fails a job that
 * stalled more often than that, and a job must never fail merely because its workers died.
 */
export interface WorkerTimingOptions {
  /** Lease per claim. @defaultValue the IdempotencyKeys instance's `leaseMs` (30 s) */
  readonly leaseMs?: number;
  /** Lease heartbeat period; at most half the lease. @defaultValue `leaseMs / 3` */
  readonly heartbeatMs?: number;
  /** BullMQ `lockDuration`. @defaultValue `leaseMs` */
  readonly lockDurationMs?: number;
  /** BullMQ `stalledInterval`; at most `lockDurationMs`. @defaultValue `leaseMs / 2`, at least 1 s, at most `lockDurationMs` */
  readonly stalledIntervalMs?: number;
  /** BullMQ `maxStalledCount`. @defaultValue `1_000_000` (a dead worker never fails a job) */
  readonly maxStalledCount?: number;
  /**
   * Longest deferral of a duplicate while another worker holds its key; the deferral is the
   * owner's remaining lease, capped here, plus jitter.
   * @defaultValue `2_000`
   */
  readonly deferMaxMs?: number;
  /** Shortest deferral. @defaultValue `100` */
  readonly deferMinMs?: number;
  /** Random extra deferral, as a fraction, so deferred duplicates do not wake in lockstep. @defaultValue `0.25` */
  readonly deferJitterRatio?: number;
  /**
   * Before deferring, wait up to this long for the owner to finish (LISTEN/NOTIFY) and replay.
   * @defaultValue `0` (defer at once)
   */
  readonly waitMs?: number;
  /** On close, how long active jobs may run before their keys are released. @defaultValue `30_000` */
  readonly shutdownTimeoutMs?: number;
  /**
   * First deferral of a job whose store statement met a transient fault (Postgres restarting,
   * a dropped connection, a serialization failure, a lock or statement timeout); it doubles with
   * every deferral the job has had, up to `storeRetryMaxMs`, plus jitter (`deferJitterRatio`).
   * Such a deferral uses none of the job's attempts.
   * @defaultValue `250`
   */
  readonly storeRetryMinMs?: number;
  /** Longest deferral after a transient store fault, before jitter. @defaultValue `15_000` */
  readonly storeRetryMaxMs?: number;
  /**
   * How long a key's transient store faults in a row are deferred without using an attempt,
   * from the first one this process saw. Past it, each store fault counts as an attempt, as a
   * retryable error of the handler would (`PersistentStoreFaultError`), until a run gets past the
   * store: a fault that is in fact deterministic cannot defer its job for ever. On the last
   * attempt the fault is stored as the key's failure, which takes a working Postgres: while
   * Postgres stays unreachable the job is still deferred, never failed. Generous, so that a real
   * outage (a failover, a restart, a full disk) does not use attempts up.
   * @defaultValue `3_600_000` (an hour)
   */
  readonly storeRetryWindowMs?: number;
  /**
   * The starvation bound of per-key concurrency limits: a job of a concurrency group deferred
   * this long (its group at its limit) goes before every job of the group that has waited less.
   * At least `deferMaxMs × (1 + deferJitterRatio)`, the longest a deferred job stays away.
   * @defaultValue `30_000`, or that longest deferral when it is longer
   */
  readonly concurrencyStarvationMs?: number;
  /**
   * How long a worker keeps a concurrency slot it took for its next job of the same concurrency
   * key (and limit), which then runs in it with no statement to take or free a slot: after this
   * long from its take the slot is freed when its run ends, and one no run holds is freed within
   * 50 ms. A waiter on another worker may wait this much longer than the runs ahead of it; `0`:
   * every run takes and frees its own slots (a fast-path run by its transaction).
   * @defaultValue `1_000`
   */
  readonly concurrencySlotReuseMs?: number;
}

/** {@link WorkerTimingOptions} with defaults applied and relations checked. */
export type ResolvedWorkerTiming = Required<WorkerTimingOptions>;

const ms = z.number().int().positive();
const timingSchema = z.object({
  leaseMs: ms,
  heartbeatMs: ms.optional(),
  lockDurationMs: ms.optional(),
  stalledIntervalMs: ms.optional(),
  maxStalledCount: z.number().int().min(1).default(1_000_000),
  deferMaxMs: ms.default(2_000),
  deferMinMs: ms.default(100),
  deferJitterRatio: z.number().min(0).max(10).default(0.25),
  waitMs: z.number().int().min(0).default(0),
  shutdownTimeoutMs: z.number().int().min(0).default(30_000),
  storeRetryMinMs: ms.default(250),
  storeRetryMaxMs: ms.default(15_000),
  storeRetryWindowMs: ms.default(3_600_000),
  concurrencyStarvationMs: ms.default(30_000),
  concurrencySlotReuseMs: z.number().int().min(0).default(1_000),
});

/** Every option name of {@link WorkerTimingOptions}, for the interfaces that extend it. */
export const WORKER_TIMING_OPTION_NAMES = optionNames<WorkerTimingOptions>()([
  'leaseMs', 'heartbeatMs', 'lockDurationMs', 'stalledIntervalMs', 'maxStalledCount', 'deferMaxMs', 'deferMinMs', 'deferJitterRatio',
  'waitMs', 'shutdownTimeoutMs', 'storeRetryMinMs', 'storeRetryMaxMs', 'storeRetryWindowMs', 'concurrencyStarvationMs',
  'concurrencySlotReuseMs',
]);

/** Applies defaults; throws a {@link ValidationError} when the options contradict each other. */
export function resolveWorkerTiming(options: WorkerTimingOptions, defaultLeaseMs: number): ResolvedWorkerTiming {
  const parsed = timingSchema.safeParse({ ...options, leaseMs: options.leaseMs ?? defaultLeaseMs });
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const field = issue.path.join('.');
    throw new ValidationError('INVALID_OPTIONS', field, `Invalid worker option ${field}: ${issue.message}`);
  }
  const o = parsed.data;
  const lockDurationMs = o.lockDurationMs ?? o.leaseMs;
  // A waiter counts for the starvation bound only while it was seen within the bound (it keeps
  // coming back); one deferred longer than the bound is never seen within it, and the bound
  // would silently hold nothing back. The default grows to the longest deferral; a bound set
  // below it is refused (below).
  const longestDeferralMs = Math.round(o.deferMaxMs * (1 + o.deferJitterRatio));
  const resolved: ResolvedWorkerTiming = {
    ...o,
    heartbeatMs: o.heartbeatMs ?? Math.max(1, Math.floor(o.leaseMs / 3)),
    lockDurationMs,
    // Half a lease, at least 1 s (each check is a Redis script on every worker), at most the lock.
    stalledIntervalMs: o.stalledIntervalMs ?? Math.min(lockDurationMs, Math.max(1_000, Math.floor(o.leaseMs / 2))),
    concurrencyStarvationMs: options.concurrencyStarvationMs === undefined ? Math.max(o.concurrencyStarvationMs, longestDeferralMs) : o.concurrencyStarvationMs,
  };
  if (resolved.heartbeatMs * 2 > resolved.leaseMs) {
    throw new ValidationError(
      'INVALID_OPTIONS',
      'heartbeatMs',
      `heartbeatMs (${resolved.heartbeatMs}) must be at most half of leaseMs (${resolved.leaseMs}), ` +
        'so one late heartbeat does not lose the lease.',
    );
  }
  if (resolved.stalledIntervalMs > resolved.lockDurationMs) {
    throw new ValidationError(
      'INVALID_OPTIONS',
      'stalledIntervalMs',
      `stalledIntervalMs (${resolved.stalledIntervalMs}) must not exceed lockDurationMs (${resolved.lockDurationMs}); ` +
        'otherwise a dead worker\'s job waits a whole extra interval before it is redelivered.',
    );
  }
  if (resolved.deferMinMs > resolved.deferMaxMs) {
    throw new ValidationError('INVALID_OPTIONS', 'deferMinMs', `deferMinMs (${resolved.deferMinMs}) exceeds deferMaxMs (${resolved.deferMaxMs}).`);
  }
  if (resolved.concurrencyStarvationMs < longestDeferralMs) {
    throw new ValidationError(
      'INVALID_OPTIONS',
      'concurrencyStarvationMs',
      `concurrencyStarvationMs (${resolved.concurrencyStarvationMs}) must be at least the longest deferral, ` +
        `deferMaxMs × (1 + deferJitterRatio) = ${longestDeferralMs}: a job deferred by its concurrency limit comes back ` +
        'that long after, and a waiter not seen within the bound is not held to it. Raise concurrencyStarvationMs or lower deferMaxMs.',
    );
  }
  if (resolved.storeRetryMinMs > resolved.storeRetryMaxMs) {
    throw new ValidationError(
      'INVALID_OPTIONS',
      'storeRetryMinMs',
      `storeRetryMinMs (${resolved.storeRetryMinMs}) exceeds storeRetryMaxMs (${resolved.storeRetryMaxMs}).`,
    );
  }
  return Object.freeze(resolved);
}

/** The deferral for a duplicate whose key another worker holds for `retryAfterMs` more. */
export function deferralMs(timing: ResolvedWorkerTiming, retryAfterMs: number, random: () => number = Math.random): number {
  const base = Math.min(timing.deferMaxMs, Math.max(timing.deferMinMs, retryAfterMs));
  return Math.round(base * (1 + timing.deferJitterRatio * random()));
}

/**
 * The deferral of a job after a transient store fault, when the job has been deferred (or has
 * stalled) `deferrals` times before: `storeRetryMinMs` doubled per earlier deferral, capped at
 * `storeRetryMaxMs`, plus up to `deferJitterRatio` of it at random, so the jobs a restart
 * interrupted do not all come back at the same instant.
 */
export function storeRetryDelayMs(timing: ResolvedWorkerTiming, deferrals: number, random: () => number = Math.random): number {
  // A job from an older BullMQ has no attemptsStarted: treat it as never deferred.
  const doublings = Number.isFinite(deferrals) ? Math.min(Math.max(0, Math.floor(deferrals)), 30) : 0;
  const base = Math.min(timing.storeRetryMaxMs, timing.storeRetryMinMs * 2 ** doublings);
  return Math.round(base * (1 + timing.deferJitterRatio * random()));
}
