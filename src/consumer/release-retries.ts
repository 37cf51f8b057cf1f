import { findStoreUnavailable } from '../errors.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import type { FailedStep } from '../protocol/validate.js';
import type { Claim } from '../store/claim-outcome.js';
import { storeRetryDelayMs, type ResolvedWorkerTiming } from './worker-timing.js';

/** What {@link ReleaseRetries.release} came to. */
export type ReleaseAnswer =
  /** The key is released: the next claim takes it over at once. */
  | 'released'
  /** The claim no longer owned the key (taken over, or settled), or the store refused the release for good: the key is left to its lease. */
  | 'not-released'
  /** A store fault refused the release: it is being tried again in the background. */
  | 'retrying';

/** Options of {@link ReleaseRetries}. */
export interface ReleaseRetriesOptions {
  readonly keys: IdempotencyKeys;
  /** `storeRetryMinMs`/`storeRetryMaxMs` space the tries; `leaseMs` bounds them. */
  readonly timing: ResolvedWorkerTiming;
  /** Sets a timer (tests inject one). @defaultValue `setTimeout`, unref'd */
  readonly setTimer?: (run: () => void, ms: number) => void;
  /** Milliseconds on a monotonic clock (tests inject one). @defaultValue `performance.now` */
  readonly now?: () => number;
}

/**
 * Gives keys back, and keeps trying when the store refuses: a release that met a store fault is
 * sent again after `storeRetryMinMs`, doubling up to `storeRetryMaxMs`, until it goes through,
 * finds the claim no longer owns the key, or the lease has ended anyway.
 *
 * *Why:* a key whose release failed stays held until its lease ends, and its job, back from the
 * broker, is deferred as a duplicate of itself for all that time. The faults that refuse a
 * release pass: a full disk, where the release's row version finds room once Postgres has pruned
 * the dead versions of the row's page (which it cannot while many sessions hold the page, as
 * when every job of a batch is released at once); a restart, a dropped connection. The release
 * is fenced by the claim's owner token and fence, so a late one can never give back a key
 * someone else holds by then.
 */
export class ReleaseRetries {
  readonly #options: ReleaseRetriesOptions;
  readonly #setTimer: (run: () => void, ms: number) => void;
  readonly #now: () => number;
  #pending = 0;

  constructor(options: ReleaseRetriesOptions) {
    this.#options = options;
    this.#setTimer = options.setTimer ?? ((run, ms) => void setTimeout(run, ms).unref());
    this.#now = options.now ?? (() => performance.now());
  }

  /** Releases being tried again now. */
  get pending(): number {
    return this.#pending;
  }

  /**
   * Releases `claim`'s key with `release.error` (the failed attempt's, kept on the key for
   * operators) and `release.step`. Never rejects. `release.onReleasedLater` is told when a
   * release tried again in the background went through.
   */
  async release(claim: Claim, release: { readonly error?: unknown; readonly step?: FailedStep; readonly onReleasedLater?: () => void } = {}): Promise<ReleaseAnswer> {
    const { error, step, onReleasedLater } = release;
    try {
      return (await this.#options.keys.release(claim, error, step)) ? 'released' : 'not-released';
    } catch (fault) {
      if (!findStoreUnavailable(fault)) return 'not-released';
      this.#retry(claim, error, step, onReleasedLater);
      return 'retrying';
    }
  }

  #retry(claim: Claim, error: unknown, step: FailedStep | undefined, onReleased: (() => void) | undefined): void {
    const { keys, timing } = this.#options;
    // The lease ends at most leaseMs after now (its last extension was earlier): by then the key
    // is anyone's to take over, released or not.
    const until = this.#now() + timing.leaseMs;
    this.#pending++;
    const attempt = (tries: number) => {
      this.#setTimer(async () => {
        let done = true;
        try {
          if (await keys.release(claim, error, step)) onReleased?.();
        } catch (fault) {
          done = !findStoreUnavailable(fault) || this.#now() + storeRetryDelayMs(timing, tries + 1) >= until;
        }
        if (done) this.#pending--;
        else attempt(tries + 1);
      }, storeRetryDelayMs(timing, tries));
    };
    attempt(0);
  }
}
