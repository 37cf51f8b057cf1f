import type { ConcurrencySlot, IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { startSlotHeartbeat } from './concurrency-slot-heartbeat.js';
import type { RunFailures } from './run-failures.js';
import type { Run, RunResult } from './run-outcome.js';
import type { ConcurrencyLimit } from './wire-contract.js';
import type { ResolvedWorkerTiming } from './worker-timing.js';

/** What a run in concurrency slots needs of the runner around it. */
export interface SlotsRunDeps<P, M> {
  readonly keys: IdempotencyKeys;
  readonly timing: ResolvedWorkerTiming;
  readonly failures: RunFailures<P, M>;
  /** Runs the job's key once its slots are held. */
  readonly runClaimed: (run: Run<P, M>) => Promise<RunResult>;
  /**
   * The adapter wakes a deferred waiter when a slot frees (BullMQ's worker promotes it): a
   * refused job is recorded as a waiter under its delivery's id and queue, which the freeing
   * run's notification names. Unset: waiters ask again when their deferral ends.
   */
  readonly wakesWaiters?: boolean;
}

/**
 * A job with concurrency limits: takes a slot of each of its concurrency keys first (one
 * statement each), runs in them and frees them, whatever the run came to; a key at its limit
 * defers the job without using an attempt, as an in-progress duplicate is.
 *
 * *Why sorted, and why all or nothing:* every job takes its keys' slots in the same order (by
 * key, `concurrencyLimitsOf`), and one refused frees the slots taken before it before the
 * job is deferred. So no job holds a slot while it waits for another (no deadlock, and no slot
 * held by a job that is not running), and two jobs never wait on each other in a cycle.
 *
 * *Held for as long as the run:* the slots' heartbeat renews them while the run goes on
 * (`concurrency-slot-heartbeat.ts`), so a run longer than the lease keeps them, on the fast path
 * (whose key is not `processing` while it runs) and after a leased run's commit alike; a run
 * that can no longer show it holds them rolls back instead of committing (`run.slotsLost`).
 *
 * A slot that cannot be freed (Postgres gone) frees itself when its time is up: never later
 * than the run's lease. Freeing a slot that a job waits for wakes the oldest waiter
 * (`sql/concurrency-slot-wakes.ts`).
 */
export async function runInSlots<P, M>(run: Run<P, M>, limits: readonly ConcurrencyLimit[], deps: SlotsRunDeps<P, M>): Promise<RunResult> {
  const { keys, timing, failures } = deps;
  const { scope, key } = run.identity;
  const groups = limits.length > 1 ? limits.map((limit) => limit.key) : undefined;
  const waiter = deps.wakesWaiters && run.delivery.id !== undefined ? { jobId: run.delivery.id, queue: run.delivery.queue } : {};
  const held: ConcurrencySlot[] = [];
  const heldSince = performance.now();
  let heartbeat: ReturnType<typeof startSlotHeartbeat> | undefined;
  try {
    for (const limit of limits) {
      let answer: Awaited<ReturnType<IdempotencyKeys['acquireConcurrencySlot']>>;
      try {
        answer = await keys.acquireConcurrencySlot(scope, key, limit, {
          leaseMs: timing.leaseMs,
          starvationMs: timing.concurrencyStarvationMs,
          ...(groups && { groups }),
          ...waiter,
        });
      } catch (error) {
        return failures.storeFault(run, error);
      }
      if (!answer.acquired) return failures.defer(answer.retryAfterMs, 'concurrency-limit', limit.key);
      held.push(answer);
    }
    heartbeat = startSlotHeartbeat({ keys, scope, key, slots: held, leaseMs: timing.leaseMs, heartbeatMs: timing.heartbeatMs, heldSince, log: run.log });
    return await deps.runClaimed({ ...run, slotsLost: heartbeat.signal });
  } finally {
    heartbeat?.stop();
    for (const slot of held) {
      await keys.releaseConcurrencySlot(scope, key, slot).catch((error: unknown) => {
        run.log.warn({ err: error, concurrencyKey: slot.group }, 'could not free the concurrency slot; it frees itself when its time is up');
      });
    }
  }
}
