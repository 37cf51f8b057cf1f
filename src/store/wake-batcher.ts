/**
 * The wakes of concurrency waiters asked for in one turn of the event loop, sent as one
 * statement (`wake_concurrency_waiters` takes a list of keys, each with a count).
 *
 * *Why:* a group's jobs end together, when their shared transaction commits, and each asks to
 * wake its keys' waiters (`runInTransactionSlots`): one statement for the group instead of one
 * per job. A key named by several of them counts once per run that freed a slot of it, so it
 * wakes as many of its waiters as slots were freed, as that many releases of slot rows would.
 */
export class WakeBatcher {
  readonly #wake: (groups: readonly string[], counts: readonly number[], wakeAgainAfterMs: number) => Promise<number>;
  /** The keys asked for in this turn, each with its count, by wake-again interval (one statement per interval). */
  readonly #pending = new Map<number, { readonly counts: Map<string, number>; readonly woken: Promise<number> }>();

  constructor(wake: (groups: readonly string[], counts: readonly number[], wakeAgainAfterMs: number) => Promise<number>) {
    this.#wake = wake;
  }

  /** Wakes the oldest waiter of each of `groups`, in one statement with the other wakes asked for in this turn; resolves with how many that statement woke. */
  wake(groups: readonly string[], wakeAgainAfterMs: number): Promise<number> {
    let pending = this.#pending.get(wakeAgainAfterMs);
    if (!pending) {
      const counts = new Map<string, number>();
      const woken = new Promise<number>((resolve, reject) => {
        setImmediate(() => {
          this.#pending.delete(wakeAgainAfterMs);
          this.#wake([...counts.keys()], [...counts.values()], wakeAgainAfterMs).then(resolve, reject);
        });
      });
      pending = { counts, woken };
      this.#pending.set(wakeAgainAfterMs, pending);
    }
    for (const group of new Set(groups)) pending.counts.set(group, (pending.counts.get(group) ?? 0) + 1);
    return pending.woken;
  }
}
