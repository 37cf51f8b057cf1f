/**
 * The claim protocol's facade, and its words. One name per concept, here and everywhere:
 *
 * - **claim**: taking a key for one run: `INSERT … ON CONFLICT DO NOTHING`, or taking over a key
 *   whose lease ended. Its {@link ClaimOutcome} says whether this run holds the key (a *held*
 *   claim: `claimed`, `taken-over`) or what else it found (`completed`, `failed`, `key-reused`,
 *   `in-progress`).
 * - **lease**: how long a held claim owns the key, by the database clock; a heartbeat extends it.
 *   A dead worker's key is taken over once its lease ends.
 * - **owner**: the claim's random token, kept on the key's row while the claim holds it.
 * - **fence**: the claim's number, one more at every claim and takeover. Completion, release,
 *   failure and every step are conditioned on owner and fence, so a run whose key was taken over
 *   (a zombie) changes nothing.
 * - **settled**: a key that is `completed` or `failed`, final until the janitor deletes it; a
 *   duplicate replays it.
 * - **effect**: what a job does in the database, on the transaction that also completes its key;
 *   the **effect boundary** is that transaction ({@link IdempotencyKeys.commitEffect}).
 * - **fast path**: the claim (as `completed`) and the effect in one transaction, no lease
 *   ({@link IdempotencyKeys.executeOnce}), for effects entirely in this database.
 * - **database-only**: a handler or effect that only touches this database through its `tx`, so a
 *   rolled-back run is invisible outside it: the fast path and group commit are safe for it.
 * - **group**: effects of concurrent jobs sharing one transaction and one COMMIT (group commit).
 *   Gathered: the group's statements sent together, as long as that equals running its jobs one
 *   after another; otherwise one after another. A job that cannot share runs **alone**, in a
 *   transaction of its own.
 * - **held record**: an external step's record held back to ride, with its own COMMIT, in front
 *   of the run's next round trip (a `HeldRecord`).
 * - **pipeline**: statements sent together on one connection without waiting for each reply; one
 *   round trip for all of them.
 *
 * The pieces: the effect boundary (`effect-boundary.ts`), the fast path (`fast-path.ts`), the
 * step records (`step-calls.ts`), a COMMIT cut off in flight (`interrupted-commit.ts`), the store's
 * statements as store faults (`store-calls.ts`).
 */
import { randomUUID } from 'node:crypto';
import type { Kysely, Transaction } from 'kysely';
import { LeaseLostError, ResultNotStorableError, StoreUnavailableError, ValidationError } from '../errors.js';
import { isHeld, type Claim, type ClaimOutcome } from '../store/claim-outcome.js';
import type { DataLayer } from '../store/data-layer.js';
import type { KeyStore } from '../store/key-store.js';
import type { HeldRecord } from '../store/one-trip-commit.js';
import { checkDataLayer } from '../store/foreign-transaction.js';
import { PostgresKeyStore } from '../store/postgres-key-store.js';
import { DataLayerBoundary } from './data-layer-boundary.js';
import type { KeyRecord, LeaseExtension, StepPlace, StepRecord } from '../store/records.js';
import { traceClaim, traceReleaseOrFail } from '../telemetry/claim-tracing.js';
import { EffectBoundary } from './effect-boundary.js';
import type {
  ClaimOptions,
  CommitEffectOptions,
  Effect,
  EffectFailureAction,
  ExecuteOnceOptions,
  ExecuteOnceOutcome,
  RunEffectOptions,
} from './effect-options.js';
import { FastPath, claimInput, claimRetention } from './fast-path.js';
import { resultRetentionMs, withRetention } from './key-retention.js';
import { GroupCommitter } from './group-commit.js';
import { resolveIdempotencyOptions, type IdempotencyOptions, type ResolvedIdempotencyOptions } from './idempotency-options.js';
import type { ProtocolParts } from './protocol-parts.js';
import { StepCalls } from './step-calls.js';
import { keyIdentity, storeCall } from './store-calls.js';
import { UncertainClaims } from './uncertain-claims.js';
import { assertValidKeyPart, serializePayload, serializeResult, toStoredError, type FailedStep } from './validate.js';
import type { CoalesceAnswer, CoalesceSuccessor } from '../store/records.js';

