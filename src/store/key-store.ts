import type { CompiledQuery, Kysely } from 'kysely';
import type { Claim, ClaimOutcome } from './claim-outcome.js';
import type { HeldRecord } from './one-trip-commit.js';
import type { ClaimInput, CoalesceArrival, CompletedKeyRow, KeyRecord, LeaseExtension, StepPlace, StepRecord } from './records.js';
import type { SlotAnswer, SlotRequest } from './sql/concurrency-slots.js';
import type { HeldSlot } from './sql/concurrency-slot-wakes.js';
import type { SlotsInTransactionAnswer, SlotsInTransactionRequest } from './sql/concurrency-slots-in-transaction.js';
import type { CoalesceAnswer, CoalesceSuccessor } from './records.js';

/**
 * The seam between the claim protocol and SQL: every atomic operation on a key, and
 * nothing else. `executor` parameters accept the store's Kysely instance or an open
 * transaction, so operations can join the caller's transaction.
 *
 * Not stable: may change in a minor release.
 *
 * @experimental
 */
export interface KeyStore {
  /** Schema holding the tables. */
  readonly schema: string;
  /** Takes a slot of a concurrency group for a key about to run, or says when to ask again (see `sql/concurrency-slots.ts`). */
  acquireSlot?(request: SlotRequest): Promise<SlotAnswer>;
  /**
   * Frees a slot taken by {@link acquireSlot}; false when it was no longer held. Wakes the
   * group's oldest waiter not woken within `wakeAgainAfterMs` (see `sql/concurrency-slot-wakes.ts`).
   */
  releaseSlot?(group: string, slot: number, owner: string, wakeAgainAfterMs: number): Promise<boolean>;
  /** Renews slots a run still holds, for `leaseMs` from now; how many were still its own (see `sql/concurrency-slot-wakes.ts`). */
  renewSlots?(slots: readonly HeldSlot[], leaseMs: number): Promise<number>;
  /**
   * Takes a slot of each concurrency key for as long as the open transaction `tx` lasts, or names
   * the first one at its limit (see `sql/concurrency-slots-in-transaction.ts`).
   */
  takeSlotsInTransaction?(tx: Kysely<any>, request: SlotsInTransactionRequest): Promise<SlotsInTransactionAnswer>;
  /** Forgets a key as a waiter of `groups`, once it runs in their slots (see `sql/concurrency-slots-in-transaction.ts`). */
  forgetSlotWaiter?(groups: readonly string[], scope: string, key: string): Promise<void>;
  /** Wakes the oldest waiter of each group not woken within `wakeAgainAfterMs` (see `sql/concurrency-slots-in-transaction.ts`). */
  wakeSlotWaiters?(groups: readonly string[], wakeAgainAfterMs: number): Promise<number>;
  /** A coalescing job arrives: run a generation, or fold into the run in flight (see `sql/coalescing.ts`). */
  coalesceArrive?(input: CoalesceArrival): Promise<CoalesceAnswer>;
  /** The running job's generation ended: the pending successor's generation and payload, if any. */
  coalesceNext?(input: { scope: string; key: string; jobId: string; generation: number }): Promise<CoalesceSuccessor | undefined>;
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
  /**
   * Stores a fast-path result (`null`: none) and the claim's own tombstone window on a key
   * claimed as completed in `tx`. `windowLate`: `tx` has run long since the claim (longer than
   * half of `windowStartToleranceMs` of `retention-window.ts`), so the key's retention window,
   * which the claim started at the transaction's start, is moved to start now if it is late by
   * more than that tolerance.
   */
  storeFastPathResult(tx: Kysely<any>, claim: Claim, resultJson: string | null, windowLate?: boolean): Promise<void>;
  /**
   * Optional, for fewer round trips: {@link KeyStore.complete} and the COMMIT of `tx` at once
   * (`tx` is a transaction the store's `runTransaction` began). False when the claim no longer
   * owns the key; the transaction is then still open, for the caller to roll back. Stores
   * without it get `complete` followed by a separate COMMIT.
   */
  completeAndCommit?(tx: Kysely<any>, claim: Claim, resultJson: string, retentionMs: number): Promise<boolean>;
  /** Optional, like {@link KeyStore.completeAndCommit}: {@link KeyStore.storeFastPathResult} and the COMMIT at once. */
  storeFastPathResultAndCommit?(tx: Kysely<any>, claim: Claim, resultJson: string | null, windowLate?: boolean): Promise<void>;
  /**
   * Optional, needed for group commit: the statements that end a job's part of a shared
   * transaction (see `protocol/group-commit.ts`).
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
  /**
   * Releases the key for an immediate retry; false when the claim no longer owns it. With
   * `expiresInMs`, the released key expires that long from now (the janitor deletes it unless a
   * claim takes it over first).
   */
  release(claim: Claim, errorJson: string | null, expiresInMs?: number | null): Promise<boolean>;
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
 *
 * Not stable: may change in a minor release.
 *
 * @experimental
 */
export interface StepStore {
  /** A key's steps in position order (one statement). */
  load(scope: string, key: string): Promise<StepRecord[]>;
  /**
   * Marks an external step started: its start count, this one included; undefined when the
   * claim lost the key. `heldRecord` (the previous step's held record, from {@link StepStore.recordStatement})
   * rides in the same round trip, before the start, when the store can send both at once.
   */
  start(claim: Claim, step: StepPlace, heldRecord?: HeldRecord): Promise<number | undefined>;
  /**
   * Optional, for fewer round trips: a step's record as one self-contained statement, which
   * fails by raising the lease-lost SQLSTATE when the claim lost the key. A run holds an external
   * step's record back in this form until its next round trip carries it. Without it, each
   * external step's record is a round trip of its own.
   */
  recordStatement?(claim: Claim, step: StepPlace, resultJson: string): CompiledQuery;
  /** Records a step's result as a statement of its own; false when the claim lost the key (or the step was recorded). */
  record(claim: Claim, step: StepPlace, resultJson: string): Promise<boolean>;
  /**
   * Records a database step's result inside `tx` (a transaction the store's `runTransaction`
   * began) and commits it, in one round trip when the store can. False when refused; the
   * transaction is then still open, for the caller to roll back.
   */
  recordAndCommit(tx: Kysely<any>, claim: Claim, step: StepPlace, resultJson: string): Promise<boolean>;
  /**
   * Optional, for database steps in a data layer of the user's own: records a database step's
   * result inside `tx`, a transaction the data layer commits (the record is its last
   * statement). False when refused; the data layer then rolls the transaction back. Without
   * it, such steps throw `StepsUnsupportedError`.
   */
  recordIn?(tx: Kysely<any>, claim: Claim, step: StepPlace, resultJson: string): Promise<boolean>;
}

/** What a store's database gives group commit to watch (see `sql/group-settings.ts`). */
export interface WatchedState {
  /** The settings whose values a group compares. */
  readonly names: readonly string[];
  /**
   * Whether code stored in the database (a function, a trigger's, a view's) could leave state in
   * a job's transaction where the statement screen cannot see it: if so, the state is compared
   * after each job; if not, at the group's end only.
   */
  readonly codeCanLeaveState: boolean;
}

/**
 * The statements group commit needs from a store. Each goes in the pipeline of the group's
 * COMMIT, with its own parameters; the group reads from Postgres's answer which one failed.
 *
 * Not stable: may change in a minor release.
 *
 * @experimental
 */
export interface GroupStatements {
  /** The fenced completion of a leased job; it must fail (not do nothing) when the claim no longer owns the key. */
  completion(claim: Claim, resultJson: string, retentionMs: number): CompiledQuery;
  /**
   * Optional, for the fast path in groups: the new keys of the group's jobs, inserted as
   * `completed` with their results. It must fail when a key has a row, and say which
   * (`keysWithRows`). Without it, fast-path jobs run alone.
   */
  readonly completedKeys?: {
    /** The statement, and the rows in the order its failure names them. */
    insert(
      rows: readonly CompletedKeyRow[],
      lockTimeoutMs: number,
    ): {
      /** The insert. */
      readonly statement: CompiledQuery;
      /** `rows` in the order the statement takes them (and its error names them). */
      readonly rows: readonly CompletedKeyRow[];
    };
    /** The rows whose keys had a row, read from the insert's error; undefined when the error does not say. */
    keysWithRows(error: unknown, rows: readonly CompletedKeyRow[]): CompletedKeyRow[] | undefined;
  };
  /**
   * Optional: the statements that keep the shared transaction's state at a group's start and
   * compare it after each job or at the group's end (see `sql/group-settings.ts`). Without them,
   * a job that leaves state inside a function goes unnoticed; one that does it in its own
   * statement is still caught by the statement screen.
   */
  readonly state?: {
    /** What to watch on this store's database (read once). */
    watched(): Promise<WatchedState>;
    /** Keeps the state (the settings' values among it) with the group's BEGIN. */
    keep(names: readonly string[]): CompiledQuery;
    /**
     * Fails (so no statement after it runs) when the state differs from what `keep` kept;
     * prepared statements compared only with `preparedStatements` (see `checkPreparedStatements`).
     */
    check(names: readonly string[], options: { readonly preparedStatements: boolean }): CompiledQuery;
    /** Fails when the session's prepared statements made by SQL differ from what `keep` kept (once, at a group's end). */
    checkPreparedStatements(names: readonly string[]): CompiledQuery;
  };
}
