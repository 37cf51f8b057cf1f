/**
 * What a producer sends again after a Redis Sentinel failover. Sentinel promotes a replica that
 * may lack the last adds the old master acknowledged (replication is asynchronous; after
 * `SENTINEL FAILOVER` the old master even goes on acknowledging until a sentinel demotes it), so
 * the remedy of docs/operations.md applies: send every request acknowledged around the failover
 * again with the same key. Where the job survived the add is a no-op (or, its key completed, a
 * replay); where the failover lost it, it is added again. Pure: the harness supplies the faults
 * as carried out and the producer's keys.
 */
import type { NemesisEvent } from './nemesis.js';
import type { ProducedKey } from './producer-load.js';

/**
 * How long before a failover (or a crash of the master) an acknowledged add may still be missing
 * on the replica that takes over: well above the replication lag of a loaded 2-core machine.
 */
export const RESEND_BEFORE_MS = 10_000;

/**
 * How long after the failover was over (the set healthy again, the old master a replica) adds
 * are still sent again: a client that had not yet followed `+switch-master`.
 */
export const RESEND_AFTER_MS = 5_000;

/** The Redis faults that change the master: a requested failover, and a crash of the master. */
const MASTER_CHANGES = new Set<string>(['redis-failover', 'redis-restart']);

/** A span of wall-clock time (ms since the epoch), both ends included. */
export interface ResendWindow {
  readonly from: number;
  readonly to: number;
}

/** The windows around each change of master the nemesis carried out. */
export function resendWindows(events: readonly NemesisEvent[], beforeMs = RESEND_BEFORE_MS, afterMs = RESEND_AFTER_MS): ResendWindow[] {
  return events
    .filter((event) => MASTER_CHANGES.has(event.kind) && !event.skipped)
    .map((event) => ({ from: event.at - beforeMs, to: event.endedAt + afterMs }));
}

/** The keys with an add acknowledged within one of `windows`: a producer sends each again once. */
export function keysToResend(keys: Iterable<ProducedKey>, windows: readonly ResendWindow[]): ProducedKey[] {
  const within = (at: number) => windows.some((window) => at >= window.from && at <= window.to);
  return [...keys].filter((key) => key.ackedAt.some(within));
}
