/**
 * How late a fast-path key's retention window may start, in milliseconds, for a window of
 * `retentionMs`. The fast path's claim starts the window at its transaction's start; a
 * transaction that ran longer than this since moves the window to start at its commit, its
 * length kept (`store_fast_path_result`, in `sql/complete-and-commit.ts`, which holds the same
 * rule in SQL). 1% of the window, at most one second.
 */
export function windowStartToleranceMs(retentionMs: number): number {
  return Math.min(1_000, retentionMs / 100);
}
