/** Options of {@link StoreFaultStreaks}. */
export interface StoreFaultStreaksOptions {
  /** How long a key's store faults in a row are deferred without using an attempt (`storeRetryWindowMs`). */
  readonly windowMs: number;
  /** Most keys followed at once; past it, the key seen longest ago is forgotten. @defaultValue `100_000` */
  readonly maxTracked?: number;
  /** Milliseconds on a monotonic clock (tests inject one). @defaultValue `performance.now` */
  readonly now?: () => number;
}

interface Streak {
  /** When the first fault of the streak was seen. */
  readonly since: number;
  /** When a fault of it was seen last. */
  seen: number;
}

/**
 * When each key's store faults in a row began, as this process saw them: what bounds the
 * deferrals of a job whose store fault never passes. A fault classified as transient (a dropped
 * connection, a server out of memory) defers the job without using an attempt; one that is in
 * fact deterministic (a statement that crashes its backend every time, a misclassified error)
 * would defer it for ever, even on its last attempt. Past the window, each fault counts as an
 * attempt until a run gets past the store.
 *
 * Kept in memory rather than on the broker or in Postgres: the brokers cannot all carry it
 * (a JetStream `nak` changes nothing on the message; a BullMQ job has no field for it), and
 * Postgres is the very thing that is failing. So a process's restart starts its streaks again,
 * and with several processes a key reaches the window in whichever process saw its first fault,
 * at its next delivery there. A key unseen for a whole window is forgotten: its faults went to
 * other processes, or passed.
 */
export class StoreFaultStreaks {
  readonly #windowMs: number;
  readonly #maxTracked: number;
  readonly #now: () => number;
  /** In the order the keys were last seen (a sighting moves its key to the end): the stalest first. */
  readonly #streaks = new Map<string, Streak>();

  constructor(options: StoreFaultStreaksOptions) {
    this.#windowMs = options.windowMs;
    this.#maxTracked = options.maxTracked ?? 100_000;
    this.#now = options.now ?? (() => performance.now());
  }

  /** Keys followed now. */
  get size(): number {
    return this.#streaks.size;
  }

  /**
   * Notes a store fault of `id` (a key's scope and key); true when its faults in a row began
   * more than the window ago, so this one should count as an attempt.
   */
  outlasted(id: string): boolean {
    const now = this.#now();
    const streak = this.#streaks.get(id);
    this.#streaks.delete(id);
    this.#forgetStale(now);
    const kept = streak && now - streak.seen <= this.#windowMs ? streak : { since: now, seen: now };
    kept.seen = now;
    this.#streaks.set(id, kept);
    if (this.#streaks.size > this.#maxTracked) this.#streaks.delete(this.#streaks.keys().next().value!);
    return now - kept.since > this.#windowMs;
  }

  /** Forgets `id`'s streak: a run of it got past the store. */
  end(id: string): void {
    this.#streaks.delete(id);
  }

  #forgetStale(now: number): void {
    for (const [id, streak] of this.#streaks) {
      if (now - streak.seen <= this.#windowMs) return;
      this.#streaks.delete(id);
    }
  }
}
