import { randomUUID } from 'node:crypto';
import type { Transaction } from 'kysely';
import { StoreUnavailableError, ValidationError } from '../errors.js';
import { freshCompletingClaim, isHeld, type Claim } from '../store/claim-outcome.js';
import { endWithCommit, endWithRollback, runTransaction } from '../store/one-trip-commit.js';
import type { ClaimInput, KeyRetention } from '../store/records.js';
import { windowMayBeLate } from '../store/retention-window.js';
import { boundRetention, retentionProblem, withRetention } from './key-retention.js';
import { traceCommit, traceExecuteOnce } from '../telemetry/claim-tracing.js';
import type { ClaimOptions, ExecuteOnceOptions, ExecuteOnceOutcome } from './effect-options.js';
import { mayHaveCommitted, resultOfInterruptedCommit } from './interrupted-commit.js';
import { groupFor, type GroupOfEffects, type ProtocolParts } from './protocol-parts.js';
import { EffectErrors, keyIdentity, kindOf } from './store-calls.js';
import { serializePayload, serializeResult } from './validate.js';

/** An effect of the fast path: it runs on the transaction that claims the key, under that claim. */
export type FastPathEffect<T> = (tx: Transaction<any>, claim: Claim) => Promise<T>;

/**
 * The single-transaction fast path: the key claimed as `completed` and the effect, in one
 * transaction (alone, or in a group's with the key written at the group's end); a settled key
 * answered from one read first. `IdempotencyKeys.executeOnce` is this, with the facade's
 * documentation.
 */
export class FastPath {
  readonly #parts: ProtocolParts;

  constructor(parts: ProtocolParts) {
    this.#parts = parts;
  }

