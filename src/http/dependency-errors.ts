import { isTransientStoreError } from '../store/pg-errors.js';

/** Socket errors after which the same request may succeed once the peer is back. */
const NETWORK_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN']);

/**
 * ioredis and Redis saying "not now": the connection is closed or gave up retrying
 * (`MaxRetriesPerRequestError`), the offline queue is off, or the server is loading, busy,
 * failing over or read-only for the moment.
 */
const REDIS_UNAVAILABLE = /Connection is closed|Stream isn't writeable|^(LOADING|BUSY|TRYAGAIN|CLUSTERDOWN|MASTERDOWN|READONLY)\b/;

/** True when `error` (or an error it wraps) means Redis cannot be reached right now. */
export function isRedisUnavailable(error: unknown): boolean {
  return someCause(error, (each) => {
    if (!(each instanceof Error)) return false;
    const code = (each as { code?: unknown }).code;
    return each.name === 'MaxRetriesPerRequestError' || (typeof code === 'string' && NETWORK_CODES.has(code)) || REDIS_UNAVAILABLE.test(each.message);
  });
}

/**
 * True when a request failed because Postgres or Redis could not serve it right now
 * (connection refused, reset or terminated, server restarting, serialization failure, …):
 * the client should retry the same request later, which is safe under its Idempotency-Key.
 * Store errors are classified by the store's own {@link isTransientStoreError}.
 */
export function isTransientDependencyError(error: unknown): boolean {
  return someCause(error, isTransientStoreError) || isRedisUnavailable(error);
}

/** Tests `error`, the errors it was caused by, and an AggregateError's members (Node's connect to several addresses). */
function someCause(error: unknown, test: (error: unknown) => boolean): boolean {
  const pending: unknown[] = [error];
  for (let seen = 0; pending.length > 0 && seen < 16; seen++) {
    const each = pending.shift();
    if (each === undefined || each === null) continue;
    if (test(each)) return true;
    if (each instanceof AggregateError) pending.push(...each.errors);
    if (each instanceof Error && each.cause !== undefined) pending.push(each.cause);
  }
  return false;
}