/** No slot: the concurrency group is at its limit (see {@link IdempotencyKeys.acquireConcurrencySlot}). */
export interface ConcurrencySlotRefused {
  /** Always false: every slot of the group is held. */
  readonly acquired: false;
  /** When to ask again. */
  readonly retryAfterMs: number;
}

/** A slot of a concurrency group, held by one run (see {@link IdempotencyKeys.acquireConcurrencySlot}). */
export interface ConcurrencySlot {
  /** Always true: a slot was taken. */
  readonly acquired: true;
  /** The concurrency key: the group whose slots are limited. */
  readonly group: string;
  /** Which of the group's slots (0 … limit − 1). */
  readonly slot: number;
  /** The slot's owner token: only this run frees it. */
  readonly owner: string;
  /** When taken, another key of the group was waiting for a slot. @defaultValue `false` */
  readonly othersWaiting?: boolean;
}

/**
 * The claim protocol over the `idempotency_keys` table: claim a key under a lease, run the
 * effect and complete the key in one transaction (fenced), or release/fail it.
 *
 * Transient store faults (Postgres restarting, a dropped connection, a serialization failure,
 * a lock or statement timeout of the key's own statements) come out of every method as
 * {@link StoreUnavailableError}: nothing about the key was decided, try again later. A COMMIT
 * cut off in flight is resolved by reading the key before anything is thrown.
 *
 * @example
 * ```ts
 * import { IdempotencyKeys, isHeld } from 'idempotent-jobs';
 *
 * const keys = new IdempotencyKeys({ db, leaseMs: 30_000 });
 * const request = { orderId: 'order-42', cents: 1999 };
 * const outcome = await keys.claim('payments', request.orderId, keys.fingerprint(request));
 * if (isHeld(outcome)) {
 *   // The ledger row and the key's completion commit together, fenced by the claim.
 *   const receipt = await keys.runEffect(outcome, async (tx) => {
 *     await tx.insertInto('ledger').values({ order_id: request.orderId, cents: request.cents }).execute();
 *     return { charged: request.cents };
 *   });
 *   console.log('charged', receipt);
 * } else if (outcome.kind === 'completed') {
 *   console.log('done before', outcome.result); // replay; nothing ran
 * } else if (outcome.kind === 'in-progress') {
 *   console.log(`another worker holds it; try again in ${outcome.retryAfterMs} ms`);
 * } else {
 *   console.log(outcome.kind); // 'failed' (replay the stored error) or 'key-reused' (never run)
 * }
 * ```
 */
export class IdempotencyKeys {
  readonly #options: ResolvedIdempotencyOptions;
  readonly #store: KeyStore;
  readonly #parts: ProtocolParts;
  readonly #effects: EffectBoundary;
  readonly #fastPath: FastPath;
  readonly #dataLayers: DataLayerBoundary;
  readonly #steps: StepCalls;
  readonly #uncertainClaims = new UncertainClaims();

  constructor(options: IdempotencyOptions, store?: KeyStore) {
    this.#options = resolveIdempotencyOptions(options);
    this.#store = store ?? new PostgresKeyStore(this.#options.db, this.#options.schema);
    this.#parts = { options: this.#options, store: this.#store, group: this.#groupOfEffects(options) };
    this.#effects = new EffectBoundary(this.#parts);
    this.#fastPath = new FastPath(this.#parts);
    this.#dataLayers = new DataLayerBoundary(this.#parts);
    this.#steps = new StepCalls(this.#parts);
  }

  /**
   * The group effects may join when group commit is on (see `group-commit.ts`): every effect, or
   * only database-only ones (`effects`).
   */
  #groupOfEffects(options: IdempotencyOptions): ProtocolParts['group'] {
    const { groupCommit } = this.#options;
    if (!groupCommit) return undefined;
    const statements = this.#store.groupStatements;
    if (statements) {
      const committer = new GroupCommitter(this.#options.db, statements, { ...groupCommit, lockTimeoutMs: this.#options.claimLockTimeoutMs });
      return { committer, statements, effects: groupCommit.effects };
    }
    // Asked for: refuse. By default (database-only effects), such a store runs them alone.
    if (options.groupCommit !== undefined) {
      throw new ValidationError('INVALID_OPTIONS', 'groupCommit', 'groupCommit needs a store that offers groupStatements (PostgresKeyStore does).');
    }
    return undefined;
  }

  /** The resolved options (defaults applied). */
  get options(): ResolvedIdempotencyOptions {
    return this.#options;
  }

