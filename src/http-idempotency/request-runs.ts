import type { Transaction } from 'kysely';
import { LeaseLostError, ResultNotStorableError, StoreUnavailableError } from '../errors.js';
import type { ExecuteOnceOutcome } from '../protocol/effect-options.js';
import type { Claim } from '../store/claim-outcome.js';
import type { DataLayer } from '../store/data-layer.js';
import { SecondTransactionError, transactionArguments, type RequestContext, type RequestHandler } from './request-context.js';
import { keepRequestLease } from './request-lease.js';
import type { ResolvedIdempotentRequestsOptions } from './request-options.js';
import { encodeResponse, UnsendableResponseError, type IdempotentResponse, type RequestAnswer, type StoredResponse } from './stored-response.js';

/** How one run of a handler ended. */
export type RunResult =
  | {
      /** The handler's response committed with the key (or, unprotected, was answered). */
      readonly kind: 'answered';
      /** What to send. */
      readonly answer: RequestAnswer;
      /** False for a 5xx, which was not stored (the key was released, or never written). */
      readonly stored: boolean;
    }
  | {
      /** The key was settled or in flight when the transaction claimed it (database-only): the handler's work rolled back. */
      readonly kind: 'claim-outcome';
      /** What the claim found. */
      readonly outcome: Exclude<ExecuteOnceOutcome<unknown>, { kind: 'executed' }>;
    }
  | {
      /** The lease was lost: the transaction rolled back; a retry holds the key now. */
      readonly kind: 'lease-lost';
    };

/** A 5xx answered from inside `ctx.transaction`: it rolls the transaction back, the key is not completed. */
class NotStored extends Error {
  constructor(readonly response: IdempotentResponse) {
    super('a 5xx response is not stored');
  }
}

/** A database-only transaction whose claim met a settled or in-flight key: nothing of the handler commits. */
class ClaimAnswered extends Error {
  constructor(readonly outcome: Exclude<ExecuteOnceOutcome<unknown>, { kind: 'executed' }>) {
    super(`the request's key is ${outcome.kind}`);
  }
}

/** What every run needs. */
export interface RunInput {
  readonly options: ResolvedIdempotentRequestsOptions;
  readonly handler: RequestHandler;
  readonly key: string;
  readonly scope: string;
  readonly client: string;
  readonly fingerprint: string;
  readonly signal: AbortSignal | undefined;
}

/**
 * A function handler's run under a leased claim (held before the handler starts, so that what
 * it does before its transaction — a call to another system — is covered by the lease, as a
 * worker's function handler is). The transaction completes the key, fenced, with the response;
 * a response given without a transaction is stored in a transaction of its own. A thrown error
 * or a 5xx releases the key; a lost lease rolls the transaction back.
 */
export async function runLeased(input: RunInput, claim: Claim): Promise<RunResult> {
  const { keys, leaseMs, maxResponseBytes, maxStoredResponseBytes, logger } = input.options;
  const lease = new AbortController();
  const stopLease = keepRequestLease(keys, claim, leaseMs, lease, logger);
  let committed: { stored: StoredResponse; answer: RequestAnswer; response: IdempotentResponse } | undefined;
  let began = false;
  const commit = async <Tx>(layer: DataLayer<Tx> | undefined, fn: (tx: any) => Promise<IdempotentResponse>) => {
    let encoded: ReturnType<typeof encodeResponse> | undefined;
    let response: IdempotentResponse | undefined;
    const effect = async (tx: unknown) => {
      response = await fn(tx);
      if (isServerError(response)) throw new NotStored(response);
      encoded = encodeResponse(response, maxResponseBytes, maxStoredResponseBytes);
      return encoded.stored;
    };
    if (layer) await keys.commitEffectIn(claim, layer, effect);
    else await keys.commitEffect(claim, effect);
    committed = { stored: encoded!.stored, answer: encoded!.answer, response: response! };
    return response!;
  };
  const ctx = contextFor(input, claim.attempts, anySignal(lease.signal, input.signal), async (layer, fn) => {
    if (began) throw new SecondTransactionError();
    began = true;
    return commit(layer, fn);
  });
  try {
    const response = await input.handler(ctx);
    if (committed) {
      if (response !== committed.response) logger.warn({ scope: input.scope, key: input.key }, 'the handler returned another response than the one its transaction stored; answering with the stored one');
      return { kind: 'answered', answer: committed.answer, stored: true };
    }
    if (isServerError(response)) {
      const answer = encodeResponse(response, Number.MAX_SAFE_INTEGER).answer;
      await releaseQuietly(input, claim, new Error(`answered ${response.status}`));
      return { kind: 'answered', answer, stored: false };
    }
    // A response without a transaction (a validation error, a call's outcome): stored on its own.
    await commit(undefined, async () => response);
    return { kind: 'answered', answer: committed!.answer, stored: true };
  } catch (error) {
    if (committed) {
      logger.error({ err: error, scope: input.scope, key: input.key }, 'the handler threw after its transaction committed; answering with the stored response');
      return { kind: 'answered', answer: committed.answer, stored: true };
    }
    if (error instanceof LeaseLostError) return { kind: 'lease-lost' };
    await releaseQuietly(input, claim, error);
    if (error instanceof NotStored) return { kind: 'answered', answer: encodeResponse(error.response, Number.MAX_SAFE_INTEGER).answer, stored: false };
    throw error;
  } finally {
    stopLease();
  }
}

