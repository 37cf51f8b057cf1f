import type { Kysely } from 'kysely';
import type { Claim, ClaimOutcome } from './claim-outcome.js';
import type { KeyRecord } from './key-record.js';
import type { LeadingStatements } from './one-trip-commit.js';
import type { ClaimStatementInput } from './sql/claim.js';
import type { LeaseExtension } from './sql/extend.js';
import type { CompletedKeyRow } from './sql/insert-completed-keys.js';
import type { StepRecord } from './sql/load-steps.js';
import type { StepPlace } from './sql/start-step.js';

/**
 * What {@link KeyStore.claim} needs; the schema is the store's own.
 *
 * @interface
 */
export type ClaimInput = Omit<ClaimStatementInput, 'schema'>;

/**
 * The seam between the claim protocol and SQL: every atomic operation on a key, and
 * nothing else. `executor` parameters accept the store's Kysely instance or an open
 * transaction, so operations can join the caller's transaction.
 */
export interface KeyStore {
  /** Schema holding the tables. */
  readonly schema: string;
  /** Claims a key (see `sql/claim.ts`). */
  claim(executor: Kysely<any>, input: ClaimInput): Promise<ClaimOutcome>;
  /**
   * Optional, for the fast path: claims a key that has no row yet inside the open transaction
   * `tx`, as {@link KeyStore.claim} in `'complete'` mode would, more cheaply. Returns undefined
   * when the key has a row: the caller then claims it with `claim`, in the same transaction.
   * Returns `in-progress` when another transaction held the key past `lockTimeoutMs`; `tx` is
   * then aborted, as after such a `claim`.
   */
  claimNewKey?(tx: Kysely<any>, input: ClaimInput): Promise<ClaimOutcome | undefined>;
  /** Fenced completion inside `tx`; false when the claim no longer owns the key. */
  complete(tx: Kysely<any>, claim: Claim, resultJson: string, retentionMs: number): Promise<boolean>;
  /** Stores a fast-path result on a key claimed as completed in `tx`. */
  storeFastPathResult(tx: Kysely<any>, claim: Claim, resultJson: string): Promise<void>;
  /**
   * Optional, for fewer round trips: {@link KeyStore.complete} and the COMMIT of `tx` at once
   * (`tx` is a transaction the store's `runTransaction` began). False when the claim no longer
   * owns the key; the transaction is then still open, for the caller to roll back. Stores
   * without it get `complete` followed by a separate COMMIT.
   */
  completeAndCommit?(tx: Kysely<any>, claim: Claim, resultJson: string, retentionMs: number): Promise<boolean>;
  /** Optional, like {@link KeyStore.completeAndCommit}: {@link KeyStore.storeFastPathResult} and the COMMIT at once. */
  storeFastPathResultAndCommit?(tx: Kysely<any>, claim: Claim, resultJson: string): Promise<void>;
  /**
   * Optional, needed for group commit: the closing statements of a job in a shared transaction,
   * as literal SQL (see `group-transaction.ts`).
   */
  readonly groupStatements?: GroupStatements;
  /**
   * Optional: a read of a key that is already settled, without a transaction: the `completed`,
   * `failed` or `key-reused` outcome a claim would return, or undefined (unknown or still
   * processing: claim it the usual way). The fast path asks this first, so that a duplicate
   * replays in one round trip.
   */
  findSettled?(scope: string, key: string, fingerprint: string): Promise<ClaimOutcome | undefined>;
  /**
   * Extends the lease (see `sql/extend.ts`): the new expiry; `'completed'` when this claim's
   * own completion committed; null when the lease is lost. A wait on the key's row lock longer
   * than `lockTimeoutMs` throws (not known yet: try again later).
   */
  extend(claim: Claim, leaseMs: number, lockTimeoutMs: number): Promise<LeaseExtension>;
  /** Releases the key for an immediate retry; false when the claim no longer owns it. */
  release(claim: Claim, errorJson: string | null): Promise<boolean>;
  /** Fails the key permanently; false when the claim no longer owns it. */
  fail(claim: Claim, errorJson: string, retentionMs: number): Promise<boolean>;
  /** Reads one key. */
  get(scope: string, key: string): Promise<KeyRecord | undefined>;
  /** Optional, needed for multi-step jobs (`ctx.step`): the step records of keys. */
  readonly steps?: StepStore;
}

