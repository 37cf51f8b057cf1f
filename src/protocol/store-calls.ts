import { StoreUnavailableError } from '../errors.js';
import type { Claim } from '../store/claim-outcome.js';
import { transientStoreFault } from '../store/pg-errors.js';

/** Runs one of the store's own statements for a key: a transient fault becomes a {@link StoreUnavailableError}. */
export async function storeCall<T>(scope: string, key: string, operation: string, call: () => Promise<T>): Promise<T> {
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
export function effectFault(claim: Claim, error: unknown): unknown {
  const fault = transientStoreFault(error);
  if (fault === undefined || fault === 'timeout') return error;
  return new StoreUnavailableError(claim.scope, claim.key, 'effect transaction', { cause: error });
}

/**
 * The errors one transaction's effect threw, told apart from the transaction's end failing: an
 * effect's error is its own, never a COMMIT whose outcome the key must tell.
 */
export class EffectErrors {
  readonly #marked = new WeakSet<object>();

  /** Runs the effect; what it throws is marked as its own (a store fault of its connection as {@link StoreUnavailableError}). */
  async run<T>(claim: Claim, effect: () => Promise<T>): Promise<T> {
    try {
      return await effect();
    } catch (error) {
      const thrown = effectFault(claim, error);
      if (thrown !== null && typeof thrown === 'object') this.#marked.add(thrown);
      throw thrown;
    }
  }

  /** True when `error` came from the effect. */
  has(error: unknown): boolean {
    return error !== null && typeof error === 'object' && this.#marked.has(error);
  }
}

/** A key's identity as one string (scope and key cannot contain NUL). */
export function keyIdentity(k: { readonly scope: string; readonly key: string }): string {
  return `${k.scope}\u0000${k.key}`;
}

/** The kind of an effect with a queue or job name: both, as one string. */
export function kindOf(options: { readonly queue?: string; readonly jobName?: string }): string | undefined {
  return options.queue === undefined && options.jobName === undefined ? undefined : `${options.queue ?? ''}\u0000${options.jobName ?? ''}`;
}
