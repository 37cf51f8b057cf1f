import { Gauge, register } from 'prom-client';
import { METRIC_PREFIX } from '../metric-registry.js';

/** What a readiness probe answers: each named check, passed or not (as `/healthz` and `/readyz` report them). */
export interface ReadinessReport {
  readonly checks: Readonly<Record<string, { readonly ok: boolean }>>;
}

/** A process part whose checks the readiness gauge runs at each scrape. */
interface ReadinessSource {
  readonly component: string;
  readonly probe: () => Promise<ReadinessReport>;
}

const READY_METRIC = `${METRIC_PREFIX}ready`;
const sources = new Set<ReadinessSource>();

/**
 * Exports `idempotent_jobs_ready{component,check}`: 1 when the check passed, 0 when it failed,
 * measured when Prometheus scrapes (the probe runs then, so the value is never older than the
 * scrape, and a process that cannot answer the scrape shows as `up == 0` instead). The checks
 * are those of `/healthz` (worker, broker consumers, maintenance) and `/readyz` (HTTP API). Several sources of
 * one component in a process (tests) report the worst of them. Returns a function that stops
 * exporting the source.
 */
export function exportReadiness(component: string, probe: () => Promise<ReadinessReport>): () => void {
  readinessGauge();
  const source: ReadinessSource = { component, probe };
  sources.add(source);
  return () => {
    sources.delete(source);
  };
}

/** The gauge, registered once per process; its value is computed at each collection. */
function readinessGauge(): Gauge<'component' | 'check'> {
  const existing = register.getSingleMetric(READY_METRIC);
  if (existing) return existing as Gauge<'component' | 'check'>;
  return new Gauge({
    name: READY_METRIC,
    help: 'Readiness checks at scrape time, by component (worker, amqp-consumer, nats-consumer, http, maintenance) and check (postgres, redis, worker; broker, consumer): 1 passed, 0 failed.',
    labelNames: ['component', 'check'],
    async collect() {
      const reports = await Promise.all([...sources].map(async (source) => ({ component: source.component, report: await source.probe() })));
      const worst = new Map<string, { component: string; check: string; ok: boolean }>();
      for (const { component, report } of reports) {
        for (const [check, result] of Object.entries(report.checks)) {
          const id = JSON.stringify([component, check]);
          const seen = worst.get(id);
          worst.set(id, { component, check, ok: result.ok && (seen?.ok ?? true) });
        }
      }
      // A source that stopped (closed server) takes its series with it.
      this.reset();
      for (const { component, check, ok } of worst.values()) this.set({ component, check }, ok ? 1 : 0);
    },
  });
}