/**
 * The step records of multi-step jobs (see `sql/record-step.ts`). Starting and recording are
 * fenced: they succeed only for the key's current owner token and fence, `processing`.
 */
export interface StepStore {
  /** A key's steps in position order (one statement). */
  load(scope: string, key: string): Promise<StepRecord[]>;
  /**
   * Marks an external step started: its start count, this one included; undefined when the
   * claim lost the key. `lead` (the previous step's held record, from {@link StepStore.recordText})
   * rides in the same round trip, before the start, when the store can send both at once.
   */
  start(claim: Claim, step: StepPlace, lead?: LeadingStatements): Promise<number | undefined>;
  /**
   * Optional, for fewer round trips: a step's record as one self-contained statement of literal
   * SQL, which fails only by raising the lease-lost SQLSTATE. A run holds an external step's
   * record back in this form until its next round trip carries it. Without it, each external
   * step's record is a round trip of its own.
   */
  recordText?(claim: Claim, step: StepPlace, resultJson: string): string;
  /** Records a step's result as a statement of its own; false when the claim lost the key (or the step was recorded). */
  record(claim: Claim, step: StepPlace, resultJson: string): Promise<boolean>;
  /**
   * Records a database step's result inside `tx` (a transaction the store's `runTransaction`
   * began) and commits it, in one round trip when the store can. False when refused; the
   * transaction is then still open, for the caller to roll back.
   */
  recordAndCommit(tx: Kysely<any>, claim: Claim, step: StepPlace, resultJson: string): Promise<boolean>;
}

/** The statements group commit needs from a store, as literal SQL (no bind parameters). */
export interface GroupStatements {
  /** The fenced completion; it must fail when the claim no longer owns the key. */
  completion(claim: Claim, resultJson: string, retentionMs: number): string;
  /** Stores a fast-path result on a key claimed as completed in this transaction. */
  fastPathResult(claim: Claim, resultJson: string): string;
  /** What a failed closing statement means: the lease was lost, or an error to report as it is (mapped). */
  explainFailure(
    error: unknown,
    claim: Claim,
  ):
    | {
        /** The claim no longer owns the key: the job's effect must not count. */
        readonly leaseLost: true;
      }
    | {
        /** Any other failure, mapped as the store maps its errors (a {@link StoreUnavailableError}, say). */
        readonly error: unknown;
      };
  /**
   * Optional, for optimistic groups: the fast path's keys of a whole group, inserted as
   * `completed` with their results, as literal SQL that rides with the COMMIT. It must fail
   * (not skip the key) when a key has a row. Without it, groups are careful only.
   */
  insertCompletedKeys?(rows: readonly CompletedKeyRow[], lockTimeoutMs: number): string[];
  /**
   * Optional, for fewer round trips: the fast path's claims of a whole group at once. Without
   * it, each job of a group claims its own key.
   */
  readonly newKeyClaims?: NewKeyClaims;
}

/**
 * Claims, in one statement on a group's open transaction, every key that has no row yet, as a
 * fast-path (`'complete'` mode) claim would; and undoes one such claim within the transaction.
 */
export interface NewKeyClaims {
  /**
   * For each input (`'complete'` mode), whether it was claimed (fresh key: fence 1, attempts 1,
   * owner `input.owner`). Inputs not claimed are left for their jobs to claim as usual (an
   * existing row, or a key repeated in `inputs`). It may throw (a `lock_timeout`, say); the
   * caller runs it inside a savepoint and rolls back to it.
   */
  claim(tx: Kysely<any>, inputs: readonly ClaimInput[]): Promise<readonly boolean[]>;
  /** Literal SQL that undoes one claim of {@link NewKeyClaims.claim} in the same transaction (its job failed). */
  undo(claim: Claim): string;
}
