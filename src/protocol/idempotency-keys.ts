import { randomUUID } from 'node:crypto';
import type { Kysely, Transaction } from 'kysely';
import {
  resolveIdempotencyOptions,
  type GroupedEffects,
  type IdempotencyOptions,
  type ResolvedIdempotencyOptions,
} from '../config/idempotency-options.js';
import { LeaseLostError, ResultNotStorableError, StepsUnsupportedError, StoreUnavailableError, ValidationError } from '../errors.js';
import type { Claim, ClaimOutcome } from '../store/claim-outcome.js';
import { freshCompletingClaim, isHeld, type HeldClaim } from '../store/claim-outcome.js';
import type { ClaimInput, GroupStatements, KeyStore } from '../store/key-store.js';
import type { KeyRecord } from '../store/key-record.js';
import type { LeaseExtension } from '../store/sql/extend.js';
import type { StepRecord } from '../store/sql/load-steps.js';
import type { StepPlace } from '../store/sql/start-step.js';
import { LeadingStatements, endWithCommit, endWithRollback, runTransaction, sendLeadingStatements } from '../store/one-trip-commit.js';
import { transientStoreFault } from '../store/pg-errors.js';
import { PostgresKeyStore } from '../store/postgres-key-store.js';
import { traceClaim, traceCommit, traceEffectTransaction, traceExecuteOnce, traceSettle } from '../telemetry/claim-tracing.js';
import { GroupCommitter, type BatchedStep } from './group-commit.js';
import { assertValidKeyPart, serializePayload, serializeResult, toStoredError, type FailedStep } from './validate.js';

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
  /**
   * Set when group commit may group effects (see `group-commit.ts`): every effect, or only
   * database-only ones (`effects`).
   */
  readonly #group: (GroupOfEffects & { readonly effects: GroupedEffects }) | undefined;

  constructor(options: IdempotencyOptions, store?: KeyStore) {
    this.#options = resolveIdempotencyOptions(options);
    this.#store = store ?? new PostgresKeyStore(this.#options.db, this.#options.schema);
    const { groupCommit } = this.#options;
    if (groupCommit) {
      const statements = this.#store.groupStatements;
      if (statements) {
        const insertCompletedKeys = statements.insertCompletedKeys;
        const committer = new GroupCommitter(this.#options.db, groupCommit, {
          batchedStep: claimNewKeysStep(statements),
          insertCompletedKeys: insertCompletedKeys && ((rows) => insertCompletedKeys(rows, this.#options.claimLockTimeoutMs)),
        });
        this.#group = { committer, statements, effects: groupCommit.effects };
      } else if (options.groupCommit !== undefined) {
        // Asked for: refuse. By default (database-only effects), such a store runs them alone.
        throw new ValidationError('INVALID_OPTIONS', 'groupCommit', 'groupCommit needs a store that offers groupStatements (PostgresKeyStore does).');
      }
    }
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
    const input = this.#claimInput(scope, key, fingerprint, 'lease', options);
    return traceClaim(scope, key, options.queue, () => storeCall(scope, key, 'claim', () => this.#store.claim(this.db, input)));
  }

  /**
   * Fenced completion inside the caller's transaction: stores `result` and marks the key
   * completed, or throws {@link LeaseLostError} (so the caller's transaction, effect included,
   * rolls back) when the claim was taken over. Throws {@link ResultNotStorableError} for a
   * result that is not JSON or exceeds `maxResultBytes`.
   */
  async complete(tx: Kysely<any>, claim: Claim, result: unknown): Promise<void> {
    const json = serializeResult(claim.scope, claim.key, result, this.#options.maxResultBytes);
    const completed = await storeCall(claim.scope, claim.key, 'completion', () => this.#store.complete(tx, claim, json, this.#options.retentionMs));
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
      return await this.commitEffect(claim, effect, undefined, undefined, options);
    } catch (error) {
      if (!(error instanceof LeaseLostError)) {
        // A store fault says nothing about the effect: never a stored failure.
        const action = error instanceof StoreUnavailableError ? 'release' : (options.onError ?? defaultFailureAction)(error);
        await this.#settleFailedClaim(claim, error, action);
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
   * `lead`, a step record held back (see {@link IdempotencyKeys.holdStepRecord}), commits just
   * before the transaction, in the round trip of its first statement (under group commit, on
   * its own first). Refused, it throws {@link LeaseLostError} and nothing else runs; its state
   * tells the caller whether it went.
   *
   * `options.databaseOnly` says the effect may share a group transaction (see {@link EffectOptions}).
   */
  async commitEffect<T>(
    claim: Claim,
    effect: Effect<T>,
    beforeCommit?: () => Promise<void> | void,
    lead?: LeadingStatements,
    options: EffectOptions = {},
  ): Promise<T> {
    const effectErrors = new WeakSet<object>();
    const runEffect = async (tx: Transaction<any>): Promise<T> => {
      try {
        return await effect(tx);
      } catch (error) {
        throw markEffectError(effectErrors, effectFault(claim, error));
      }
    };
    const group = this.#groupFor(options);
    return traceEffectTransaction(claim, group !== undefined, async () => {
      try {
        return await this.#commitEffect(group, claim, runEffect, beforeCommit, lead);
      } catch (error) {
        if (lead?.state === 'refused') throw new LeaseLostError(claim.scope, claim.key, claim.fence);
        if (isMarked(effectErrors, error) || transientStoreFault(error) === undefined) throw error;
        const result = (await this.#resultOfInterruptedCommit(claim, error)) as T;
        // Completed under this claim: what went ahead of the transaction committed too.
        if (lead?.state === 'unknown') lead.state = 'committed';
        return result;
      }
    });
  }

  async #commitEffect<T>(
    group: GroupOfEffects | undefined,
    claim: Claim,
    effect: Effect<T>,
    beforeCommit?: () => Promise<void> | void,
    lead?: LeadingStatements,
  ): Promise<T> {
    if (group) {
      // A shared transaction has no front to ride in: the held record goes alone first.
      if (lead) await this.sendStepRecord(claim, lead);
      if (lead?.state === 'refused') throw new LeaseLostError(claim.scope, claim.key, claim.fence);
      const runAndComplete = async (tx: Transaction<any>) => {
        const result = await effect(tx);
        const json = serializeResult(claim.scope, claim.key, result, this.#options.maxResultBytes);
        await beforeCommit?.();
        return { value: result, closing: group.statements.completion(claim, json, this.#options.retentionMs) };
      };
      return group.committer.run({
        careful: async (tx) => ({
          ...(await runAndComplete(tx)),
          closingError: (error: unknown) => this.#explainClosingFailure(group.statements, error, claim),
        }),
        // Optimistically, a lost lease fails the fenced completion at the group's end: the
        // group runs again the careful way, where this job fails alone with LeaseLostError.
        optimistic: { identity: keyIdentity(claim), run: runAndComplete },
      });
    }
    return runTransaction(
      this.db,
      async (tx) => {
        const result = await effect(tx);
        const json = serializeResult(claim.scope, claim.key, result, this.#options.maxResultBytes);
        await beforeCommit?.();
        return { value: result, end: (t: Transaction<any>) => traceCommit(() => this.#completeAndCommit(t, claim, json)) };
      },
      lead,
    );
  }

  /**
   * Records a permanent failure for a key nobody holds (the fast path's last attempt failed
   * and rolled its claim back): claims it and fails it. Returns the claim outcome when the key
   * turned out to be held or settled by someone else, in which case nothing was recorded.
   * The payload is not kept. If the failure cannot be stored, the key is released (never left
   * `processing`) and the store's error is thrown.
   */
  async recordFailure(
    scope: string,
    key: string,
    fingerprint: string,
    error: unknown,
    options: ClaimOptions = {},
  ): Promise<ClaimOutcome> {
    // No payload: it is kept only for re-enqueueing a key left processing, which this one is
    // not, and a payload that cannot be stored may be the very failure being recorded.
    const { payload: _, ...withoutPayload } = options;
    const outcome = await this.claim(scope, key, fingerprint, withoutPayload);
    if (isHeld(outcome)) {
      try {
        await this.fail(outcome, error);
      } catch (failure) {
        // Never leave the key processing (claimed by nobody who will finish it) for the sweeper.
        await this.release(outcome, error).catch(() => {});
        throw failure;
      }
    }
    return outcome;
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
  async executeOnce<T>(
    scope: string,
    key: string,
    fingerprint: string,
    effect: (tx: Transaction<any>, claim: Claim) => Promise<T>,
    options: ExecuteOnceOptions = {},
  ): Promise<ExecuteOnceOutcome<T>> {
    assertValidKeyPart('scope', scope);
    assertValidKeyPart('key', key);
    const effectErrors = new WeakSet<object>();
    let held: Claim | undefined;
    const runEffect = async (tx: Transaction<any>, claim: Claim): Promise<T> => {
      held = claim;
      try {
        return await effect(tx, claim);
      } catch (error) {
        throw markEffectError(effectErrors, effectFault(claim, error));
      }
    };
    const group = this.#groupFor(options);
    return traceExecuteOnce(scope, key, options.queue, group !== undefined, async (): Promise<ExecuteOnceOutcome<T>> => {
      try {
        return await this.#executeOnce(group, scope, key, fingerprint, runEffect, options);
      } catch (error) {
        if (isMarked(effectErrors, error) || transientStoreFault(error) === undefined) throw error;
        if (!held) throw new StoreUnavailableError(scope, key, 'claim', { cause: error });
        const result = (await this.#resultOfInterruptedCommit(held, error)) as T;
        return { kind: 'executed', result, claim: held };
      }
    });
  }

  async #executeOnce<T>(
    group: GroupOfEffects | undefined,
    scope: string,
    key: string,
    fingerprint: string,
    effect: (tx: Transaction<any>, claim: Claim) => Promise<T>,
    options: ExecuteOnceOptions,
  ): Promise<ExecuteOnceOutcome<T>> {
    const store = this.#store;
    const input = this.#claimInput(scope, key, fingerprint, 'complete', options);
    // A settled key (a duplicate) replays from one read, without a transaction.
    const settled = await store.findSettled?.(scope, key, fingerprint);
    if (settled) return settled as ExecuteOnceOutcome<T>;
    if (group) {
      // The same steps inside the job's savepoint of a shared transaction. A new key may have
      // been claimed already, with the keys of the jobs grouped with this one (one statement).
      return group.committer.run<ExecuteOnceOutcome<T>>({
        careful: async (tx, claimedAhead) => {
          const outcome = (claimedAhead as HeldClaim | undefined) ?? (await store.claim(tx, input));
          if (!isHeld(outcome)) return { value: outcome as ExecuteOnceOutcome<T>, closing: 'rollback' as const };
          const result = await effect(tx, outcome);
          const value: ExecuteOnceOutcome<T> = { kind: 'executed', result, claim: outcome };
          if (result === undefined) return { value };
          const json = serializeResult(scope, key, result, this.#options.maxResultBytes);
          return {
            value,
            closing: group.statements.fastPathResult(outcome, json),
            closingError: (error: unknown) => this.#explainClosingFailure(group.statements, error, outcome),
          };
        },
        stepInput: input,
        // Optimistically: the effect first, then the key written once, completed with its result,
        // at the group's end. If the key has a row by then, the group runs again the careful way.
        optimistic: {
          identity: keyIdentity(input),
          run: async (tx) => {
            const claim = freshCompletingClaim(input);
            const result = await effect(tx, claim);
            const resultJson = result === undefined ? null : serializeResult(scope, key, result, this.#options.maxResultBytes);
            return { value: { kind: 'executed', result, claim }, newKey: { input, resultJson } };
          },
        },
      });
    }
    // The claim bounds its own lock wait and puts lock_timeout back in the same statement, so
    // the effect runs under the session's usual lock_timeout. A claim that does not hold the
    // key rolls back: its transaction may be aborted (the lock wait timed out), so no COMMIT.
    // A new key (the common case) is claimed by the store's cheaper statement when it has one;
    // a key with a row, by the claim that handles every case, in the same transaction.
    return runTransaction(this.db, async (tx) => {
      const outcome = (await store.claimNewKey?.(tx, input)) ?? (await store.claim(tx, input));
      if (!isHeld(outcome)) return { value: outcome as ExecuteOnceOutcome<T>, end: endWithRollback };
      const result = await effect(tx, outcome);
      const value: ExecuteOnceOutcome<T> = { kind: 'executed', result, claim: outcome };
      if (result === undefined) return { value, end: (t: Transaction<any>) => traceCommit(() => endWithCommit(t)) };
      const json = serializeResult(scope, key, result, this.#options.maxResultBytes);
      return { value, end: (t: Transaction<any>) => traceCommit(() => this.#storeResultAndCommit(t, outcome, json)) };
    });
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
   * longer owned the key.
   */
  release(claim: Claim, error?: unknown, step?: FailedStep): Promise<boolean> {
    const errorJson = error === undefined ? null : JSON.stringify(toStoredError(error, step));
    return traceSettle('release', claim, () => storeCall(claim.scope, claim.key, 'release', () => this.#store.release(claim, errorJson)));
  }

  /**
   * Permanent failure: stores `error`; later claims replay it (`failed`) instead of running.
   * `step` names the step of a multi-step job that threw it (the stored error says so).
   * Returns false when this claim no longer owned the key.
   */
  fail(claim: Claim, error: unknown, step?: FailedStep): Promise<boolean> {
    const errorJson = JSON.stringify(toStoredError(error, step));
    return traceSettle('fail', claim, () =>
      storeCall(claim.scope, claim.key, 'recording of the failure', () => this.#store.fail(claim, errorJson, this.#options.retentionMs)),
    );
  }

  /** True when the store keeps step records, which multi-step jobs (`ctx.step`) need. */
  get supportsSteps(): boolean {
    return this.#store.steps !== undefined;
  }

  /** The steps recorded (or started) for `claim`'s key, in position order: one statement. */
  loadSteps(claim: Claim): Promise<StepRecord[]> {
    const steps = this.#stepStore(claim);
    return storeCall(claim.scope, claim.key, 'read of its steps', () => steps.load(claim.scope, claim.key));
  }

  /**
   * Marks an external step started under `claim` (one statement, fenced) and returns how many
   * times it has started, this time included. Throws {@link LeaseLostError} when the claim no
   * longer owns the key: a zombie learns it before it calls anyone. `lead`, a held record of
   * the step before, is recorded first in the same round trip (refused: the same error).
   */
  async startStep(claim: Claim, step: StepPlace, lead?: LeadingStatements): Promise<number> {
    const steps = this.#stepStore(claim);
    const starts = await storeCall(claim.scope, claim.key, `start of step "${step.name}"`, () => steps.start(claim, step, lead));
    if (starts === undefined) throw new LeaseLostError(claim.scope, claim.key, claim.fence);
    return starts;
  }

  /**
   * An external step's record, checked (as {@link IdempotencyKeys.recordStep} checks it) and
   * held back instead of sent: literal SQL for the run's next round trip to carry (the next
   * step's start, a database step's or the completion's transaction), and the result as it
   * will be stored. Undefined when the store cannot hold records (no `KeyStore.steps.recordText`):
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
        readonly record: LeadingStatements;
      }
    | undefined {
    const steps = this.#stepStore(claim);
    if (!steps.recordText) return undefined;
    const json = serializeResult(claim.scope, claim.key, result, this.#options.maxResultBytes);
    return { value: JSON.parse(json) as unknown, record: new LeadingStatements(steps.recordText(claim, step, json)) };
  }

  /**
   * Sends a held step record (see {@link IdempotencyKeys.holdStepRecord}) alone, when no round
   * trip will carry it. Its state tells how it went (`refused`: the claim lost the key); a
   * transient fault throws {@link StoreUnavailableError}.
   */
  sendStepRecord(claim: Claim, record: LeadingStatements): Promise<void> {
    return storeCall(claim.scope, claim.key, 'record of a step', () => sendLeadingStatements(this.db, record));
  }

  /**
   * Records an external step's result (one statement, fenced) and returns it as stored (its
   * JSON form, as replays return it). Throws {@link ResultNotStorableError} for a result that is
   * not JSON or exceeds `maxResultBytes`, and {@link LeaseLostError} when the claim no longer
   * owns the key.
   */
  async recordStep(claim: Claim, step: StepPlace, result: unknown): Promise<unknown> {
    const steps = this.#stepStore(claim);
    const json = serializeResult(claim.scope, claim.key, result, this.#options.maxResultBytes);
    const recorded = await storeCall(claim.scope, claim.key, `record of step "${step.name}"`, () => steps.record(claim, step, json));
    if (!recorded) throw new LeaseLostError(claim.scope, claim.key, claim.fence);
    return JSON.parse(json) as unknown;
  }

  /**
   * A database step: runs `effect(tx)` in a transaction whose last statement records the
   * step's result, fenced, with the COMMIT (one round trip): effect and record commit together
   * or not at all. Returns the result as stored (its JSON form). A claim that lost the key
   * throws {@link LeaseLostError} and the effect rolls back; an unstorable result throws
   * {@link ResultNotStorableError}, also rolled back. Transient faults are handled as in
   * {@link commitEffect}: a COMMIT cut off in flight is resolved by reading the key's steps.
   */
  async runDatabaseStep(claim: Claim, step: StepPlace, effect: Effect<unknown>, lead?: LeadingStatements): Promise<unknown> {
    const steps = this.#stepStore(claim);
    const effectErrors = new WeakSet<object>();
    try {
      return await runTransaction(
        this.db,
        async (tx) => {
          let result: unknown;
          try {
            result = await effect(tx);
          } catch (error) {
            throw markEffectError(effectErrors, effectFault(claim, error));
          }
          const json = serializeResult(claim.scope, claim.key, result, this.#options.maxResultBytes);
          return {
            value: JSON.parse(json) as unknown,
            end: async (t: Transaction<any>) => {
              if (!(await steps.recordAndCommit(t, claim, step, json))) throw new LeaseLostError(claim.scope, claim.key, claim.fence);
            },
          };
        },
        lead,
      );
    } catch (error) {
      // The held record ahead of the transaction was refused: the step's statements never ran.
      if (lead?.state === 'refused') throw new LeaseLostError(claim.scope, claim.key, claim.fence);
      if (isMarked(effectErrors, error) || transientStoreFault(error) === undefined) throw error;
      // The COMMIT may have been applied with its reply lost: the step's record tells.
      const recorded = (await steps.load(claim.scope, claim.key).catch(() => [])).find((s) => s.name === step.name);
      if (recorded?.recordedAt && recorded.fence === claim.fence) {
        if (lead?.state === 'unknown') lead.state = 'committed'; // it went ahead of this transaction
        return recorded.result;
      }
      throw new StoreUnavailableError(claim.scope, claim.key, `transaction of step "${step.name}"`, { cause: error });
    }
  }

  #stepStore(claim: Claim) {
    const steps = this.#store.steps;
    if (!steps) throw new StepsUnsupportedError(claim.scope, claim.key, 'the key store keeps no step records (KeyStore.steps).');
    return steps;
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
    const steps = this.#store.steps;
    if (!steps) return Promise.resolve([]);
    return storeCall(scope, key, 'read of its steps', () => steps.load(scope, key));
  }

  /** The group an effect joins: any effect when every effect is grouped, else only a database-only one. */
  #groupFor(options: EffectOptions): GroupOfEffects | undefined {
    const group = this.#group;
    if (group === undefined) return undefined;
    return group.effects === 'all' || options.databaseOnly === true ? group : undefined;
  }

  /**
   * What became of a transaction whose end met a transient fault: the COMMIT may have been
   * applied with its reply lost. The key tells: completed under this claim's owner token and
   * fence means it committed (returns the stored result); anything else, or no answer, means
   * it did not, or not yet (a {@link StoreUnavailableError}: try again later).
   */
  async #resultOfInterruptedCommit(claim: Claim, fault: unknown): Promise<unknown> {
    const record = await this.#store.get(claim.scope, claim.key).catch(() => undefined);
    if (record?.status === 'completed' && record.owner === claim.owner && record.fence === claim.fence) return record.result;
    throw new StoreUnavailableError(claim.scope, claim.key, 'effect transaction', { cause: fault });
  }

  #claimInput(scope: string, key: string, fingerprint: string, mode: 'lease' | 'complete', options: ClaimOptions) {
    return {
      scope,
      key,
      fingerprint,
      owner: randomUUID(),
      leaseMs: options.leaseMs ?? this.#options.leaseMs,
      lockTimeoutMs: this.#options.claimLockTimeoutMs,
      synchronousCommit: this.#options.claimSynchronousCommit,
      retentionMs: this.#options.retentionMs,
      mode,
      jobId: options.jobId ?? null,
      queue: options.queue ?? null,
      jobName: options.jobName ?? null,
      payloadJson: options.payload === undefined ? null : serializePayload(scope, key, options.payload),
    };
  }

  /**
   * Ends an effect transaction with the fenced completion and the COMMIT: one round trip when
   * the store can send both at once, else two. Throws {@link LeaseLostError} (the transaction
   * is still open then, and the caller rolls it back) when the claim no longer owns the key.
   */
  async #completeAndCommit(tx: Transaction<any>, claim: Claim, json: string): Promise<void> {
    const store = this.#store;
    const retentionMs = this.#options.retentionMs;
    let completed: boolean;
    if (store.completeAndCommit) {
      completed = await store.completeAndCommit(tx, claim, json, retentionMs);
    } else {
      completed = await store.complete(tx, claim, json, retentionMs);
      if (completed) await endWithCommit(tx);
    }
    if (!completed) throw new LeaseLostError(claim.scope, claim.key, claim.fence);
  }

  /** Ends a fast-path transaction with the effect's result and the COMMIT (one round trip when the store can). */
  async #storeResultAndCommit(tx: Transaction<any>, claim: Claim, json: string): Promise<void> {
    const store = this.#store;
    if (store.storeFastPathResultAndCommit) return store.storeFastPathResultAndCommit(tx, claim, json);
    await store.storeFastPathResult(tx, claim, json);
    await endWithCommit(tx);
  }

  #explainClosingFailure(statements: GroupStatements, error: unknown, claim: Claim): unknown {
    const failure = statements.explainFailure(error, claim);
    return 'leaseLost' in failure ? new LeaseLostError(claim.scope, claim.key, claim.fence) : failure.error;
  }

  async #settleFailedClaim(claim: Claim, error: unknown, action: EffectFailureAction): Promise<void> {
    try {
      if (action === 'fail') await this.fail(claim, error);
      else await this.release(claim, error);
    } catch {
      // The store is unreachable: leave the key to its lease, which expires and lets the next
      // claim take it over. The effect's error is the one worth surfacing.
    }
  }
}

/**
 * Group commit's batched step for the fast path, when the store offers it: the new keys of the
 * jobs about to run in a group, claimed in one statement. A job gets its claim, which is what
 * its own claim of a new key would have returned; undone (the row deleted) if the job fails.
 */
function claimNewKeysStep(statements: GroupStatements): BatchedStep | undefined {
  const claims = statements.newKeyClaims;
  if (!claims) return undefined;
  return async (tx, inputs) => {
    const claimInputs = inputs as readonly ClaimInput[];
    const claimed = await claims.claim(tx, claimInputs);
    return claimInputs.map((input, i) => {
      if (!claimed[i]) return undefined;
      const claim = freshCompletingClaim(input);
      return { value: claim, undo: claims.undo(claim) };
    });
  };
}

/** The committer that groups effects, and the store's statements its jobs end with. */
interface GroupOfEffects {
  readonly committer: GroupCommitter;
  readonly statements: GroupStatements;
}

/** A key's identity as one string (scope and key cannot contain NUL). */
function keyIdentity(k: { readonly scope: string; readonly key: string }): string {
  return `${k.scope}\u0000${k.key}`;
}

/** Runs one of the store's own statements for a key: a transient fault becomes a {@link StoreUnavailableError}. */
async function storeCall<T>(scope: string, key: string, operation: string, call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (error) {
    if (transientStoreFault(error) === undefined) throw error;
    throw new StoreUnavailableError(scope, key, operation, { cause: error });
  }
}

/**
 * An error the effect threw: a store fault when its connection broke, or it met a
 * serialization failure or deadlock (running it again may well succeed); as it is otherwise.
 * A lock or statement timeout of the effect's own statements is the effect's business.
 */
function effectFault(claim: Claim, error: unknown): unknown {
  const fault = transientStoreFault(error);
  if (fault === undefined || fault === 'timeout') return error;
  return new StoreUnavailableError(claim.scope, claim.key, 'effect transaction', { cause: error });
}

/** Remembers that `error` came from the effect (it is not the transaction's end failing). */
function markEffectError(marked: WeakSet<object>, error: unknown): unknown {
  if (error !== null && typeof error === 'object') marked.add(error);
  return error;
}

function isMarked(marked: WeakSet<object>, error: unknown): boolean {
  return error !== null && typeof error === 'object' && marked.has(error);
}

function defaultFailureAction(error: unknown): EffectFailureAction {
  return error instanceof ResultNotStorableError ? 'fail' : 'release';
}
