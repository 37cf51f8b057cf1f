import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { collectDefaultMetrics, register } from 'prom-client';
import { METRIC_PREFIX } from '../metric-registry.js';
import { exportReadiness } from './readiness-metrics.js';

/** One named health check: resolves when healthy, throws (with a reason) when not. */
export type HealthCheck = () => Promise<void> | void;

/** What `/healthz` answers. */
export interface HealthReport {
  /** `ok` when every check passed (HTTP 200), else `unhealthy` (503). */
  readonly status: 'ok' | 'unhealthy';
  /** Each check's result, by name. */
  readonly checks: Readonly<
    Record<
      string,
      {
        /** Whether the check passed within the timeout. */
        readonly ok: boolean;
        /** Why it failed (its error's message, or the timeout). @defaultValue absent when `ok` */
        readonly error?: string;
      }
    >
  >;
}

/** Options of {@link startMetricsServer}. */
export interface MetricsServerOptions {
  /** TCP port; `0` picks a free one (see {@link MetricsServer.port}). */
  readonly port: number;
  /** Address to listen on. @defaultValue all interfaces */
  readonly host?: string;
  /** Checks behind `/healthz`, by name (e.g. `postgres`, `redis`, `worker`). @defaultValue `{}` */
  readonly checks?: Readonly<Record<string, HealthCheck>>;
  /** A check slower than this counts as failed. @defaultValue `2_000` */
  readonly checkTimeoutMs?: number;
  /**
   * The `component` label of `idempotent_jobs_ready{component,check}`, which reports the
   * checks as run at each scrape.
   * @defaultValue `'process'`
   */
  readonly component?: string;
  /** Also export Node's process metrics (CPU, memory, event loop lag) with the same prefix. @defaultValue `true` */
  readonly processMetrics?: boolean;
}

/** A running metrics server. */
export interface MetricsServer {
  /** The port it listens on. */
  readonly port: number;
  /** `http://127.0.0.1:<port>`, for tests and local scraping. */
  readonly url: string;
  /** Stops listening and stops exporting the readiness gauge; resolves once the server closed. */
  close(): Promise<void>;
}

/**
 * Serves `GET /metrics` (prom-client's default registry, Prometheus text format) and
 * `GET /healthz` (200 `{"status":"ok"}` when every check passes, else 503 with each check's
 * error) over `node:http`: no framework for two routes. The checks also run at each scrape,
 * as `idempotent_jobs_ready{component,check}`.
 *
 * @example
 * ```ts
 * import { sql } from 'kysely';
 * import { startMetricsServer } from 'idempotent-jobs/process';
 *
 * const server = await startMetricsServer({
 *   port: 9464,
 *   component: 'payments-worker',
 *   checks: {
 *     postgres: async () => {
 *       await sql`select 1`.execute(db);
 *     },
 *   },
 * });
 * console.log(`${server.url}/metrics, ${server.url}/healthz`);
 * await server.close();
 * ```
 */
export async function startMetricsServer(options: MetricsServerOptions): Promise<MetricsServer> {
  if ((options.processMetrics ?? true) && !register.getSingleMetric(`${METRIC_PREFIX}process_cpu_seconds_total`)) {
    collectDefaultMetrics({ prefix: METRIC_PREFIX });
  }
  const checks = options.checks ?? {};
  const timeoutMs = options.checkTimeoutMs ?? 2_000;
  const server = createServer((request, response) => {
    handle(request, response, checks, timeoutMs).catch((error: unknown) => {
      if (!response.headersSent) response.writeHead(500, { 'content-type': 'text/plain' });
      response.end(`internal error: ${(error as Error).message}\n`);
    });
  });
  server.listen(options.port, options.host);
  await new Promise<void>((resolve, reject) => {
    server.once('listening', resolve);
    server.once('error', reject);
  });
  const port = (server.address() as AddressInfo).port;
  const stopReadiness = exportReadiness(options.component ?? 'process', () => runHealthChecks(checks, timeoutMs));
  return {
    port,
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve, reject) => {
        stopReadiness();
        server.close((error) => (error ? reject(error) : resolve()));
        server.closeAllConnections();
      }),
  };
}

/** Runs every check (in parallel, each bounded by `timeoutMs`). */
export async function runHealthChecks(checks: Readonly<Record<string, HealthCheck>>, timeoutMs: number): Promise<HealthReport> {
  const results = await Promise.all(
    Object.entries(checks).map(async ([name, check]) => {
      let timer: NodeJS.Timeout | undefined;
      try {
        await Promise.race([
          Promise.resolve().then(check),
          new Promise((_, reject) => {
            timer = setTimeout(() => reject(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
          }),
        ]);
        return [name, { ok: true }] as const;
      } catch (error) {
        return [name, { ok: false, error: error instanceof Error ? error.message : String(error) }] as const;
      } finally {
        clearTimeout(timer);
      }
    }),
  );
  const ok = results.every(([, result]) => result.ok);
  return { status: ok ? 'ok' : 'unhealthy', checks: Object.fromEntries(results) };
}

async function handle(
  request: IncomingMessage,
  response: ServerResponse,
  checks: Readonly<Record<string, HealthCheck>>,
  timeoutMs: number,
): Promise<void> {
  const path = (request.url ?? '/').split('?')[0];
  if (request.method !== 'GET' && request.method !== 'HEAD') {
    response.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain' });
    response.end('method not allowed\n');
    return;
  }
  if (path === '/metrics') {
    const body = await register.metrics();
    response.writeHead(200, { 'content-type': register.contentType });
    response.end(body);
    return;
  }
  if (path === '/healthz') {
    const report = await runHealthChecks(checks, timeoutMs);
    response.writeHead(report.status === 'ok' ? 200 : 503, { 'content-type': 'application/json' });
    response.end(JSON.stringify(report));
    return;
  }
  response.writeHead(404, { 'content-type': 'text/plain' });
  response.end('not found: try /metrics or /healthz\n');
}
