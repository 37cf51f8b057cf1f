import { isHeld, type ClaimOutcome } from '../store/claim-outcome.js';
import type { KeyRetention } from '../store/records.js';

/**
 * Longest retention or tombstone window a job may ask for at all: 100 years. Past it a value is
 * taken for a mistake (seconds for milliseconds, a timestamp for a duration) and refused, not
 * bounded; it also keeps `now() + ms` inside Postgres's timestamp range.
 */
export const MAX_RETENTION_CEILING_MS = 3_155_760_000_000;

/** Default bound of a job's result retention ({@link KeyRetention.resultMs}): 30 days. */
export const DEFAULT_MAX_JOB_RETENTION_MS = 2_592_000_000;

/** Default bound of a job's tombstone window ({@link KeyRetention.tombstoneMs}): 365 days. */
export const DEFAULT_MAX_JOB_TOMBSTONE_MS = 31_536_000_000;

/** The bounds a job's own retention is held to. */
export interface RetentionBounds {
  /** Longest result retention a job may ask for. */
  readonly maxJobRetentionMs: number;
  /** Longest tombstone window a job may ask for. */
  readonly maxJobTombstoneMs: number;
}

/** One part of a job's retention that asked for more than its bound, and got the bound. */
export interface ClampedRetention {
  /** `resultMs` or `tombstoneMs`. */
  readonly part: keyof KeyRetention;
  /** What the job asked for. */
  readonly askedMs: number;
  /** The bound it got. */
  readonly boundMs: number;
}

/** What is wrong with a retention, as a `[part, problem]` pair; undefined when it is well formed. */
export function retentionProblem(value: unknown): readonly [field: string, problem: string] | undefined {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) return ['', 'must be an object { resultMs?, tombstoneMs? }'];
  const record = value as Record<string, unknown>;
  const unknownPart = Object.keys(record).find((part) => part !== 'resultMs' && part !== 'tombstoneMs');
  if (unknownPart !== undefined) return [`.${unknownPart}`, `has no part "${unknownPart}" (only resultMs and tombstoneMs)`];
  // Retention 0 would expire the result as it is stored; a tombstone window 0 means "no tombstone".
  for (const [part, least] of [['resultMs', 1], ['tombstoneMs', 0]] as const) {
    const ms = record[part];
    if (ms === undefined) continue;
    if (typeof ms !== 'number' || !Number.isInteger(ms) || ms < least || ms > MAX_RETENTION_CEILING_MS) {
      return [`.${part}`, `${part} must be a whole number of milliseconds from ${least} to ${MAX_RETENTION_CEILING_MS} (100 years), got ${describe(ms)}`];
    }
  }
  return undefined;
}

/**
 * A well-formed retention held to `bounds`: each part above its bound gets the bound, and is
 * listed in `clamped` (for the job's log). Parts left unset stay unset.
 */
export function boundRetention(retention: KeyRetention, bounds: RetentionBounds): { readonly retention: KeyRetention; readonly clamped: readonly ClampedRetention[] } {
  const clamped: ClampedRetention[] = [];
  const bound = (part: keyof KeyRetention, boundMs: number): number | undefined => {
    const askedMs = retention[part];
    if (askedMs === undefined || askedMs <= boundMs) return askedMs;
    clamped.push({ part, askedMs, boundMs });
    return boundMs;
  };
  const resultMs = bound('resultMs', bounds.maxJobRetentionMs);
  const tombstoneMs = bound('tombstoneMs', bounds.maxJobTombstoneMs);
  return {
    retention: { ...(resultMs === undefined ? {} : { resultMs }), ...(tombstoneMs === undefined ? {} : { tombstoneMs }) },
    clamped,
  };
}

/** A held claim carrying the retention its run asked for, which its completion or failure writes; any other outcome as it is. */
export function withRetention<O extends ClaimOutcome>(outcome: O, retention: KeyRetention | undefined): O {
  if (!retention || (retention.resultMs === undefined && retention.tombstoneMs === undefined) || !isHeld(outcome)) return outcome;
  return { ...outcome, retention };
}

/** How long a finished key is kept: the run's own retention, else the configured one. */
export function resultRetentionMs(claim: { readonly retention?: KeyRetention }, configuredMs: number): number {
  return claim.retention?.resultMs ?? configuredMs;
}

function describe(value: unknown): string {
  if (typeof value === 'number') return String(value);
  if (typeof value === 'string') return `the string "${value.slice(0, 40)}"`;
  return value === null ? 'null' : typeof value;
}
