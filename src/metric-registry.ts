import { Counter, Gauge, Histogram, register } from 'prom-client';

/** Prefix of every metric this library registers. */
export const METRIC_PREFIX = 'idempotent_jobs_';

/**
 * Get-or-create helpers over prom-client's default registry. Several workers (or a worker and
 * a relay) in one process share one metric per name, told apart by labels; registering a name
 * twice would throw, so each helper returns the metric already registered under the name.
 */
export function counter<L extends string>(name: string, help: string, labelNames: readonly L[] = []): Counter<L> {
  const existing = register.getSingleMetric(METRIC_PREFIX + name);
  if (existing) return existing as Counter<L>;
  return new Counter({ name: METRIC_PREFIX + name, help, labelNames });
}

/** See {@link counter}. */
export function gauge<L extends string>(name: string, help: string, labelNames: readonly L[] = []): Gauge<L> {
  const existing = register.getSingleMetric(METRIC_PREFIX + name);
  if (existing) return existing as Gauge<L>;
  return new Gauge({ name: METRIC_PREFIX + name, help, labelNames });
}

/** See {@link counter}. */
export function histogram<L extends string>(
  name: string,
  help: string,
  labelNames: readonly L[],
  buckets: number[],
): Histogram<L> {
  const existing = register.getSingleMetric(METRIC_PREFIX + name);
  if (existing) return existing as Histogram<L>;
  return new Histogram({ name: METRIC_PREFIX + name, help, labelNames, buckets });
}