/**
 * A database-only handler's run: no claim before the handler; `ctx.transaction` claims the key
 * as completed inside the handler's own transaction (the fast path), so the claim, the writes
 * and the response commit together, and a crash leaves nothing. A key found settled or in
 * flight there rolls the handler's writes back. A response given without a transaction is
 * stored the same way, alone.
 */
export async function runDatabaseOnly(input: RunInput): Promise<RunResult> {
  const { keys, maxResponseBytes, maxStoredResponseBytes, retention } = input.options;
  let committed: { answer: RequestAnswer; response: IdempotentResponse } | undefined;
  let began = false;
  const commit = async <Tx>(layer: DataLayer<Tx> | undefined, fn: (tx: any) => Promise<IdempotentResponse>) => {
    let encoded: ReturnType<typeof encodeResponse> | undefined;
    let response: IdempotentResponse | undefined;
    const effect = async (tx: unknown) => {
      response = await fn(tx);
      if (isServerError(response)) throw new NotStored(response);
      encoded = encodeResponse(response, maxResponseBytes, maxStoredResponseBytes);
      return encoded.stored;
    };
    const options = retention ? { retention } : {};
    const outcome = layer
      ? await keys.executeOnceIn(input.scope, input.key, input.fingerprint, layer, (tx) => effect(tx), options)
      : await keys.executeOnce(input.scope, input.key, input.fingerprint, (tx: Transaction<any>) => effect(tx), options);
    if (outcome.kind !== 'executed') throw new ClaimAnswered(outcome);
    // A COMMIT cut off in flight and resolved from the key returns the stored response, not ours.
    committed = encoded ? { answer: encoded.answer, response: response! } : undefined;
    return response!;
  };
  const ctx = contextFor(input, 1, input.signal ?? NEVER, async (layer, fn) => {
    if (began) throw new SecondTransactionError();
    began = true;
    return commit(layer, fn);
  });
  try {
    const response = await input.handler(ctx);
    if (committed) return { kind: 'answered', answer: committed.answer, stored: true };
    if (isServerError(response)) return { kind: 'answered', answer: encodeResponse(response, Number.MAX_SAFE_INTEGER).answer, stored: false };
    await commit(undefined, async () => response);
    return { kind: 'answered', answer: committed!.answer, stored: true };
  } catch (error) {
    if (committed) {
      input.options.logger.error({ err: error, scope: input.scope, key: input.key }, 'the handler threw after its transaction committed; answering with the stored response');
      return { kind: 'answered', answer: committed.answer, stored: true };
    }
    if (error instanceof ClaimAnswered) return { kind: 'claim-outcome', outcome: error.outcome };
    if (error instanceof NotStored) return { kind: 'answered', answer: encodeResponse(error.response, Number.MAX_SAFE_INTEGER).answer, stored: false };
    throw error;
  }
}

/** A run without a key (a method not covered, or no key where none is required): the handler's transaction is a plain one. */
export async function runUnprotected(input: Omit<RunInput, 'key' | 'scope' | 'fingerprint' | 'client'> & { readonly client: string | undefined }): Promise<Extract<RunResult, { kind: 'answered' }>> {
  const { keys } = input.options;
  const ctx = contextFor({ ...input, key: undefined }, 1, input.signal ?? NEVER, (layer, fn) => (layer ? layer.transaction((tx) => fn(tx)) : keys.db.transaction().execute((tx) => fn(tx))));
  const response = await input.handler(ctx);
  return { kind: 'answered', answer: encodeResponse(response, Number.MAX_SAFE_INTEGER).answer, stored: false };
}

/** True for the errors a run maps to an answer of its own (not the handler's to report). */
export function isMiddlewareFault(error: unknown): error is StoreUnavailableError | UnsendableResponseError | ResultNotStorableError | SecondTransactionError {
  return error instanceof StoreUnavailableError || error instanceof UnsendableResponseError || error instanceof ResultNotStorableError || error instanceof SecondTransactionError;
}

const NEVER = new AbortController().signal;

function contextFor(
  input: { readonly key: string | undefined; readonly client: string | undefined },
  attempt: number,
  signal: AbortSignal,
  transaction: (layer: DataLayer<unknown> | undefined, fn: (tx: any) => Promise<IdempotentResponse>) => Promise<IdempotentResponse>,
): RequestContext {
  return {
    key: input.key,
    client: input.client,
    attempt,
    signal,
    transaction: ((first: any, second?: any) => {
      const { layer, fn } = transactionArguments(first, second);
      return transaction(layer, fn as (tx: any) => Promise<IdempotentResponse>);
    }) as RequestContext['transaction'],
  };
}

function isServerError(response: IdempotentResponse): boolean {
  return response !== null && typeof response === 'object' && typeof response.status === 'number' && response.status >= 500;
}

function anySignal(lease: AbortSignal, client: AbortSignal | undefined): AbortSignal {
  return client ? AbortSignal.any([lease, client]) : lease;
}

/** Releases the key for a retry; a store that cannot be reached leaves it to its lease, which ends and lets a retry take it over. */
async function releaseQuietly(input: RunInput, claim: Claim, error: unknown): Promise<void> {
  try {
    await input.options.keys.release(claim, error);
  } catch (failure) {
    input.options.logger.warn({ err: failure, scope: input.scope, key: input.key }, 'could not release the request key; it is freed when its lease ends');
  }
}
