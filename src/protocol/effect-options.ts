import type { GroupRefusal } from './group-refusals.js';
import type { Transaction } from 'kysely';
import type { Claim, ClaimOutcome } from '../store/claim-outcome.js';
import type { HeldRecord } from '../store/one-trip-commit.js';
import type { ConcurrencyRecord, KeyRetention } from '../store/records.js';

// The options and outcomes of IdempotencyKeys's methods (idempotency-keys.ts), apart from the
// class so that each piece of the protocol can name them.

/** Per-claim options of {@link IdempotencyKeys.claim}. */
export interface ClaimOptions {
  /** Lease length for this claim. @defaultValue the instance's `leaseMs` */
  readonly leaseMs?: number;
  /** BullMQ job id that made the claim, kept on the row for operators. @defaultValue unset (a takeover keeps the row's) */
  readonly jobId?: string;
  /** Queue of the job, kept on the row for operators; the sweeper asks this queue about the job. @defaultValue unset */
  readonly queue?: string;
  /** Name of the job, kept on the row for operators (a re-enqueued job gets it). @defaultValue unset */
  readonly jobName?: string;
  /**
   * Payload to keep with the key so the sweeper can re-enqueue a lost job.
   * It must be JSON that Postgres `jsonb` can store (no NUL, no lone surrogate); otherwise the
   * claim throws a `ValidationError` (`INVALID_JOB_DATA`) before sending anything.
   * @defaultValue unset (not stored)
   */
  readonly payload?: unknown;
  /**
   * How long this key is kept once finished, and how long its tombstone lasts: the job's own
   * retention, held to the instance's `maxJobRetentionMs` and `maxJobTombstoneMs` (a part above
   * its bound gets the bound). A malformed value throws a `ValidationError` (`INVALID_OPTIONS`)
   * before anything is sent. Written by the completion or the failure of this claim.
   * @defaultValue unset (the instance's `retentionMs`, the janitor's `tombstoneMs`)
   */
  readonly retention?: KeyRetention;
  /**
   * A release of this claim gives the key an expiry, its retention (as a finished key's) from
   * the release: unless a claim takes it over first, the janitor then deletes it, leaving no
   * tombstone. For a key whose only retry is one that may never come, an HTTP request's (its
   * client's), so that a key nobody retries does not refuse another payload (`key-reused`) for
   * ever. A job's key leaves it unset: its queue retries it, and the key must outlast that. A key
   * left held (its process died before releasing it) gets no expiry: its claim may still
   * complete it, until another takes it over.
   * @defaultValue `false` (a released key is kept until a claim takes it over)
   */
  readonly expireWhenReleased?: boolean;
  /**
   * The concurrency keys and limits the claim's run holds slots of, recorded by the claim's own
   * statement (the key's records of other concurrency keys dropped), so that the sweeper adds the
   * job again under the same limits if the key is lost. A slot taken with
   * {@link IdempotencyKeys.acquireConcurrencySlot} records its key already: this is for a run in a
   * slot taken for another key (a worker's kept slot).
   * @defaultValue unset (nothing recorded)
   */
  readonly concurrency?: readonly ConcurrencyRecord[];
}

/** How an effect may be run: options of {@link IdempotencyKeys.commitEffect}, `runEffect` and `executeOnce`. */
export interface EffectOptions {
  /**
   * The effect only touches this database, through its `tx`, and does nothing else (no call to
   * another system, no queue publish): it may share a group transaction with other effects and
   * run again after its group rolled back, one run committing, without anyone outside the
   * database noticing. Such effects are grouped unless `groupCommit` is false; other effects
   * only when `groupCommit` groups every effect (see {@link IdempotencyOptions.groupCommit}).
   * @defaultValue `false`
   */
  readonly databaseOnly?: boolean;
  /**
   * The effect must never share a transaction (with group commit on): it changes settings or
   * other transaction state from inside a function, where the library cannot see it. An effect
   * that does so in its own statements (`SET LOCAL`, `set_config`) is found out and run alone
   * without being told.
   * @defaultValue `false`
   */
  readonly runsAlone?: boolean;
  /**
   * What runs the effect (a queue and job name, say). Once an effect of a kind is found sending
   * a statement that cannot share a transaction, later effects of that kind run alone from the
   * start. @defaultValue unset (the effect's own queue and job name, when it has them)
   */
  readonly kind?: string;
  /**
   * Told when group commit sends the effect out of its group to run alone, for what it did to
   * the shared transaction (a statement that leaves state, state found after it); the workers
   * log it at debug. @defaultValue unset
   */
  readonly onGroupRefusal?: (refusal: GroupRefusal) => void;
}

/** Options of {@link IdempotencyKeys.commitEffect}. */
export interface CommitEffectOptions extends EffectOptions {
  /** Runs last inside the transaction, before the COMMIT (the chaos suite crashes there). @defaultValue unset */
  readonly beforeCommit?: () => Promise<void> | void;
  /**
   * A step record held back (see {@link IdempotencyKeys.holdStepRecord}), to commit just before
   * the transaction, in the round trip of its first statement. @defaultValue unset
   */
  readonly heldRecord?: HeldRecord;
}

/** Per-call options of {@link IdempotencyKeys.executeOnce}: what is kept on the key, and how the effect may run. */
export interface ExecuteOnceOptions extends Omit<ClaimOptions, 'leaseMs'>, EffectOptions {}

/** What to do with the key when an effect throws: make it claimable again, or fail it for good. */
export type EffectFailureAction = 'release' | 'fail';

/** Options of {@link IdempotencyKeys.runEffect}. */
export interface RunEffectOptions extends EffectOptions {
  /**
   * Decides what a thrown error does to the key. `LeaseLostError` never reaches it (the key is
   * someone else's), nor does {@link StoreUnavailableError} (a store fault: the key is released).
   * @defaultValue `'fail'` for {@link ResultNotStorableError} (the same effect would produce it
   * again), `'release'` for everything else
   */
  readonly onError?: (error: unknown) => EffectFailureAction;
}

/** Outcome of the fast path: the effect ran and committed, or the claim outcome that stopped it. */
export type ExecuteOnceOutcome<T> =
  | {
      /** The effect ran and committed together with the key's completion. */
      readonly kind: 'executed';
      /** The effect's return value (as stored, when a COMMIT cut off in flight was resolved by reading the key). */
      readonly result: T;
      /** The claim the effect ran under. */
      readonly claim: Claim;
    }
  | Exclude<
      ClaimOutcome,
      {
        /** Held outcomes are not returned: the effect ran under them, which is `executed`. */
        kind: 'claimed' | 'taken-over';
      }
    >;

/** A transactional effect: runs on the transaction that also completes the key. */
export type Effect<T> = (tx: Transaction<any>) => Promise<T>;
