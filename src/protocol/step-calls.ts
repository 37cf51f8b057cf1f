import type { Transaction } from 'kysely';
import { LeaseLostError, StepsUnsupportedError } from '../errors.js';
import type { Claim } from '../store/claim-outcome.js';
import type { StepStore } from '../store/key-store.js';
import { HeldRecord, runTransaction, sendHeldRecord } from '../store/one-trip-commit.js';
import type { StepPlace, StepRecord } from '../store/records.js';
import type { Effect } from './effect-options.js';
import { mayHaveCommitted, stepOfInterruptedCommit } from './interrupted-commit.js';
import type { ProtocolParts } from './protocol-parts.js';
import { EffectErrors, storeCall } from './store-calls.js';
import { serializeResult } from './validate.js';

/**
 * The step records of multi-step jobs (`ctx.step`), through the store's `StepStore`: read, start,
 * hold back, send, record, and a database step's transaction. The methods of `IdempotencyKeys`
 * of the same names are these, with the facade's documentation.
 */
export class StepCalls {
  readonly #parts: ProtocolParts;

  constructor(parts: ProtocolParts) {
    this.#parts = parts;
  }

  get supported(): boolean {
    return this.#parts.store.steps !== undefined;
  }

  load(claim: Claim): Promise<StepRecord[]> {
    const steps = this.#steps(claim);
    return storeCall(claim.scope, claim.key, 'read of its steps', () => steps.load(claim.scope, claim.key));
  }

  /** A key's steps when the store keeps any, else none. */
  loadOf(scope: string, key: string): Promise<StepRecord[]> {
    const steps = this.#parts.store.steps;
    if (!steps) return Promise.resolve([]);
    return storeCall(scope, key, 'read of its steps', () => steps.load(scope, key));
  }

  async start(claim: Claim, step: StepPlace, heldRecord?: HeldRecord): Promise<number> {
    const steps = this.#steps(claim);
    const starts = await storeCall(claim.scope, claim.key, `start of step "${step.name}"`, () => steps.start(claim, step, heldRecord));
    if (starts === undefined) throw new LeaseLostError(claim.scope, claim.key, claim.fence);
    return starts;
  }

  hold(claim: Claim, step: StepPlace, result: unknown): { readonly value: unknown; readonly record: HeldRecord } | undefined {
    const steps = this.#steps(claim);
    if (!steps.recordStatement) return undefined;
    const json = serializeResult(claim.scope, claim.key, result, this.#parts.options.maxResultBytes);
    return { value: JSON.parse(json) as unknown, record: new HeldRecord(steps.recordStatement(claim, step, json)) };
  }

  send(claim: Claim, record: HeldRecord): Promise<void> {
    return storeCall(claim.scope, claim.key, 'record of a step', () => sendHeldRecord(this.#parts.options.db, record));
  }

  async record(claim: Claim, step: StepPlace, result: unknown): Promise<unknown> {
    const steps = this.#steps(claim);
    const json = serializeResult(claim.scope, claim.key, result, this.#parts.options.maxResultBytes);
    const recorded = await storeCall(claim.scope, claim.key, `record of step "${step.name}"`, () => steps.record(claim, step, json));
    if (!recorded) throw new LeaseLostError(claim.scope, claim.key, claim.fence);
    return JSON.parse(json) as unknown;
  }

  async runDatabaseStep(claim: Claim, step: StepPlace, effect: Effect<unknown>, heldRecord?: HeldRecord): Promise<unknown> {
    const steps = this.#steps(claim);
    const effectErrors = new EffectErrors();
    try {
      return await runTransaction(
        this.#parts.options.db,
        async (tx) => {
          const result = await effectErrors.run(claim, () => effect(tx));
          const json = serializeResult(claim.scope, claim.key, result, this.#parts.options.maxResultBytes);
          return {
            value: JSON.parse(json) as unknown,
            end: async (t: Transaction<any>) => {
              if (!(await steps.recordAndCommit(t, claim, step, json))) throw new LeaseLostError(claim.scope, claim.key, claim.fence);
            },
          };
        },
        heldRecord,
      );
    } catch (error) {
      // The held record ahead of the transaction was refused or failed: the step's statements never ran.
      if (heldRecord?.state === 'refused') throw new LeaseLostError(claim.scope, claim.key, claim.fence);
      if (heldRecord?.state === 'failed') throw heldRecord.error;
      if (effectErrors.has(error) || !mayHaveCommitted(error)) throw error;
      // The COMMIT may have been applied with its reply lost: the step's record tells.
      const recorded = await stepOfInterruptedCommit(steps, claim, step, error);
      if (heldRecord?.state === 'unknown') heldRecord.state = 'committed'; // it went ahead of this transaction
      return recorded.result;
    }
  }

  #steps(claim: Claim): StepStore {
    const steps = this.#parts.store.steps;
    if (!steps) throw new StepsUnsupportedError(claim.scope, claim.key, 'the key store keeps no step records (KeyStore.steps).');
    return steps;
  }
}
