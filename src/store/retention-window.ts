/**
 * How late a fast-path key's retention window may start, in milliseconds, for a window of
 * `retentionMs`. The fast path's claim starts the window at its transaction's start; a
 * transaction that ran longer than this since moves the window to start at its commit, its
 * length kept (`moveWindowToCommitStatement` in `sql/complete-and-commit.ts`, which holds the
 * same rule in SQL). 1% of the window, at most one second.
 */
export function windowStartToleranceMs(retentionMs: number): number {
  return Math.min(1_000, retentionMs / 100);
}

/**
 * Whether a fast-path transaction that claimed its key `elapsedMs` ago (by the caller's clock)
 * may have a late window, and so sends the statement that moves it: half the tolerance, as the
 * transaction began a little before the caller's clock started. The statement itself decides by
 * the database's clock.
 */
export function windowMayBeLate(elapsedMs: number, retentionMs: number): boolean {
  return elapsedMs >= windowStartToleranceMs(retentionMs) / 2;
}
