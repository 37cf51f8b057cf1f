import type { Job } from 'bullmq';
import type { FreedSlot, KeySettledListener } from '../store/key-settled-listener.js';

/** Deferred jobs remembered at most; the oldest are forgotten first (they then wake when their delay ends). */
const MAX_REMEMBERED = 10_000;

interface Deferral {
  readonly job: Job;
  /** Its move to delayed is done: it can be promoted. */
  moved: boolean;
  /** Its slot freed while it was being moved: promote it once moved. */
  woken: boolean;
}

/**
 * Wakes a job this worker deferred for a concurrency limit as soon as a slot of that key frees,
 * instead of when its delay ends: a run that frees a slot names the key's oldest waiter on a
 * notification (`sql/concurrency-slot-wakes.ts`, received by the {@link KeySettledListener}),
 * and the worker that deferred that job promotes it (BullMQ's delayed job back to waiting). A
 * deferred job's delay stays its fallback: a notification lost (the listener reconnecting) or
 * a job deferred by a worker that is gone costs its waiting, not its run.
 *
 * Only the deferring worker promotes, so one freed slot moves one job, not one per worker. A
 * slot that frees while the job is still being moved to delayed (it was refused a moment
 * before) is not missed: the job is promoted once moved.
 */
export class ConcurrencyWaiterWakes {
  readonly #queue: string;
  readonly #listener: KeySettledListener;
  readonly #deferred = new Map<string, Deferral>();
  readonly #onFreed = (freed: FreedSlot) => this.#wake(freed);
  #unwatch: (() => void) | undefined;

  constructor(listener: KeySettledListener, queue: string) {
    this.#listener = listener;
    this.#queue = queue;
  }

  /** `job` is about to be moved to delayed for a concurrency limit; returns what to call once it is. */
  deferring(job: Job): () => void {
    if (job.id === undefined) return () => {};
    const deferral: Deferral = { job, moved: false, woken: false };
    this.#deferred.delete(job.id);
    this.#deferred.set(job.id, deferral);
    if (this.#deferred.size > MAX_REMEMBERED) this.#deferred.delete(this.#deferred.keys().next().value!);
    // Each time: the listener reconnects here after losing its connection.
    this.#unwatch = this.#listener.watchFreedSlots(this.#onFreed);
    return () => {
      deferral.moved = true;
      if (deferral.woken) this.#promote(deferral);
    };
  }

  /** `job` is running again (promoted, or its delay ended): nothing to wake. */
  running(job: Job): void {
    if (job.id !== undefined) this.#deferred.delete(job.id);
  }

  /** Stops listening; jobs still deferred wake when their delay ends. */
  close(): void {
    this.#unwatch?.();
    this.#deferred.clear();
  }

  #wake(freed: FreedSlot): void {
    if (freed.queue !== this.#queue) return;
    const deferral = this.#deferred.get(freed.jobId);
    if (!deferral) return;
    if (deferral.moved) this.#promote(deferral);
    else deferral.woken = true;
  }

  #promote(deferral: Deferral): void {
    if (deferral.job.id !== undefined) this.#deferred.delete(deferral.job.id);
    // Refused when the job is no longer delayed (its delay ended meanwhile): it runs anyway.
    deferral.job.promote().catch(() => {});
  }
}
