import { StoreUnavailableError } from '../errors.js';
import type { Claim } from '../store/claim-outcome.js';
import type { KeyStore, StepStore } from '../store/key-store.js';
import { transientStoreFault } from '../store/pg-errors.js';
import type { StepPlace, StepRecord } from '../store/records.js';

// A transaction whose end met a transient fault may have committed with its reply lost. What
// was written tells: the key, or the step's record, under this claim's owner and fence.

/**
 * True when `error`, thrown by a transaction's end (not by its effect), may have cut off an
 * applied COMMIT: a transient fault, whose outcome only the key can tell.
 */
export function mayHaveCommitted(error: unknown): boolean {
  return transientStoreFault(error) !== undefined;
}

/**
 * The key tells: completed under this claim's owner token and fence means the COMMIT was
 * applied (returns the stored result); anything else, or no answer, means it was not, or not
 * yet (a {@link StoreUnavailableError}: try again later).
 */
export async function resultOfInterruptedCommit(store: KeyStore, claim: Claim, fault: unknown): Promise<unknown> {
  const record = await store.get(claim.scope, claim.key).catch(() => undefined);
  if (record?.status === 'completed' && record.owner === claim.owner && record.fence === claim.fence) return record.result;
  throw new StoreUnavailableError(claim.scope, claim.key, 'effect transaction', { cause: fault });
}

/**
 * A database step's transaction met a fault at its end: the step's record tells. Recorded under
 * this claim's fence means it committed (returns the record); otherwise a {@link StoreUnavailableError}.
 */
export async function stepOfInterruptedCommit(steps: StepStore, claim: Claim, step: StepPlace, fault: unknown): Promise<StepRecord> {
  const recorded = (await steps.load(claim.scope, claim.key).catch(() => [])).find((s) => s.name === step.name);
  if (recorded?.recordedAt && recorded.fence === claim.fence) return recorded;
  throw new StoreUnavailableError(claim.scope, claim.key, `transaction of step "${step.name}"`, { cause: fault });
}
