import type { KeyRetention } from './records.js';

/** A claim this worker now holds: it may run the effect and must complete, release or fail it. */
export interface Claim {
  /** Namespace of the key (a queue, a tenant); keys are unique per scope. */
  readonly scope: string;
  /** The idempotency key. */
  readonly key: string;
  /** Random token of this claim; completion, extension and release are conditioned on it. */
  readonly owner: string;
  /** Fence at claim time; a takeover bumps it, which fences this claim out. */
  readonly fence: number;
  /** 1 for the first claim, +1 for every takeover. */
  readonly attempts: number;
  /** Lease expiry by the database clock (`null` for a fast-path claim inside its transaction). */
  readonly lockedUntil: Date | null;
  /** What the run asked to keep of its key; the completion and the failure write it. @defaultValue unset (the configured retention and tombstone window) */
  readonly retention?: KeyRetention;
  /** Its release gives the key an expiry, its retention from the release (see `ClaimOptions.expireWhenReleased`). @defaultValue unset (no expiry) */
  readonly expireWhenReleased?: boolean;
}

/**
 * What a claim attempt found. Exactly one of:
 * - `claimed`: the key was new; this worker owns it;
 * - `taken-over`: the key was processing under an expired (or released) lease; this worker owns it now;
 * - `completed`: done before; `result` is the stored result to replay;
 * - `failed`: failed permanently before; `error` is the stored error to replay;
 * - `in-progress`: another owner's lease is live; try again after `retryAfterMs`;
 * - `key-reused`: the key was used with a different fingerprint; never execute.
 */
export type ClaimOutcome =
  | ({
      /** The key was new; this worker owns it. */
      readonly kind: 'claimed';
    } & Claim)
  | ({
      /** The key was processing under an expired (or released) lease; this worker owns it now. */
      readonly kind: 'taken-over';
    } & Claim)
  | {
      /** Done before: replay `result`, do not run the effect. */
      readonly kind: 'completed';
      /** Scope of the key. */
      readonly scope: string;
      /** The idempotency key. */
      readonly key: string;
      /** The stored result of the effect that completed the key (`null` when it expired). */
      readonly result: unknown;
      /** Set when only the key's tombstone is left: it completed, its result has expired. */
      readonly resultExpired?: ExpiredResult;
    }
  | {
      /** Failed permanently before: replay `error`, do not run the effect. */
      readonly kind: 'failed';
      /** Scope of the key. */
      readonly scope: string;
      /** The idempotency key. */
      readonly key: string;
      /** The stored error (see {@link StoredError}) of the run that failed the key. */
      readonly error: unknown;
      /** Set when only the key's tombstone is left: it failed, its stored error has expired. */
      readonly resultExpired?: ExpiredResult;
    }
  | {
      /** Another owner's lease is live: try again later. */
      readonly kind: 'in-progress';
      /** Scope of the key. */
      readonly scope: string;
      /** The idempotency key. */
      readonly key: string;
      /** Milliseconds until the owner's lease ends (or the claim's lock timeout, when it waited on an uncommitted insert of the key): when to try again. */
      readonly retryAfterMs: number;
    }
  | {
      /** The key was used with a different fingerprint (payload): never execute. */
      readonly kind: 'key-reused';
      /** Scope of the key. */
      readonly scope: string;
      /** The idempotency key. */
      readonly key: string;
    };

/** What a key's tombstone says when a duplicate finds it: the key finished, its result is gone. */
export interface ExpiredResult {
  /** When the key finished (database clock). */
  readonly finishedAt: Date;
  /** When its tombstone expires, after which the key is free again (database clock). */
  readonly tombstoneExpiresAt: Date;
}

/** What a claim found when the insert of a key met the key's live tombstone (see `sql/tombstones.ts`). */
export interface TombstoneFound {
  readonly fingerprintMatches: boolean;
  readonly failed: boolean;
  readonly finishedAt: Date;
  readonly expiresAt: Date;
}

/**
 * The claim outcome of meeting a tombstone: `completed` (result `null`) or `failed` (a stored
 * error saying it expired) with `resultExpired` set; `key-reused` for another fingerprint.
 */
export function tombstoneOutcome(input: { readonly scope: string; readonly key: string }, found: TombstoneFound): ClaimOutcome {
  const { scope, key } = input;
  if (!found.fingerprintMatches) return { kind: 'key-reused', scope, key };
  const resultExpired: ExpiredResult = { finishedAt: found.finishedAt, tombstoneExpiresAt: found.expiresAt };
  if (!found.failed) return { kind: 'completed', scope, key, result: null, resultExpired };
  const error = {
    name: 'ResultExpiredError',
    code: 'RESULT_EXPIRED',
    message: `failed at ${found.finishedAt.toISOString()}; its stored error has expired (the key's tombstone lasts until ${found.expiresAt.toISOString()})`,
  };
  return { kind: 'failed', scope, key, error, resultExpired };
}

/** The outcomes in which this worker holds the key: `claimed` and `taken-over`. */
export type HeldClaim = Extract<
  ClaimOutcome,
  {
    /** The outcomes that hold the key. */
    kind: 'claimed' | 'taken-over';
  }
>;

/** True when the outcome means this worker now owns the key and should run the effect. */
export function isHeld(outcome: ClaimOutcome): outcome is HeldClaim {
  return outcome.kind === 'claimed' || outcome.kind === 'taken-over';
}

/**
 * The claim of a key that had no row, inserted as the fast path inserts it (`completed` inside
 * the caller's transaction, so no lease): what `claim_key`, `claim_new_key` and
 * `claim_new_keys` mean when they insert it.
 */
export function freshCompletingClaim(input: { readonly scope: string; readonly key: string; readonly owner: string }): HeldClaim {
  return { kind: 'claimed', scope: input.scope, key: input.key, owner: input.owner, fence: 1, attempts: 1, lockedUntil: null };
}

/**
 * A claim whose wait on a key another transaction held uncommitted ran past its lock timeout
 * (55P03): the key is in progress; try again after that timeout.
 */
export function lockWaitTimedOut(input: { readonly scope: string; readonly key: string; readonly lockTimeoutMs: number }): ClaimOutcome {
  return { kind: 'in-progress', scope: input.scope, key: input.key, retryAfterMs: input.lockTimeoutMs };
}
