import { Counter, Histogram, register, type Metric } from 'prom-client';

/** The idempotency outcomes of POSTs, as counted in `idempotent_jobs_http_idempotency_outcomes_total`. */
export type IdempotencyOutcomeLabel = 'created' | 'replayed' | 'in_progress' | 'expired' | 'key_reused';

/** The HTTP API's Prometheus metrics, on prom-client's default registry (shared with the worker metrics). */
export interface HttpMetrics {
  /** `idempotent_jobs_http_requests_total{method,route,status_code}` */
  readonly requests: Counter<'method' | 'route' | 'status_code'>;
  /** `idempotent_jobs_http_request_duration_seconds{method,route,status_code}` */
  readonly duration: Histogram<'method' | 'route' | 'status_code'>;
  /** `idempotent_jobs_http_idempotency_outcomes_total{outcome}` */
  readonly outcomes: Counter<'outcome'>;
  /** `idempotent_jobs_http_prefer_waits_total{outcome}`: `settled` or `timed_out`. */
  readonly waits: Counter<'outcome'>;
}

/**
 * The metrics, registered once per process: several servers in one process (tests) share
 * them, since the default registry refuses a second metric of the same name.
 */
export function httpMetrics(): HttpMetrics {
  const metrics = createHttpMetrics();
  // Every outcome's series exists from the start, so that a rate or increase() sees the first one.
  for (const outcome of IDEMPOTENCY_OUTCOMES) metrics.outcomes.inc({ outcome }, 0);
  for (const outcome of ['settled', 'timed_out']) metrics.waits.inc({ outcome }, 0);
  return metrics;
}

const IDEMPOTENCY_OUTCOMES: readonly IdempotencyOutcomeLabel[] = ['created', 'replayed', 'in_progress', 'expired', 'key_reused'];

function createHttpMetrics(): HttpMetrics {
  return {
    requests: existing('idempotent_jobs_http_requests_total') ??
      new Counter({ name: 'idempotent_jobs_http_requests_total', help: 'HTTP requests answered, by route template and status.', labelNames: ['method', 'route', 'status_code'] }),
    duration: existing('idempotent_jobs_http_request_duration_seconds') ??
      new Histogram({
        name: 'idempotent_jobs_http_request_duration_seconds',
        help: 'Time to answer an HTTP request, including Prefer: wait.',
        labelNames: ['method', 'route', 'status_code'],
        buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
      }),
    outcomes: existing('idempotent_jobs_http_idempotency_outcomes_total') ??
      new Counter({ name: 'idempotent_jobs_http_idempotency_outcomes_total', help: 'POSTs by idempotency outcome: created, replayed, in_progress (409), expired (410: accepted before, record expired), key_reused (422).', labelNames: ['outcome'] }),
    waits: existing('idempotent_jobs_http_prefer_waits_total') ??
      new Counter({ name: 'idempotent_jobs_http_prefer_waits_total', help: 'Prefer: wait requests by outcome: settled within the wait, or timed_out (answered 202).', labelNames: ['outcome'] }),
  };
}

/** The default registry's exposition, and its content type. */
export async function metricsExposition(): Promise<{ contentType: string; body: string }> {
  return { contentType: register.contentType, body: await register.metrics() };
}

function existing<T extends Metric<string>>(name: string): T | undefined {
  return register.getSingleMetric(name) as T | undefined;
}
