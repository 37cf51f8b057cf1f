import type { Transaction } from 'kysely';
import { LeaseLostError } from '../errors.js';
import type { Claim } from '../store/claim-outcome.js';
import { endWithCommit, runTransaction, sendHeldRecord, type HeldRecord } from '../store/one-trip-commit.js';
import { claimSpansOn, traceCommit, traceEffectTransaction, traceGroupCommit } from '../telemetry/claim-tracing.js';
import type { CommitEffectOptions, Effect } from './effect-options.js';
import { mayHaveCommitted, resultOfInterruptedCommit } from './interrupted-commit.js';
import { resultRetentionMs } from './key-retention.js';
import { groupFor, type GroupOfEffects, type ProtocolParts } from './protocol-parts.js';
import { EffectErrors, keyIdentity, storeCall } from './store-calls.js';
import { serializeResult } from './validate.js';

/**
 * The effect boundary: the effect and the key's fenced completion in one transaction, alone or
 * in a group's (group commit), a held step record riding in front. `IdempotencyKeys.commitEffect`
 * and `runEffect` are this, with the facade's documentation.
 */
export class EffectBoundary {
  readonly #parts: ProtocolParts;

  constructor(parts: ProtocolParts) {
    this.#parts = parts;
  }

  /** See `IdempotencyKeys.commitEffect`. */
  async commit<T>(claim: Claim, effect: Effect<T>, options: CommitEffectOptions = {}): Promise<T> {
    const { beforeCommit, heldRecord } = options;
    const effectErrors = new EffectErrors();
    const runEffect = (tx: Transaction<any>): Promise<T> => effectErrors.run(claim, () => effect(tx));
    const group = groupFor(this.#parts, options);
    return traceEffectTransaction(claim, group !== undefined, async () => {
      try {
        if (!group) return await this.#alone(claim, runEffect, { beforeCommit, heldRecord });
        return await this.#inGroup(group, claim, runEffect, options);
      } catch (error) {
        // The held record ahead of the transaction was refused or failed: nothing after it ran.
        if (heldRecord?.state === 'refused') throw new LeaseLostError(claim.scope, claim.key, claim.fence);
        if (heldRecord?.state === 'failed') throw heldRecord.error;
        if (effectErrors.has(error) || !mayHaveCommitted(error)) throw error;
        const result = (await resultOfInterruptedCommit(this.#parts.store, claim, error)) as T;
        // Completed under this claim: what went ahead of the transaction committed too.
        if (heldRecord?.state === 'unknown') heldRecord.state = 'committed';
        return result;
      }
    });
  }

  /** The effect in a group's transaction, its fenced completion at the group's end; alone when it cannot share one. */
  async #inGroup<T>(group: GroupOfEffects, claim: Claim, effect: Effect<T>, options: CommitEffectOptions): Promise<T> {
    const { beforeCommit, heldRecord } = options;
    const { maxResultBytes } = this.#parts.options;
    const retentionMs = resultRetentionMs(claim, this.#parts.options.retentionMs);
    // A shared transaction has no front to ride in: the held record goes alone first.
    if (heldRecord) {
      await storeCall(claim.scope, claim.key, 'record of a step', () => sendHeldRecord(this.#parts.options.db, heldRecord));
      if (heldRecord.state === 'refused') throw new LeaseLostError(claim.scope, claim.key, claim.fence);
      if (heldRecord.state === 'failed') throw heldRecord.error;
    }
    // Only a traced job needs to know when its effect ended: its commit span begins there.
    let effectEnded: (() => void) | undefined;
    const effectDone = claimSpansOn() ? new Promise<void>((resolve) => (effectEnded = resolve)) : undefined;
    const settled = group.committer.run({
      identity: keyIdentity(claim),
      kind: options.kind,
      ...(options.onGroupRefusal ? { onRefused: options.onGroupRefusal } : {}),
      run: async (tx) => {
        const result = await effect(tx);
        const json = serializeResult(claim.scope, claim.key, result, maxResultBytes);
        await beforeCommit?.();
        effectEnded?.();
        // A lost lease fails the fenced completion at the group's end: the job then runs
        // alone, where it fails with LeaseLostError.
        return { value: result, closing: group.statements.completion(claim, json, retentionMs) };
      },
      alone: () => this.#alone(claim, effect, { beforeCommit }),
    });
    // The job's trace shows its wait for the group's COMMIT as its commit, begun here, in the
    // job's own context (the group runs the effect in the context of the job that opened it).
    if (!effectDone) return settled;
    const effectFirst = await Promise.race([effectDone.then(() => true), settled.then(() => false, () => false)]);
    return effectFirst ? traceGroupCommit(settled) : settled;
  }

  /** The effect and the fenced completion in a transaction of their own, the held record riding in front. */
  #alone<T>(claim: Claim, effect: Effect<T>, options: { beforeCommit?: () => Promise<void> | void; heldRecord?: HeldRecord }): Promise<T> {
    return runTransaction(
      this.#parts.options.db,
      async (tx) => {
        const result = await effect(tx);
        const json = serializeResult(claim.scope, claim.key, result, this.#parts.options.maxResultBytes);
        await options.beforeCommit?.();
        return { value: result, end: (t: Transaction<any>) => traceCommit(() => this.#completeAndCommit(t, claim, json)) };
      },
      options.heldRecord,
    );
  }

  /**
   * Ends an effect transaction with the fenced completion and the COMMIT: one round trip when
   * the store can send both at once, else two. Throws {@link LeaseLostError} (the transaction
   * is still open then, and the caller rolls it back) when the claim no longer owns the key.
   */
  async #completeAndCommit(tx: Transaction<any>, claim: Claim, json: string): Promise<void> {
    const { store } = this.#parts;
    const retentionMs = resultRetentionMs(claim, this.#parts.options.retentionMs);
    let completed: boolean;
    if (store.completeAndCommit) {
      completed = await store.completeAndCommit(tx, claim, json, retentionMs);
    } else {
      completed = await store.complete(tx, claim, json, retentionMs);
      if (completed) await endWithCommit(tx);
    }
    if (!completed) throw new LeaseLostError(claim.scope, claim.key, claim.fence);
  }
}
