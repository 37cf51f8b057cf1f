/** A key's identity: what its row's primary key is. */
export interface KeyIdentity {
  readonly scope: string;
  readonly key: string;
}

/**
 * The order in which a statement that touches several keys locks them: by scope, then key. Every
 * batch of this library sorts by it, so two batches that share keys lock them in the same order
 * and cannot deadlock each other. It needs only to be the same everywhere, not Postgres's
 * collation: plain JavaScript string order (UTF-16 code units).
 */
export function compareLockOrder(a: KeyIdentity, b: KeyIdentity): number {
  return compareStrings(a.scope, b.scope) || compareStrings(a.key, b.key);
}

/** Plain JavaScript string order (UTF-16 code units), the order every batch sorts by. */
export function compareStrings(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