  /** See `IdempotencyKeys.executeOnce`; the key parts are valid. */
  async execute<T>(scope: string, key: string, fingerprint: string, effect: FastPathEffect<T>, options: ExecuteOnceOptions): Promise<ExecuteOnceOutcome<T>> {
    const effectErrors = new EffectErrors();
    let held: Claim | undefined;
    const runEffect = (tx: Transaction<any>, claim: Claim): Promise<T> => {
      held = claim;
      return effectErrors.run(claim, () => effect(tx, claim));
    };
    const group = groupFor(this.#parts, options);
    return traceExecuteOnce(scope, key, options.queue, group !== undefined, async (): Promise<ExecuteOnceOutcome<T>> => {
      try {
        return await this.#execute(group, { scope, key, fingerprint }, runEffect, options);
      } catch (error) {
        if (effectErrors.has(error) || !mayHaveCommitted(error)) throw error;
        if (!held) throw new StoreUnavailableError(scope, key, 'claim', { cause: error });
        const result = (await resultOfInterruptedCommit(this.#parts.store, held, error)) as T;
        return { kind: 'executed', result, claim: held };
      }
    });
  }

  async #execute<T>(
    group: GroupOfEffects | undefined,
    request: { readonly scope: string; readonly key: string; readonly fingerprint: string },
    effect: FastPathEffect<T>,
    options: ExecuteOnceOptions,
  ): Promise<ExecuteOnceOutcome<T>> {
    const { scope, key, fingerprint } = request;
    const input = claimInput(this.#parts, { ...request, mode: 'complete' }, options);
    const retention = claimRetention(this.#parts, options);
    // A settled key (a duplicate) replays from one read, without a transaction.
    const settled = await this.#parts.store.findSettled?.(scope, key, fingerprint);
    if (settled) return settled as ExecuteOnceOutcome<T>;
    if (group?.statements.completedKeys) {
      // In a group: the effect first, then the key written once, completed with its result, at
      // the group's end. If the key has a row by then, this job runs alone (claim first).
      return group.committer.run<ExecuteOnceOutcome<T>>({
        identity: keyIdentity(input),
        kind: options.kind ?? kindOf(options),
        ...(options.onGroupRefusal ? { onRefused: options.onGroupRefusal } : {}),
        run: async (tx) => {
          const claim = withRetention(freshCompletingClaim(input), retention);
          const result = await effect(tx, claim);
          const resultJson = result === undefined ? null : serializeResult(scope, key, result, this.#parts.options.maxResultBytes);
          return { value: { kind: 'executed', result, claim }, newKey: { input, resultJson } };
        },
        alone: () => this.#alone(input, retention, effect),
      });
    }
    return this.#alone(input, retention, effect);
  }

  /**
   * The fast path in a transaction of its own. The claim bounds its own lock wait and puts
   * lock_timeout back in the same statement, so the effect runs under the session's usual
   * lock_timeout. A claim that does not hold the key rolls back: its transaction may be aborted
   * (the lock wait timed out), so no COMMIT. A new key (the common case) is claimed by the
   * store's cheaper statement when it has one; a key with a row, by the claim that handles every
   * case, in the same transaction.
   */
  #alone<T>(input: ClaimInput, retention: KeyRetention | undefined, effect: FastPathEffect<T>): Promise<ExecuteOnceOutcome<T>> {
    const { store, options } = this.#parts;
    const { scope, key } = input;
    return runTransaction(options.db, async (tx) => {
      const claimedAt = performance.now();
      const claimed = (await store.claimNewKey?.(tx, input)) ?? (await store.claim(tx, input));
      if (!isHeld(claimed)) return { value: claimed as ExecuteOnceOutcome<T>, end: endWithRollback };
      const outcome = withRetention(claimed, retention);
      const result = await effect(tx, outcome);
      const value: ExecuteOnceOutcome<T> = { kind: 'executed', result, claim: outcome };
      // A transaction that ran long moves the key's retention window, which the claim started
      // at its start, to its commit.
      const windowLate = windowMayBeLate(performance.now() - claimedAt, input.retentionMs);
      // No result, no tombstone window to keep, no window to move: the claim wrote the row as it stays.
      if (result === undefined && outcome.retention?.tombstoneMs === undefined && !windowLate) {
        return { value, end: (t: Transaction<any>) => traceCommit(() => endWithCommit(t)) };
      }
      const json = result === undefined ? null : serializeResult(scope, key, result, options.maxResultBytes);
      return { value, end: (t: Transaction<any>) => traceCommit(() => this.#storeResultAndCommit(t, outcome, json, windowLate)) };
    });
  }

  /** Ends a fast-path transaction with the effect's result and the COMMIT (one round trip when the store can). */
  async #storeResultAndCommit(tx: Transaction<any>, claim: Claim, json: string | null, windowLate: boolean): Promise<void> {
    const { store } = this.#parts;
    if (store.storeFastPathResultAndCommit) return store.storeFastPathResultAndCommit(tx, claim, json, windowLate);
    await store.storeFastPathResult(tx, claim, json, windowLate);
    await endWithCommit(tx);
  }
}

/** What a claim of `request` sends to the store: a fresh owner token, the options' settings and what is kept on the row. */
export function claimInput(
  parts: ProtocolParts,
  request: { readonly scope: string; readonly key: string; readonly fingerprint: string; readonly mode: 'lease' | 'complete' },
  options: ClaimOptions,
): ClaimInput {
  const { scope, key, fingerprint, mode } = request;
  const settings = parts.options;
  const retention = claimRetention(parts, options);
  return {
    scope,
    key,
    fingerprint,
    owner: randomUUID(),
    leaseMs: options.leaseMs ?? settings.leaseMs,
    lockTimeoutMs: settings.claimLockTimeoutMs,
    synchronousCommit: settings.claimSynchronousCommit,
    retentionMs: retention?.resultMs ?? settings.retentionMs,
    tombstoneMs: retention?.tombstoneMs ?? null,
    mode,
    jobId: options.jobId ?? null,
    queue: options.queue ?? null,
    jobName: options.jobName ?? null,
    payloadJson: options.payload === undefined ? null : serializePayload(scope, key, options.payload),
    ...(mode === 'lease' && options.concurrency?.length ? { concurrency: checkedConcurrency(options.concurrency) } : {}),
  };
}

/** A claim's concurrency records, refused with a `ValidationError` (`INVALID_OPTIONS`) unless each is a key of 1–255 characters and a whole limit of at least 1. */
function checkedConcurrency(records: ClaimOptions['concurrency'] & object): NonNullable<ClaimOptions['concurrency']> {
  if (!Array.isArray(records)) throw new ValidationError('INVALID_OPTIONS', 'concurrency', 'Invalid claim option concurrency: a list of { key, limit }.');
  records.forEach((record: unknown, n) => {
    const { key, limit } = (record ?? {}) as { key?: unknown; limit?: unknown };
    if (typeof key !== 'string' || key.length < 1 || key.length > 255 || !Number.isInteger(limit) || (limit as number) < 1 || (limit as number) > 2_147_483_647) {
      throw new ValidationError('INVALID_OPTIONS', `concurrency[${n}]`, `Invalid claim option concurrency[${n}]: a key of 1 to 255 characters and a whole limit of at least 1.`);
    }
  });
  return records;
}

/**
 * The retention a claim asked for (`options.retention`), checked and held to the instance's
 * bounds; undefined when it asked for none. Throws a {@link ValidationError} (`INVALID_OPTIONS`)
 * for a malformed one.
 */
export function claimRetention(parts: ProtocolParts, options: ClaimOptions): KeyRetention | undefined {
  if (options.retention === undefined) return undefined;
  const problem = retentionProblem(options.retention);
  if (problem) throw new ValidationError('INVALID_OPTIONS', `retention${problem[0]}`, `Invalid claim option retention: ${problem[1]}.`);
  return boundRetention(options.retention, parts.options).retention;
}