  /** The Kysely instance effects run on. */
  get db(): Kysely<any> {
    return this.#options.db;
  }

  /** Fingerprint of what identifies a request, with the configured fingerprinter. */
  fingerprint(identity: unknown): string {
    return this.#options.fingerprint(identity);
  }

  /**
   * Claims `key` in `scope` under a lease (one round trip unless a concurrent writer races it).
   * See {@link ClaimOutcome} for the six outcomes.
   */
  async claim(scope: string, key: string, fingerprint: string, options: ClaimOptions = {}): Promise<ClaimOutcome> {
    assertValidKeyPart('scope', scope);
    assertValidKeyPart('key', key);
    const identity = keyIdentity({ scope, key });
    const fresh = claimInput(this.#parts, { scope, key, fingerprint, mode: 'lease' }, options);
    // A claim of this key whose outcome is unknown may hold it: asked under its token, it is this one.
    const uncertainToken = this.#uncertainClaims.take(identity);
    const input = uncertainToken === undefined ? fresh : { ...fresh, owner: uncertainToken };
    const retention = claimRetention(this.#parts, options);
    let outcome: ClaimOutcome;
    try {
      outcome = await traceClaim(scope, key, options.queue, () => storeCall(scope, key, 'claim', () => this.#store.claim(this.db, input)));
    } catch (error) {
      // Whatever the last fault was, an earlier ask may have committed; a token that never did is as good as a new one.
      if (error instanceof StoreUnavailableError) this.#uncertainClaims.remember(identity, input.owner, input.leaseMs);
      throw error;
    }
    const held = withRetention(outcome, retention);
    return options.expireWhenReleased === true && isHeld(held) ? { ...held, expireWhenReleased: true } : held;
  }

  /**
   * Fenced completion inside the caller's transaction: stores `result` and marks the key
   * completed, or throws {@link LeaseLostError} (so the caller's transaction, effect included,
   * rolls back) when the claim was taken over. Throws {@link ResultNotStorableError} for a
   * result that is not JSON or exceeds `maxResultBytes`.
   */
  async complete(tx: Kysely<any>, claim: Claim, result: unknown): Promise<void> {
    const json = serializeResult(claim.scope, claim.key, result, this.#options.maxResultBytes);
    const completed = await storeCall(claim.scope, claim.key, 'completion', () => this.#store.complete(tx, claim, json, resultRetentionMs(claim, this.#options.retentionMs)));
    if (!completed) throw new LeaseLostError(claim.scope, claim.key, claim.fence);
  }

  /**
   * The effect boundary: opens a transaction, runs `effect(tx)`, completes the claim in that
   * same transaction with the effect's return value, and commits both or neither. If the
   * effect throws, nothing commits and the key is released (or failed, per `onError`) before
   * the error is rethrown. Returns the effect's value.
   *
   * Besides the effect's own errors it throws {@link LeaseLostError} when the claim was taken
   * over (the effect rolled back; the key is the new owner's, so it is left alone),
   * {@link StoreUnavailableError} on a transient store fault (the key is released, or left to its
   * lease when Postgres cannot be reached: try again later) and {@link ResultNotStorableError} for a result that is not JSON or exceeds
   * `maxResultBytes` (the key fails, unless `onError` says otherwise).
   */
  async runEffect<T>(claim: Claim, effect: Effect<T>, options: RunEffectOptions = {}): Promise<T> {
    try {
      return await this.commitEffect(claim, effect, options);
    } catch (error) {
      if (!(error instanceof LeaseLostError)) {
        // A store fault says nothing about the effect: never a stored failure.
        const action = error instanceof StoreUnavailableError ? 'release' : (options.onError ?? defaultFailureAction)(error);
        await this.#releaseOrFail(claim, error, action);
      }
      throw error;
    }
  }

  /**
   * The effect boundary without failure handling: `effect(tx)` and the fenced completion in one
   * transaction; on any error nothing commits and the key is left as it was (still held by
   * `claim`), for the caller to release or fail. `beforeCommit` runs last inside the
   * transaction (the chaos suite crashes there).
   *
   * Throws {@link StoreUnavailableError} when the transaction met a transient store fault,
   * including one that `effect`'s own statements met on the transaction's connection (it broke,
   * a serialization failure, a deadlock; not a lock or statement timeout, which is the effect's
   * own error). When the fault cut off the COMMIT, whether it committed is read from the key:
   * completed under this claim's owner and fence, and the stored result is returned.
   *
   * `options.heldRecord`, a step record held back (see {@link IdempotencyKeys.holdStepRecord}),
   * commits just before the transaction, in the round trip of its first statement (under group commit, on
   * its own first). Refused, it throws {@link LeaseLostError} and nothing else runs; its state
   * tells the caller whether it went.
   *
   * `options.databaseOnly` says the effect may share a group transaction (see {@link EffectOptions}).
   */
  commitEffect<T>(claim: Claim, effect: Effect<T>, options: CommitEffectOptions = {}): Promise<T> {
    return this.#effects.commit(claim, effect, options);
  }

  /**
   * {@link IdempotencyKeys.commitEffect} in a data layer of your own (see {@link DataLayer}):
   * the data layer opens the transaction, `effect(tx)` runs on its transaction object, and the
   * key's fenced completion runs last inside that same transaction through the data layer's
   * raw-SQL call. When the claim no longer owns the key, {@link LeaseLostError} is thrown inside
   * the transaction, so the data layer rolls the effect back. Never in a group (group commit
   * shares one connection's transaction; a data layer's is on its own pool). A step record held
   * back goes alone, just before the transaction.
   *
   * An effect that caught the error of a failed statement leaves its transaction aborted: the
   * completion then fails, nothing commits, and {@link AbortedEffectTransactionError} is thrown.
   * The first transaction of each data layer checks that it meets the keys in one database
   * ({@link DataLayerElsewhereError} otherwise).
   */
  commitEffectIn<Tx, T>(claim: Claim, layer: DataLayer<Tx>, effect: (tx: Tx) => Promise<T>, options: CommitEffectOptions = {}): Promise<T> {
    return this.#dataLayers.commit(claim, layer, effect, options);
  }

  /**
   * Checks, in one transaction of `layer`, that it meets the keys in one database: the same
   * server and database, the keys' table visible. A worker given the data layer runs it at
   * start, so that a data layer pointed at another database stops the start instead of meeting
   * its first job. Rejects with {@link DataLayerElsewhereError} (naming the fix) when it does not,
   * or with the driver's error when the check could not be carried out (Postgres unreachable).
   * A layer that passed is not checked again at its first transaction.
   */
  checkDataLayer(layer: DataLayer<unknown>): Promise<void> {
    return checkDataLayer(this.#parts.options.db, this.#parts.options.schema, layer);
  }

  /**
   * {@link IdempotencyKeys.executeOnce} in a data layer of your own (see {@link DataLayer}): the
   * key is claimed as `completed`, the effect runs and its result is stored, all in the data
   * layer's one transaction. Never in a group.
   */
  executeOnceIn<Tx, T>(
    scope: string,
    key: string,
    fingerprint: string,
    layer: DataLayer<Tx>,
    effect: (tx: Tx, claim: Claim) => Promise<T>,
    options: ExecuteOnceOptions = {},
  ): Promise<ExecuteOnceOutcome<T>> {
    assertValidKeyPart('scope', scope);
    assertValidKeyPart('key', key);
    return this.#dataLayers.execute(scope, key, fingerprint, layer, effect, options);
  }

  /**
   * Records a permanent failure for a key nobody holds (the fast path's last attempt failed
   * and rolled its claim back): claims it and fails it. Returns the claim outcome when the key
   * turned out to be held or settled by someone else, in which case nothing was recorded
   * (`in-progress` with `retryAfterMs` 0 also when another claim took the key over between this
   * claim and its failure). The payload is not kept. If the failure cannot be stored, the key is
   * released (never left `processing`) and the store's error is thrown.
   */
  async recordFailure(scope: string, key: string, fingerprint: string, error: unknown, options: ClaimOptions = {}): Promise<ClaimOutcome> {
    // No payload: it is kept only for re-enqueueing a key left processing, which this one is
    // not, and a payload that cannot be stored may be the very failure being recorded.
    const { payload: _, ...withoutPayload } = options;
    const outcome = await this.claim(scope, key, fingerprint, withoutPayload);
    if (!isHeld(outcome)) return outcome;
    let recorded: boolean;
    try {
      recorded = await this.fail(outcome, error);
    } catch (failure) {
      // Never leave the key processing (claimed by nobody who will finish it) for the sweeper.
      await this.release(outcome, error).catch(() => {});
      throw failure;
    }
    // Taken over in between: the new owner decides the key's outcome.
    return recorded ? outcome : { kind: 'in-progress', scope, key, retryAfterMs: 0 };
  }

  /**
   * The single-transaction fast path for effects that only touch this database: the key is
   * claimed as `completed` and the effect runs in one transaction, so one commit covers both.
   * A concurrent duplicate waits on the key's index entry (at most `claimLockTimeoutMs`, then
   * it sees `in-progress`) and after the commit sees `completed`. Interoperates with leased
   * claims: it takes over an expired or released lease, and defers to a live one.
   *
   * If the effect throws, the transaction rolls back and the key is exactly as before.
   *
   * When the store offers {@link KeyStore.findSettled} (the Postgres store does), a key that is
   * already settled is answered from that one read first, without opening a transaction.
   *
   * Transient store faults throw {@link StoreUnavailableError} as in {@link commitEffect}; a
   * COMMIT cut off in flight is resolved by reading the key (completed under this claim's owner
   * token and fence: `executed`, with the stored result).
   *
   * `options.databaseOnly` says the effect may share a group transaction (see {@link EffectOptions}).
   */
  executeOnce<T>(
    scope: string,
    key: string,
    fingerprint: string,
    effect: (tx: Transaction<any>, claim: Claim) => Promise<T>,
    options: ExecuteOnceOptions = {},
  ): Promise<ExecuteOnceOutcome<T>> {
    assertValidKeyPart('scope', scope);
    assertValidKeyPart('key', key);
    return this.#fastPath.execute(scope, key, fingerprint, effect, options);
  }

  /**
   * Takes one of `limit` slots of concurrency group `group` for the key about to run, or says
   * when to ask again (the group is at its limit): one statement, serialized per group in
   * Postgres, so the limit holds across every worker. A slot is held for `leaseMs`, renewed by
   * {@link renewConcurrencySlots} while the run goes on (a crashed worker's slot frees when its
   * time is up); free it with {@link releaseConcurrencySlot} when the run
   * ends. A job that has waited `starvationMs` goes before every job of the group that has
   * waited less. A job that names several groups takes a slot of each, sorted by group, and
   * passes them all as `groups` (what the key's record keeps for the sweeper). Refused, the job
   * is recorded as a waiter under `jobId` and `queue` when given: a run that frees a slot of the
   * group names the oldest waiter on a notification, for its worker to wake it. A run longer
   * than `leaseMs` keeps its slots with {@link renewConcurrencySlots}. Transient store faults
   * throw {@link StoreUnavailableError}.
   */
  async acquireConcurrencySlot(
    scope: string,
    key: string,
    group: { readonly key: string; readonly limit: number },
    options: { readonly leaseMs?: number; readonly starvationMs: number; readonly groups?: readonly string[]; readonly jobId?: string; readonly queue?: string },
  ): Promise<ConcurrencySlot | ConcurrencySlotRefused> {
    const acquire = this.#store.acquireSlot?.bind(this.#store);
    if (!acquire) throw new ValidationError('INVALID_OPTIONS', 'store', 'This key store has no concurrency slots (acquireSlot).');
    const owner = randomUUID();
    const answer = await storeCall(scope, key, 'concurrency slot', () =>
      acquire({
        group: group.key,
        limit: group.limit,
        scope,
        key,
        owner,
        leaseMs: options.leaseMs ?? this.#options.leaseMs,
        starvationMs: options.starvationMs,
        ...(options.groups && { groups: options.groups }),
        ...(options.jobId !== undefined && { jobId: options.jobId }),
        ...(options.queue !== undefined && { queue: options.queue }),
      }),
    );
    return answer.acquired ? { acquired: true, group: group.key, slot: answer.slot, owner, othersWaiting: answer.othersWaiting } : answer;
  }

  /**
   * A job of a coalescing key arrives (explicit coalescing mode: one running job plus at most one
   * pending successor per key, the newest payload winning): `run` a generation (each one its own
   * idempotency key, `<key>#<generation>`, so each run's effect commits once) with the payload to
   * run it with, `coalesced` (a run is in flight and this payload is now its pending successor's,
   * or the key already took a payload at least as new: the job is done), or `finished` (the job
   * ran the key's last generation, which has ended, and nothing is pending: a redelivery with
   * nothing left to run). `sentAtMs`: when the job was sent, if the broker says; one later than
   * the database's clock, or none, counts as that clock at the job's first arrival. Transient
   * store faults throw {@link StoreUnavailableError}.
   */
  coalesceArrive(scope: string, key: string, jobId: string, payload: unknown, options: { readonly staleMs?: number; readonly sentAtMs?: number } = {}): Promise<CoalesceAnswer> {
    assertValidKeyPart('scope', scope);
    assertValidKeyPart('key', key);
    const arrive = this.#store.coalesceArrive?.bind(this.#store);
    if (!arrive) throw new ValidationError('INVALID_OPTIONS', 'store', 'This key store has no coalescing keys (coalesceArrive).');
    const payloadJson = serializePayload(scope, key, payload);
    const sentAtMs = options.sentAtMs !== undefined && Number.isFinite(options.sentAtMs) ? options.sentAtMs : undefined;
    return storeCall(scope, key, 'coalescing arrival', () => arrive({ scope, key, jobId, payloadJson, staleMs: options.staleMs ?? this.#options.leaseMs * 10, sentAtMs }));
  }

  /**
   * After the running job's run of `generation` ended: the pending successor to run next in the
   * same job, if any. A store fault here leaves the successor pending for the job's redelivery,
   * whose {@link IdempotencyKeys.coalesceArrive} hands it over: defer the job, do not complete it.
   */
  coalesceNext(scope: string, key: string, jobId: string, generation: number): Promise<CoalesceSuccessor | undefined> {
    return storeCall(scope, key, 'coalescing successor', () => this.#store.coalesceNext!({ scope, key, jobId, generation }));
  }

  /**
   * Renews slots a run still holds for `leaseMs` from now (the run's heartbeat); how many were
   * still its own. Fewer than given: a slot's time ran out and another run took it, so this run
   * is no longer inside its limit. Transient store faults throw {@link StoreUnavailableError}.
   */
  renewConcurrencySlots(scope: string, key: string, slots: readonly ConcurrencySlot[], leaseMs: number = this.#options.leaseMs): Promise<number> {
    const renew = this.#store.renewSlots?.bind(this.#store);
    if (!renew) return Promise.resolve(slots.length);
    return storeCall(scope, key, 'concurrency slot renewal', () => renew(slots, leaseMs));
  }

  /**
   * Whether {@link takeConcurrencySlotsInTransaction} is available (the store holds slots by a
   * transaction's locks: the Postgres store does).
   */
  get supportsSlotsInTransaction(): boolean {
    return this.#store.takeSlotsInTransaction !== undefined && this.#store.wakeSlotWaiters !== undefined && this.#store.forgetSlotWaiter !== undefined;
  }

  /**
   * Takes a slot of each of `limits` (sorted by key, as every job takes them) for as long as the
   * open transaction `tx` lasts, for a run that is that one transaction (the fast path): no slot
   * row, no commit of its own, freed when `tx` commits or rolls back. `refusedGroup` names the
   * first key at its limit: roll `tx` back and ask {@link acquireConcurrencySlot}, which records
   * the job as a waiter. Once a `tx` that took them has ended, call {@link wakeConcurrencyWaiters}
   * (waiters recorded while it ran are not known to it). Transient store faults throw
   * {@link StoreUnavailableError}.
   */
  takeConcurrencySlotsInTransaction(
    tx: Transaction<any>,
    scope: string,
    key: string,
    limits: readonly { readonly key: string; readonly limit: number }[],
    options: { readonly starvationMs: number },
  ): Promise<{
    /** The first key at its limit (roll `tx` back); undefined: a slot of each is held until `tx` ends. */
    readonly refusedGroup: string | undefined;
    /** The slots were taken by a key recorded as a waiter: call {@link forgetConcurrencyWaiter}, apart from `tx`. */
    readonly wasWaiting: boolean;
  }> {
    const take = this.#store.takeSlotsInTransaction?.bind(this.#store);
    if (!take) throw new ValidationError('INVALID_OPTIONS', 'store', 'This key store holds no concurrency slots in a transaction (takeSlotsInTransaction).');
    return storeCall(scope, key, 'concurrency slot', () =>
      take(tx, { groups: limits.map((limit) => limit.key), limits: limits.map((limit) => limit.limit), scope, key, starvationMs: options.starvationMs }),
    );
  }

  /**
   * Forgets a key as a waiter of `groups` once it runs in their slots: a statement of its own,
   * not in the run's transaction (uncommitted there, the row would count as a waiter, a starving
   * one perhaps, until the run ends). Do not wait for it inside that transaction: it needs a
   * connection of its own, which a pool whose every connection holds such a transaction never
   * frees.
   */
  forgetConcurrencyWaiter(scope: string, key: string, groups: readonly string[]): Promise<void> {
    return storeCall(scope, key, 'concurrency waiter', () => this.#store.forgetSlotWaiter!(groups, scope, key));
  }

  /**
   * Wakes the oldest waiter of each of `groups` (one not woken within the lease), as freeing a
   * slot row does: after a run whose slots its transaction held ended.
   */
  wakeConcurrencyWaiters(scope: string, key: string, groups: readonly string[]): Promise<number> {
    return storeCall(scope, key, 'concurrency waiter wake', () => this.#store.wakeSlotWaiters!(groups, this.#options.leaseMs));
  }

  /** Frees a slot taken by {@link acquireConcurrencySlot}; false when it was no longer held (its time was up). */
  releaseConcurrencySlot(scope: string, key: string, slot: ConcurrencySlot): Promise<boolean> {
    // A waiter this frees the slot for is woken again by the next release if it has not come back within a lease.
    return storeCall(scope, key, 'concurrency slot release', () => this.#store.releaseSlot!(slot.group, slot.slot, slot.owner, this.#options.leaseMs));
  }

  /**
   * Heartbeat: extends the lease from now. The new expiry; `'completed'` when this claim's own
   * completion has committed (not a loss); null when the lease was lost. Waits on the key's row
   * lock for at most `claimLockTimeoutMs`, then throws: not known yet, try at the next beat.
   */
  extend(claim: Claim, leaseMs: number = this.#options.leaseMs): Promise<LeaseExtension> {
    return storeCall(claim.scope, claim.key, 'lease extension', () => this.#store.extend(claim, leaseMs, this.#options.claimLockTimeoutMs));
  }

  /**
   * Retryable failure: the key becomes claimable at once; attempts and `error` are kept.
   * `step` names the step of a multi-step job that threw it. Returns false when this claim no
   * longer owned the key. A claim made with `expireWhenReleased` also gives the key its
   * retention from now, after which the janitor deletes it unless a claim took it over.
   */
  release(claim: Claim, error?: unknown, step?: FailedStep): Promise<boolean> {
    const errorJson = error === undefined ? null : JSON.stringify(toStoredError(error, step));
    const expiresInMs = claim.expireWhenReleased === true ? resultRetentionMs(claim, this.#options.retentionMs) : null;
    return traceReleaseOrFail('release', claim, () => storeCall(claim.scope, claim.key, 'release', () => this.#store.release(claim, errorJson, expiresInMs)));
  }

  /**
   * Permanent failure: stores `error`; later claims replay it (`failed`) instead of running.
   * `step` names the step of a multi-step job that threw it (the stored error says so).
   * Returns false when this claim no longer owned the key.
   */
  fail(claim: Claim, error: unknown, step?: FailedStep): Promise<boolean> {
    const errorJson = JSON.stringify(toStoredError(error, step));
    return traceReleaseOrFail('fail', claim, () =>
      storeCall(claim.scope, claim.key, 'recording of the failure', () => this.#store.fail(claim, errorJson, resultRetentionMs(claim, this.#options.retentionMs))),
    );
  }

  /** True when the store keeps step records, which multi-step jobs (`ctx.step`) need. */
  get supportsSteps(): boolean {
    return this.#steps.supported;
  }

  /** The steps recorded (or started) for `claim`'s key, in position order: one statement. */
  loadSteps(claim: Claim): Promise<StepRecord[]> {
    return this.#steps.load(claim);
  }

  /**
   * Marks an external step started under `claim` (one statement, fenced) and returns how many
   * times it has started, this time included. Throws {@link LeaseLostError} when the claim no
   * longer owns the key: a zombie learns it before it calls anyone. `heldRecord`, the held
   * record of the step before, is recorded first in the same round trip (refused: the same error).
   */
  startStep(claim: Claim, step: StepPlace, heldRecord?: HeldRecord): Promise<number> {
    return this.#steps.start(claim, step, heldRecord);
  }

  /**
   * An external step's record, checked (as {@link IdempotencyKeys.recordStep} checks it) and
   * held back instead of sent: one statement for the run's next round trip to carry (the next
   * step's start, a database step's or the completion's transaction), and the result as it
   * will be stored. Undefined when the store cannot hold records (no `KeyStore.steps.recordStatement`):
   * record it with {@link IdempotencyKeys.recordStep}. Throws {@link ResultNotStorableError}.
   */
  holdStepRecord(
    claim: Claim,
    step: StepPlace,
    result: unknown,
  ):
    | {
        /** The result as it will be stored (its JSON form), which the step returns. */
        readonly value: unknown;
        /** The held record, for the run's next round trip to carry. */
        readonly record: HeldRecord;
      }
    | undefined {
    return this.#steps.hold(claim, step, result);
  }

  /**
   * Sends a held step record (see {@link IdempotencyKeys.holdStepRecord}) alone, when no round
   * trip will carry it. Its state tells how it went (`refused`: the claim lost the key); a
   * transient fault throws {@link StoreUnavailableError}.
   */
  sendStepRecord(claim: Claim, record: HeldRecord): Promise<void> {
    return this.#steps.send(claim, record);
  }

  /**
   * Records an external step's result (one statement, fenced) and returns it as stored (its
   * JSON form, as replays return it). Throws {@link ResultNotStorableError} for a result that is
   * not JSON or exceeds `maxResultBytes`, and {@link LeaseLostError} when the claim no longer
   * owns the key.
   */
  recordStep(claim: Claim, step: StepPlace, result: unknown): Promise<unknown> {
    return this.#steps.record(claim, step, result);
  }

  /**
   * A database step: runs `effect(tx)` in a transaction whose last statement records the
   * step's result, fenced, with the COMMIT (one round trip): effect and record commit together
   * or not at all. Returns the result as stored (its JSON form). A claim that lost the key
   * throws {@link LeaseLostError} and the effect rolls back; an unstorable result throws
   * {@link ResultNotStorableError}, also rolled back. Transient faults are handled as in
   * {@link commitEffect}: a COMMIT cut off in flight is resolved by reading the key's steps.
   */
  runDatabaseStep(claim: Claim, step: StepPlace, effect: Effect<unknown>, heldRecord?: HeldRecord): Promise<unknown> {
    return this.#steps.runDatabaseStep(claim, step, effect, heldRecord);
  }

  /**
   * {@link IdempotencyKeys.runDatabaseStep} in a data layer of your own (see {@link DataLayer}):
   * the data layer opens the transaction, `effect(tx)` runs on its transaction object, and the
   * step's fenced record runs last inside that same transaction through the data layer's
   * raw-SQL call, so the step's writes and its record commit together or not at all. A claim
   * that lost the key throws {@link LeaseLostError} inside the transaction (the data layer rolls
   * the writes back); a held record goes alone, just before the transaction. Never in a group.
   */
  runDatabaseStepIn<Tx>(claim: Claim, step: StepPlace, layer: DataLayer<Tx>, effect: (tx: Tx) => Promise<unknown>, heldRecord?: HeldRecord): Promise<unknown> {
    return this.#dataLayers.step(claim, step, layer, effect, heldRecord);
  }

  /** Inspects one key. */
  get(scope: string, key: string): Promise<KeyRecord | undefined> {
    assertValidKeyPart('scope', scope);
    assertValidKeyPart('key', key);
    return storeCall(scope, key, 'read', () => this.#store.get(scope, key));
  }

  /**
   * Inspects one key's steps (`ctx.step`), recorded or started, in position order: one
   * statement. Empty when the key has none, or the store keeps no step records.
   */
  getSteps(scope: string, key: string): Promise<StepRecord[]> {
    assertValidKeyPart('scope', scope);
    assertValidKeyPart('key', key);
    return this.#steps.loadOf(scope, key);
  }

  /** After an effect threw: the key released for a retry, or failed for good, as `action` says. */
  async #releaseOrFail(claim: Claim, error: unknown, action: EffectFailureAction): Promise<void> {
    try {
      if (action === 'fail') await this.fail(claim, error);
      else await this.release(claim, error);
    } catch {
      // The store is unreachable: leave the key to its lease, which expires and lets the next
      // claim take it over. The effect's error is the one worth surfacing.
    }
  }
}

function defaultFailureAction(error: unknown): EffectFailureAction {
  return error instanceof ResultNotStorableError ? 'fail' : 'release';
}
