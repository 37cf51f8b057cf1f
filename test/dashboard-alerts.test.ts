// @module-tag redis
/**
 * The shipped Grafana dashboard and Prometheus alerts: their PromQL is valid (promtool), the
 * alert rules pass their promtool unit tests, every runbook link lands on a section of
 * docs/operations.md, and — after a short real run of a worker, the HTTP API and the
 * maintenance process — every metric the dashboard and the alerts read is exported.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Queue, UnrecoverableError } from 'bullmq';
import { pino } from 'pino';
import { stringify } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotentProducer, type JobContext, type WorkerEvent } from '../src/index.js';
import { loadEnvConfig, startMaintenanceProcess, startWorkerProcess, type MaintenanceProcess, type WorkerProcess } from '../src/process/index.js';
import { loadHttpEnvConfig } from '../src/runtime/http-env-config.js';
import { startHttpServerProcess, type HttpServerProcess } from '../src/runtime/http-server-process.js';
import { httpClient } from './support/http-client.js';
import {
  ALERTS_PATH,
  alertQueries,
  dashboardQueries,
  loadAlertRules,
  loadDashboard,
  metricNamesIn,
  sampleNames,
  unexportedMetrics,
  type Query,
} from './support/monitoring-queries.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { systemToolForTests } from './support/system-tools.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const PROMTOOL = systemToolForTests('promtool');
const dashboard = loadDashboard();
const rules = loadAlertRules();
const queries: Query[] = [...dashboardQueries(dashboard), ...alertQueries(rules)];

describe('metric names in PromQL', () => {
  it('finds the metrics of selectors, functions, aggregations, set operators and Grafana variables, and nothing else', () => {
    expect(metricNamesIn('histogram_quantile(0.95, sum by (step, le) (rate(idempotent_jobs_step_duration_seconds_bucket{queue=~"$queue",outcome="ran"}[$__rate_interval])))')).toEqual([
      'idempotent_jobs_step_duration_seconds_bucket',
    ]);
    expect(metricNamesIn('max by (schema) (a_gauge) > 0 unless on (schema) sum by (schema) (increase(b_total{task="janitor"}[15m])) > 0')).toEqual(['a_gauge', 'b_total']);
    expect(metricNamesIn('count(idempotent_jobs_ready == 0) or vector(0)')).toEqual(['idempotent_jobs_ready']);
    expect(metricNamesIn('sum(rate(x_total{route!~"/healthz|/readyz"}[5m] offset 1h)) * 60 / ignoring(job) group_left y_total')).toEqual(['x_total', 'y_total']);
    expect(metricNamesIn('sum(rate(a{l="{not_a_metric}"}[1m])) by (queue)')).toEqual(['a']);
    expect(() => metricNamesIn('{__name__="x"}')).toThrow(/__name__/);
  });

  it('reports a queried metric that no scrape exported, with the query that reads it', () => {
    const exported = sampleNames('# HELP a x\n# TYPE a counter\na{q="1"} 3\nh_bucket{le="+Inf"} 1\nh_sum 0.2\nh_count 1\n');
    expect([...exported]).toEqual(['a', 'h_bucket', 'h_sum', 'h_count']);
    const probe = [
      { source: 'panel "ok"', expr: 'sum(rate(a[5m]))' },
      { source: 'panel "latency"', expr: 'histogram_quantile(0.9, sum by (le) (rate(h_bucket[5m])))' },
      { source: 'alert Gone', expr: 'rate(gone_total[5m]) > 0 and on () a' },
    ];
    expect(unexportedMetrics(probe, exported)).toEqual([['alert Gone', 'gone_total']]);
  });
});

describe('the dashboard and the alerts as files', () => {
  it('the dashboard: unique panel ids, a Prometheus datasource variable on every query, and every topic of the issue covered', () => {
    const ids = dashboard.panels.map((panel) => panel.id);
    expect(new Set(ids).size).toBe(ids.length);
    expect(dashboard.templating.list.map((v) => v.name)).toEqual(['datasource', 'schema', 'queue']);
    for (const panel of dashboard.panels.filter((p) => p.type !== 'row')) {
      expect(panel.datasource?.uid, panel.title).toBe('${datasource}');
      expect(panel.targets?.length, panel.title).toBeGreaterThan(0);
      for (const target of panel.targets!) expect(metricNamesIn(target.expr!).length, `${panel.title}: ${target.expr}`).toBeGreaterThan(0);
    }
    const read = new Set(dashboardQueries(dashboard).flatMap((query) => metricNamesIn(query.expr)));
    // Claim outcomes, replays and deferrals, takeovers and fenced commits, handler and step
    // latency, keys by status, oldest processing key, janitor and sweeper, HTTP status codes.
    for (const name of [
      'idempotent_jobs_claim_outcomes_total',
      'idempotent_jobs_fenced_commits_total',
      'idempotent_jobs_handler_duration_seconds_bucket',
      'idempotent_jobs_step_duration_seconds_bucket',
      'idempotent_jobs_keys',
      'idempotent_jobs_oldest_processing_key_age_seconds',
      'idempotent_jobs_janitor_deleted_total',
      'idempotent_jobs_janitor_runs_total',
      'idempotent_jobs_sweeper_runs_total',
      'idempotent_jobs_sweeper_recoveries_total',
      'idempotent_jobs_http_requests_total',
    ]) {
      expect(read, name).toContain(name);
    }
  });

  it('the alerts: one per condition of the issue, each with a runbook link to a section of docs/operations.md', () => {
    expect(rules.map((rule) => rule.alert)).toEqual([
      'IdempotentJobsKeysStuckProcessing',
      'IdempotentJobsFencedCommits',
      'IdempotentJobsSweeperAbandoningKeys',
      'IdempotentJobsJanitorFailing',
      'IdempotentJobsJanitorNotRunning',
      'IdempotentJobsHttp5xx',
      'IdempotentJobsNotReady',
    ]);
    const anchors = headingAnchors(readFileSync('docs/operations.md', 'utf8'));
    for (const rule of rules) {
      const link = /^docs\/operations\.md#([\w-]+)$/.exec(rule.annotations?.runbook_url ?? '');
      expect(link, `${rule.alert} runbook_url`).not.toBeNull();
      expect(anchors, `${rule.alert}: no heading for #${link![1]} in docs/operations.md`).toContain(link![1]);
    }
  });

  it.skipIf(PROMTOOL === undefined)('promtool: the rules are valid, pass their unit tests, and every dashboard query parses', () => {
    const checked = promtool(['check', 'rules', ALERTS_PATH]);
    expect(checked.status, checked.output).toBe(0);
    const tested = promtool(['test', 'rules', 'deploy/prometheus/alerts.test.yml']);
    expect(tested.status, tested.output).toBe(0);
    expect(tested.output).toContain('SUCCESS');

    // Grafana's variables replaced by values Prometheus accepts, each query as a recording rule.
    const concrete = (expr: string) => expr.replaceAll('$__rate_interval', '5m').replaceAll('$queue', '.*').replaceAll('$schema', 'idempotent_jobs');
    const dir = mkdtempSync(join(tmpdir(), 'dashboard-queries-'));
    try {
      const file = join(dir, 'dashboard-queries.yml');
      const recorded = dashboardQueries(dashboard).map((query, i) => ({ record: `dashboard:query_${i}`, expr: concrete(query.expr) }));
      writeFileSync(file, stringify({ groups: [{ name: 'dashboard', rules: recorded }] }));
      const parsed = promtool(['check', 'rules', file]);
      expect(parsed.status, parsed.output).toBe(0);
      expect(parsed.output).toContain(`SUCCESS: ${recorded.length} rules found`);
      // The check itself: a broken query is refused.
      writeFileSync(file, stringify({ groups: [{ name: 'dashboard', rules: [{ record: 'dashboard:broken', expr: 'sum(rate(x[5m])' }] }] }));
      expect(promtool(['check', 'rules', file]).status).not.toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('every metric the dashboard and the alerts read is exported after a short run', () => {
  const QUEUE = 'orders';
  const silent = pino({ level: 'silent' });
  let env: TestEnv;
  let queue: Queue;
  let producer: IdempotentProducer;
  let maintenance: MaintenanceProcess | undefined;
  let worker: WorkerProcess<Order, unknown> | undefined;
  let http: HttpServerProcess | undefined;

  interface Order {
    readonly n: number;
    readonly hold?: boolean;
    readonly decline?: boolean;
  }

  beforeAll(async () => {
    env = await createTestEnv('dashboard-alerts');
    queue = new Queue(QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
    producer = new IdempotentProducer({ queue: QUEUE, connection: { url: env.redisUrl }, prefix: env.redisPrefix, schema: env.schema });
  });
  afterAll(async () => {
    await http?.stop();
    await worker?.stop();
    await maintenance?.stop();
    await producer?.close();
    await queue?.close();
    await env?.teardown();
  });

  it('a worker, the HTTP API and the maintenance process run jobs, a replay, a deferral and a failure; their scrapes cover every query', async () => {
    const common = {
      DATABASE_URL: env.databaseUrl,
      DATABASE_DIRECT_URL: env.databaseDirectUrl,
      REDIS_URL: env.redisUrl,
      REDIS_PREFIX: env.redisPrefix,
      SCHEMA: env.schema,
      QUEUE,
      MIGRATE: 'false',
      LOG_LEVEL: 'silent',
    };
    // The deployment the docs describe: workers without maintenance, one maintenance process.
    maintenance = await startMaintenanceProcess({
      config: loadEnvConfig({ ...common, METRICS_PORT: '0', JANITOR_INTERVAL_MS: '100', SWEEPER_INTERVAL_MS: '100', STATS_INTERVAL_MS: '100' }),
      handleSignals: false,
      logger: silent,
    });
    let releaseHeld!: () => void;
    const held = new Promise<void>((resolve) => (releaseHeld = resolve));
    worker = await startWorkerProcess<Order, unknown>({
      config: loadEnvConfig({ ...common, METRICS_PORT: '0', CONCURRENCY: '4', JANITOR_ENABLED: 'false', SWEEPER_ENABLED: 'false' }),
      handler: async (ctx: JobContext<Order>) => {
        if (ctx.data.decline) throw new UnrecoverableError('card declined');
        await ctx.step('reserve', { transaction: async () => ({ reserved: ctx.data.n }) });
        if (ctx.data.hold) await held;
        await ctx.step('charge', async () => ({ charged: ctx.data.n }));
        return ctx.transaction(async () => ({ done: ctx.data.n }));
      },
      handleSignals: false,
      logger: silent,
    });
    http = await startHttpServerProcess({ config: loadHttpEnvConfig({ ...common, HTTP_PORT: '0', HTTP_QUEUES: QUEUE }), handleSignals: false, logger: silent });
    const events: WorkerEvent[] = [];
    worker.worker.on('event', (event) => events.push(event));
    const seen = (kind: string, key: string) => events.some((event) => event.kind === kind && event.key === key);

    const done = [];
    for (let n = 1; n <= 2; n++) done.push(await producer.enqueue({ name: 'order', key: `order-${n}`, data: { n } }));
    const declined = await producer.enqueue({ name: 'order', key: 'declined', data: { n: 0, decline: true } });
    // A held key, and a duplicate of it from a producer with job ids of its own: deferred.
    const first = await producer.enqueue({ name: 'order', key: 'held', data: { n: 3, hold: true } });
    await waitFor('the held key to be claimed', async () => seen('claimed', 'held'));
    await queue.add('order', { idempotencyKey: 'held', payload: { n: 3, hold: true } }, { jobId: 'foreign-held' });
    await waitFor('the duplicate to be deferred', async () => seen('deferred', 'held'));
    releaseHeld();
    for (const { jobId } of [...done, first]) await waitForJobState(queue, jobId, ['completed']);
    await waitForJobState(queue, 'foreign-held', ['completed']);
    await waitForJobState(queue, declined.jobId, ['failed']);
    // A duplicate of a completed key: replayed.
    await queue.add('order', { idempotencyKey: 'order-1', payload: { n: 1 } }, { jobId: 'foreign-order-1' });
    await waitForJobState(queue, 'foreign-order-1', ['completed']);
    // Through the HTTP API: created, then replayed. The worker runs meanwhile, so the creating
    // answer is 202, or 200 when the job finished before the answer read its state.
    const client = httpClient(http.url);
    const created = await client.post(`/v1/queues/${QUEUE}/jobs?name=order`, { key: 'web-1', json: { n: 10 } });
    expect([200, 202]).toContain(created.status);
    expect(created.headers.get('idempotent-replayed')).toBeNull();
    // A replay answers with the job's current state: 202 while queued or running, 200 once done.
    expect([200, 202]).toContain((await client.post(`/v1/queues/${QUEUE}/jobs?name=order`, { key: 'web-1', json: { n: 10 } })).status);
    await waitFor('the HTTP job to complete', async () => seen('completed', 'web-1'));

    const endpoints = [worker.metricsServer!.url, http.url, maintenance.metricsServer!.url];
    const scrapeAll = async () => {
      const texts = await Promise.all(endpoints.map(async (url) => (await fetch(`${url}/metrics`)).text()));
      return { texts, exported: new Set(texts.flatMap((text) => [...sampleNames(text)])) };
    };
    // The key gauges come with the next statistics refresh (every 100 ms here).
    const { texts, exported } = await waitFor('the statistics refresh to count the finished keys', async () => {
      const scraped = await scrapeAll();
      return scraped.texts[2]!.includes(`idempotent_jobs_keys{schema="${env.schema}",status="completed"} 5`) ? scraped : undefined;
    });

    // The run did what it says (so the series below are the run's, not only zeros).
    const value = (series: string) => Number(new RegExp(`^${escape(series)} (\\S+)$`, 'm').exec(texts[0]!)?.[1]);
    const q = `queue="${QUEUE}"`;
    expect(value(`idempotent_jobs_claim_outcomes_total{${q},outcome="deferred"}`)).toBeGreaterThanOrEqual(1);
    expect(value(`idempotent_jobs_claim_outcomes_total{${q},outcome="replayed"}`)).toBeGreaterThanOrEqual(2);
    expect(value(`idempotent_jobs_job_results_total{${q},result="failed"}`)).toBe(1);
    expect(value(`idempotent_jobs_step_duration_seconds_count{${q},step="charge",outcome="ran"}`)).toBe(4);
    expect(value('idempotent_jobs_http_idempotency_outcomes_total{outcome="replayed"}')).toBe(1);
    for (const component of ['worker', 'http', 'maintenance']) {
      expect(value(`idempotent_jobs_ready{component="${component}",check="postgres"}`), component).toBe(1);
    }

    expect(unexportedMetrics(queries, exported)).toEqual([]);
    // And the check fails when one of them is not exported.
    const without = new Set(exported);
    without.delete('idempotent_jobs_step_duration_seconds_bucket');
    expect(unexportedMetrics(queries, without)).toEqual([['panel "Step latency p95" (A)', 'idempotent_jobs_step_duration_seconds_bucket']]);
  });
});

/** GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces as hyphens. */
function headingAnchors(markdown: string): string[] {
  return [...markdown.matchAll(/^#{1,6}\s+(.+)$/gm)].map((m) =>
    m[1]!
      .trim()
      .toLowerCase()
      .replace(/[^\w\- ]/g, '')
      .replace(/ /g, '-'),
  );
}

/** Runs Debian's promtool (or `PROMTOOL`), found by support/system-tools.ts. */
function promtool(args: string[]): { status: number | null; output: string } {
  const run = spawnSync(PROMTOOL!, args, { encoding: 'utf8' });
  if (run.error) throw new Error(`could not run ${PROMTOOL} (${run.error.message})`);
  return { status: run.status, output: `${run.stdout}${run.stderr}` };
}

function escape(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
