/** A claim this worker now holds: it may run the effect and must complete, release or fail it. */
export interface Claim {
  readonly scope: string;
  readonly key: string;
  /** Random token of this claim; completion, extension and release are conditioned on it. */
  readonly owner: string;
  /** Fence at claim time; a takeover bumps it, which fences this claim out. */
  readonly fence: number;
  /** 1 for the first claim, +1 for every takeover. */
  readonly attempts: number;
  /** Lease expiry by the database clock (`null` for a fast-path claim inside its transaction). */
  readonly lockedUntil: Date | null;
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
  | ({ readonly kind: 'claimed' } & Claim)
  | ({ readonly kind: 'taken-over' } & Claim)
  | { readonly kind: 'completed'; readonly scope: string; readonly key: string; readonly result: unknown }
  | { readonly kind: 'failed'; readonly scope: string; readonly key: string; readonly error: unknown }
  | { readonly kind: 'in-progress'; readonly scope: string; readonly key: string; readonly retryAfterMs: number }
  | { readonly kind: 'key-reused'; readonly scope: string; readonly key: string };

/** The outcomes in which this worker holds the key. */
export type HeldClaim = Extract<ClaimOutcome, { kind: 'claimed' | 'taken-over' }>;

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
