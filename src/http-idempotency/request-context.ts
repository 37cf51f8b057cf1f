import type { Transaction } from 'kysely';
import type { DataLayer } from '../store/data-layer.js';
import type { IdempotentResponse } from './stored-response.js';

/**
 * What a request handler is given. Its writes go in `transaction`: they, any
 * `producer.enqueue(job, { tx })` and the response the callback returns commit together, fenced
 * by the request's claim; the response is what the handler answers, and what every retry with
 * the same key and request gets again.
 */
export interface RequestContext {
  /** The request's `Idempotency-Key`; undefined when the request runs without one (a method not covered, or no key sent while `keyRequired` is false). */
  readonly key: string | undefined;
  /** Who asks (the adapter's `client(request)`): the key's scope is this client's. */
  readonly client: string | undefined;
  /** How many times the key has been claimed: above 1 when an earlier attempt of this request crashed or lost its lease. */
  readonly attempt: number;
  /** Aborts when the request's lease is lost (its `transaction` then rolls back) or the client went away. */
  readonly signal: AbortSignal;
  /**
   * Runs `fn` in a transaction on the keys' Kysely database; the response it returns is stored
   * with the key's completion in that transaction (a 5xx is not: the transaction rolls back and
   * the key is released). Called at most once per request. Returns `fn`'s response.
   */
  transaction<R extends IdempotentResponse>(fn: (tx: Transaction<any>) => Promise<R>): Promise<R>;
  /** As above, in a transaction of your own data layer (`idempotent-jobs/pg`, `/prisma`, …); `tx` is its transaction object. */
  transaction<Tx, R extends IdempotentResponse>(layer: DataLayer<Tx>, fn: (tx: Tx) => Promise<R>): Promise<R>;
}

/** A request handler: answers with a response, its writes in `ctx.transaction`. */
export type RequestHandler = (ctx: RequestContext) => Promise<IdempotentResponse>;

/** `ctx.transaction`'s two forms, told apart. */
export function transactionArguments<Tx, R>(
  first: DataLayer<Tx> | ((tx: Transaction<any>) => Promise<R>),
  second: ((tx: Tx) => Promise<R>) | undefined,
): { layer: DataLayer<Tx> | undefined; fn: (tx: any) => Promise<R> } {
  if (typeof first === 'function') return { layer: undefined, fn: first };
  if (first && typeof first === 'object' && typeof first.transaction === 'function' && typeof second === 'function') return { layer: first, fn: second };
  throw new TypeError('ctx.transaction takes (fn) or (dataLayer, fn).');
}

/** Thrown by a second `ctx.transaction` of one request: a request commits once. */
export class SecondTransactionError extends Error {
  constructor() {
    super('ctx.transaction was called twice for one request: a request commits its writes and its response once. Put all of its writes in one callback.');
    this.name = 'SecondTransactionError';
  }
}
