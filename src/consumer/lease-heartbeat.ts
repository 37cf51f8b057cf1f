import { LeaseLostError } from '../errors.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import type { Claim } from '../store/claim-outcome.js';
import type { JobLogger } from './job-logger.js';

/** What a lease's heartbeat needs and tells. */
export interface LeaseHeartbeatOptions {
  /** Extends the lease. */
  readonly keys: IdempotencyKeys;
  /** The held claim. */
  readonly claim: Claim;
  /** Each extension's length. */
  readonly leaseMs: number;
  /** How often to extend. */
  readonly heartbeatMs: number;
  /** Aborted with a `LeaseLostError` when the lease is lost: the handler's signal. */
  readonly controller: AbortController;
  /** The job's logger. */
  readonly log: JobLogger;
  /** Told each extension (`lease-extended`) and the loss (`lease-lost`). */
  readonly onBeat: (kind: 'lease-extended' | 'lease-lost') => void;
}

/**
 * Extends the lease every `heartbeatMs`; on loss, aborts the handler's signal. One extension
 * at a time: a beat that finds the previous one still waiting skips. An extension that fails
 * (Postgres unreachable, or a lock wait past its timeout because a transaction that is
 * completing the key holds it) is "not known yet": the next beat tries again, and completion
 * is fenced anyway. The key found completed by this claim is the job's own commit, never a loss.
 * Returns the heartbeat's stop.
 */
export function startLeaseHeartbeat(options: LeaseHeartbeatOptions): () => void {
  const { keys, claim, controller, log } = options;
  let stopped = false;
  let inFlight = false;
  const stop = () => {
    stopped = true;
    clearInterval(timer);
  };
  const timer = setInterval(async () => {
    if (inFlight) return;
    inFlight = true;
    try {
      const extension = await keys.extend(claim, options.leaseMs);
      if (stopped) return;
      if (extension === 'completed') {
        stop();
      } else if (extension === null) {
        stop();
        options.onBeat('lease-lost');
        log.warn({ outcome: 'lease-lost' }, 'lease lost: another worker took the key over');
        controller.abort(new LeaseLostError(claim.scope, claim.key, claim.fence));
      } else {
        options.onBeat('lease-extended');
      }
    } catch (error) {
      if (!stopped) log.warn({ err: error }, 'lease heartbeat failed; trying again at the next beat');
    } finally {
      inFlight = false;
    }
  }, options.heartbeatMs);
  timer.unref();
  return stop;
}
