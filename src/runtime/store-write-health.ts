import type { WorkerEvent } from '../consumer/worker-event.js';

/**
 * What the `postgres-writes` health check knows: the last store fault a job met
 * (`store-unavailable`), and whether a job got past the store since. `select 1` (the `postgres`
 * check) passes on a server that reads but takes no writes — a full disk (53100), a demoted
 * primary (25006) — while every job is deferred; this check fails then, with what Postgres
 * answered, until a job completes (or replays) again or no fault has been seen for `quietMs`. A
 * successful claim does not clear it: on a full disk a claim may fit in a page the table has.
 */
export class StoreWriteHealth {
  readonly #quietMs: number;
  readonly #now: () => number;
  #fault: { readonly at: number; readonly since: number; readonly cause: string; count: number } | undefined;

  /** `quietMs`: how long after the last fault, with no job through, the check passes again. */
  constructor(options: { readonly quietMs?: number; readonly now?: () => number } = {}) {
    this.#quietMs = options.quietMs ?? 30_000;
    this.#now = options.now ?? Date.now;
  }

  /** Takes one worker event into account (give it every `'event'`). */
  observe(event: WorkerEvent): void {
    if (event.kind === 'store-unavailable') {
      const at = this.#now();
      this.#fault = { at, since: this.#fault?.since ?? at, cause: event.cause ?? 'unknown store fault', count: (this.#fault?.count ?? 0) + 1 };
    } else if (event.kind === 'completed' || event.kind === 'replayed') {
      this.#fault = undefined;
    }
  }

  /** The health check: throws, saying what Postgres answers, while jobs are deferred by store faults. */
  check(): void {
    const fault = this.#fault;
    if (!fault || this.#now() - fault.at > this.#quietMs) return;
    throw new Error(
      `jobs are deferred: Postgres refused their writes ${fault.count} time(s) in ${Math.round((this.#now() - fault.since) / 1000)} s, last: ${fault.cause}`,
    );
  }
}
