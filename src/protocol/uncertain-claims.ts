/** Options of {@link UncertainClaims}. */
export interface UncertainClaimsOptions {
  /** Most keys remembered at once; past it, the one remembered longest ago is forgotten. @defaultValue `10_000` */
  readonly maxTracked?: number;
  /** Milliseconds on a monotonic clock (tests inject one). @defaultValue `performance.now` */
  readonly now?: () => number;
}

/**
 * The owner tokens of leased claims whose outcome is unknown, by key: the claim met a store
 * fault after the store had asked again once itself (see `store/sql/claim.ts`), so one of its
 * statements may have committed, holding the key under a token nobody knows. The next claim of that key through
 * the same `IdempotencyKeys` (the job's redelivery) is made with the same token, and the claim
 * function, finding the row held under it, returns it as that claim's own: the job runs at once
 * instead of waiting, a duplicate of itself, until the lease ends. A token is kept for one lease
 * at most (by then such a key is free anyway), and is taken by the key's next claim only.
 *
 * Reusing a token is safe only because exactly one claim carries it: it was never handed to
 * anyone who could act on it (its claim threw), and taking it removes it, so two deliveries of
 * the key claimed at once cannot both be answered as its holder (one gets the key, the other
 * finds it held). If the claim that took it meets a fault in turn, its own token is remembered.
 */
export class UncertainClaims {
  readonly #tokens = new Map<string, { readonly token: string; readonly until: number }>();
  readonly #maxTracked: number;
  readonly #now: () => number;

  constructor(options: UncertainClaimsOptions = {}) {
    this.#maxTracked = options.maxTracked ?? 10_000;
    this.#now = options.now ?? (() => performance.now());
  }

  /** Keys remembered now. */
  get size(): number {
    return this.#tokens.size;
  }

  /**
   * Takes the token of `identity`'s claim whose outcome is unknown, while its lease may last: it
   * is returned once, to the one claim that will carry it.
   */
  take(identity: string): string | undefined {
    const kept = this.#tokens.get(identity);
    if (kept === undefined) return undefined;
    this.#tokens.delete(identity);
    return kept.until > this.#now() ? kept.token : undefined;
  }

  /** Remembers that `identity`'s claim under `token`, with a lease of `leaseMs`, may have committed unseen. */
  remember(identity: string, token: string, leaseMs: number): void {
    this.#tokens.delete(identity);
    this.#tokens.set(identity, { token, until: this.#now() + leaseMs });
    if (this.#tokens.size > this.#maxTracked) this.#tokens.delete(this.#tokens.keys().next().value!);
  }
}
