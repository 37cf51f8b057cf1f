import { LeaseLostError } from '../errors.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import type { Claim } from '../store/claim-outcome.js';
import type { RequestLogger } from './request-options.js';

/**
 * Keeps a request's lease while its handler runs: extends it every third of `leaseMs`; when an
 * extension finds the key taken over, aborts `controller` with a {@link LeaseLostError} (the
 * handler's `ctx.signal`; its completion is fenced out anyway). An extension that fails is
 * "not known yet": the next beat tries again. Returns the heartbeat's stop.
 */
export function keepRequestLease(keys: IdempotencyKeys, claim: Claim, leaseMs: number, controller: AbortController, log: RequestLogger): () => void {
  let stopped = false;
  let beating = false;
  const timer = setInterval(async () => {
    if (beating || stopped) return;
    beating = true;
    try {
      const extension = await keys.extend(claim, leaseMs);
      if (stopped || extension === 'completed') return;
      if (extension === null) {
        stopped = true;
        clearInterval(timer);
        log.warn({ scope: claim.scope, key: claim.key, fence: claim.fence }, 'request lease lost: a retry took the key over; this attempt rolls back');
        controller.abort(new LeaseLostError(claim.scope, claim.key, claim.fence));
      }
    } catch (error) {
      if (!stopped) log.warn({ err: error, scope: claim.scope, key: claim.key }, 'request lease extension failed; trying again at the next beat');
    } finally {
      beating = false;
    }
  }, Math.max(100, Math.floor(leaseMs / 3)));
  timer.unref();
  return () => {
    stopped = true;
    clearInterval(timer);
  };
}
