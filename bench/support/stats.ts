/** Small statistics helpers for the benchmark: medians, ranges, percentiles. */

/** Median, minimum and maximum of a set of repetitions. */
export interface Spread {
  readonly median: number;
  readonly min: number;
  readonly max: number;
  readonly samples: readonly number[];
}

/** The median and min–max of `values` (empty input gives NaN). */
export function spread(values: readonly number[]): Spread {
  const sorted = [...values].sort((a, b) => a - b);
  return { median: percentile(sorted, 50), min: sorted[0] ?? NaN, max: sorted[sorted.length - 1] ?? NaN, samples: values };
}

/** The p-th percentile (nearest rank, interpolated) of ascending `sorted` values. */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const rank = (p / 100) * (sorted.length - 1);
  const low = Math.floor(rank);
  const high = Math.ceil(rank);
  return sorted[low]! + (sorted[high]! - sorted[low]!) * (rank - low);
}

/** Formats a spread as `median (min–max)` with `digits` decimals. */
export function formatSpread(s: Spread | undefined, digits = 0): string {
  if (!s || Number.isNaN(s.median)) return 'n/a';
  const f = (v: number) => v.toFixed(digits);
  return s.samples.length > 1 ? `${f(s.median)} (${f(s.min)}–${f(s.max)})` : f(s.median);
}
