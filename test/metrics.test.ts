// @module-tag redis
/**
 * Metrics and health of a worker process: an in-process worker (startWorkerProcess, as the
 * runnable worker builds it) runs a few jobs, then /metrics and /healthz are scraped over HTTP.
 */
import { EventEmitter } from 'node:events';
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, IdempotentProducer, OutboxRelay, createIdempotentWorker, type JobContext, type WorkerEvent } from '../src/index.js';
import { Maintenance, instrumentMaintenance, instrumentWorker, loadEnvConfig, runHealthChecks, startMetricsServer, startWorkerProcess, type MaintenanceEvents, type WorkerProcess } from '../src/process/index.js';
import { MAX_STEP_NAMES } from '../src/metrics/worker-metrics.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const QUEUE = 'metered';
const silent = pino({ level: 'silent' });
let env: TestEnv;
let queue: Queue;
let producer: IdempotentProducer;
let worker: WorkerProcess<{ n: number }, unknown> | undefined;

beforeAll(async () => {
  env = await createTestEnv('metrics');
  queue = new Queue(QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  producer = new IdempotentProducer({ queue: QUEUE, connection: { url: env.redisUrl }, prefix: env.redisPrefix, schema: env.schema });
});
afterAll(async () => {
  await worker?.stop();
  await producer?.close();
  await queue?.close();
  await env?.teardown();
});

/** Parses Prometheus text into `name{labels}` → value. */
function samples(text: string): Map<string, number> {
  const map = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    map.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return map;
}

async function scrape(url: string): Promise<{ text: string; values: Map<string, number> }> {
  const response = await fetch(`${url}/metrics`);
  expect(response.status).toBe(200);
  expect(response.headers.get('content-type')).toContain('text/plain');
  const text = await response.text();
  return { text, values: samples(text) };
}

describe('worker metrics and health', () => {
  it('exposes claim outcomes, results, durations, maintenance and key gauges on /metrics, and /healthz', async () => {
    // An expired key for the janitor to delete, so its counter moves.
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
    const old = await keys.claim('default', 'expired-1', keys.fingerprint({}));
    if (old.kind !== 'claimed') throw new Error(old.kind);
    await keys.runEffect(old, async () => null);
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set expires_at = now() - interval '1 minute'
               where key = 'expired-1'`.execute(env.db);

    worker = await startWorkerProcess({
      config: loadEnvConfig({
        DATABASE_URL: env.databaseUrl,
        REDIS_URL: env.redisUrl,
        REDIS_PREFIX: env.redisPrefix,
        SCHEMA: env.schema,
        QUEUE,
        MIGRATE: 'false',
        CONCURRENCY: '2',
        LEASE_MS: '3000',
        HEARTBEAT_MS: '20',
        METRICS_PORT: '0',
        JANITOR_INTERVAL_MS: '100',
        SWEEPER_INTERVAL_MS: '100',
        STATS_INTERVAL_MS: '100',
        LOG_LEVEL: 'silent',
      }),
      handler: async (ctx: JobContext<{ n: number }>) => {
        // Long enough for a few lease heartbeats (every 20 ms).
        await new Promise((resolve) => setTimeout(resolve, 120));
        return { n: ctx.data.n };
      },
      handleSignals: false,
      logger: silent,
    });
    const server = worker.metricsServer!;
    expect(server.port).toBeGreaterThan(0);

    const added = [];
    for (let n = 1; n <= 3; n++) added.push(await producer.enqueue({ name: 'work', key: `k${n}`, data: { n } }));
    for (const { jobId } of added) await waitForJobState(queue, jobId, ['completed']);
    // A duplicate of k1 under another job id replays the stored result.
    await queue.add('work', { idempotencyKey: 'k1', payload: { n: 1 } }, { jobId: 'dup-k1' });
    await waitForJobState(queue, 'dup-k1', ['completed']);
    // Same key, other payload: refused as reused.
    await queue.add('work', { idempotencyKey: 'k2', payload: { n: 99 } }, { jobId: 'reuse-k2' });
    await waitForJobState(queue, 'reuse-k2', ['failed']);

    const { text, values } = await waitFor('the janitor and the stats refresh to have run', async () => {
      const scraped = await scrape(server.url);
      const v = scraped.values;
      const ready =
        v.get(`idempotent_jobs_janitor_deleted_total{schema="${env.schema}",table="keys"}`) === 1 &&
        v.get(`idempotent_jobs_keys{schema="${env.schema}",status="completed"}`) === 3;
      return ready ? scraped : undefined;
    });

    const q = `queue="${QUEUE}"`;
    expect(values.get(`idempotent_jobs_claim_outcomes_total{${q},outcome="claimed"}`)).toBe(3);
    expect(values.get(`idempotent_jobs_claim_outcomes_total{${q},outcome="replayed"}`)).toBe(1);
    expect(values.get(`idempotent_jobs_claim_outcomes_total{${q},outcome="key-reused"}`)).toBe(1);
    expect(values.get(`idempotent_jobs_claim_outcomes_total{${q},outcome="taken-over"}`)).toBe(0);
    expect(values.get(`idempotent_jobs_claim_outcomes_total{${q},outcome="deferred"}`)).toBe(0);
    // Present from the start. (Not asserted 0: a heartbeat in flight when a job completes can
    // report its key as no longer held.)
    expect(values.get(`idempotent_jobs_claim_outcomes_total{${q},outcome="lease-lost"}`)).toBeGreaterThanOrEqual(0);
    expect(values.get(`idempotent_jobs_job_results_total{${q},result="completed"}`)).toBe(3);
    expect(values.get(`idempotent_jobs_fenced_commits_total{${q}}`)).toBe(0);
    expect(values.get(`idempotent_jobs_lease_extensions_total{${q}}`)).toBeGreaterThan(0);
    expect(values.get(`idempotent_jobs_handler_duration_seconds_count{${q}}`)).toBe(3);
    expect(values.get(`idempotent_jobs_handler_duration_seconds_sum{${q}}`)).toBeGreaterThan(0.3);
    const s = `schema="${env.schema}"`;
    expect(values.get(`idempotent_jobs_janitor_runs_total{${s}}`)).toBeGreaterThan(0);
    expect(values.get(`idempotent_jobs_sweeper_runs_total{${s}}`)).toBeGreaterThan(0);
    expect(values.get(`idempotent_jobs_keys{${s},status="processing"}`)).toBe(0);
    expect(values.get(`idempotent_jobs_keys{${s},status="failed"}`)).toBe(0);
    expect(values.get(`idempotent_jobs_expired_leases{${s}}`)).toBe(0);
    expect(values.get(`idempotent_jobs_oldest_processing_key_age_seconds{${s}}`)).toBe(0);
    expect(values.get(`idempotent_jobs_outbox_unsent_rows{${s}}`)).toBe(0);
    expect(values.get(`idempotent_jobs_keys_past_sweep_horizon{${s}}`)).toBe(0);
    // Zero from the start, so an alert's increase() sees the first error or abandoned key.
    for (const task of ['janitor', 'sweeper', 'stats']) expect(values.get(`idempotent_jobs_maintenance_errors_total{${s},task="${task}"}`)).toBe(0);
    for (const action of ['reenqueued', 'abandoned']) {
      expect(values.get(`idempotent_jobs_sweeper_recoveries_total{${s},${q},action="${action}"}`)).toBe(0);
    }
    // The /healthz checks, run at the scrape.
    for (const check of ['postgres', 'postgres-writes', 'redis', 'worker']) expect(values.get(`idempotent_jobs_ready{component="worker",check="${check}"}`)).toBe(1);
    for (const name of [
      'idempotent_jobs_sweeper_recoveries_total',
      'idempotent_jobs_sweeper_unverifiable_keys',
      'idempotent_jobs_maintenance_errors_total',
      'idempotent_jobs_expired_keys',
      'idempotent_jobs_outbox_oldest_unsent_age_seconds',
      'idempotent_jobs_process_cpu_seconds_total',
    ]) {
      expect(text).toContain(`# TYPE ${name} `);
    }

    const health = await fetch(`${server.url}/healthz`);
    expect(health.status).toBe(200);
    expect(await health.json()).toEqual({
      status: 'ok',
      checks: { postgres: { ok: true }, 'postgres-writes': { ok: true }, redis: { ok: true }, worker: { ok: true } },
    });
    expect((await fetch(`${server.url}/nope`)).status).toBe(404);
  });

  it('counts relayed outbox rows', async () => {
    const relay = new OutboxRelay({ db: env.db, schema: env.schema, connection: { url: env.redisUrl }, prefix: env.redisPrefix, logger: silent });
    try {
      await env.db.transaction().execute((tx) => producer.enqueueBulk([1, 2].map((n) => ({ name: 'work', key: `o${n}`, data: { n } })), { tx }));
      expect(await relay.relayOnce()).toBe(2);
    } finally {
      await relay.stop();
    }
    const { values } = await scrape(worker!.metricsServer!.url);
    expect(values.get(`idempotent_jobs_outbox_relayed_total{schema="${env.schema}"}`)).toBe(2);
  });

  it('answers /healthz with 503 and the failing check when a dependency is down', async () => {
    const server = await startMetricsServer({
      port: 0,
      checks: { postgres: async () => {}, redis: () => Promise.reject(new Error('ECONNREFUSED')), slow: () => new Promise(() => {}) },
      checkTimeoutMs: 50,
      processMetrics: false,
    });
    try {
      const { values } = await scrape(server.url);
      expect(values.get('idempotent_jobs_ready{component="process",check="postgres"}')).toBe(1);
      expect(values.get('idempotent_jobs_ready{component="process",check="redis"}')).toBe(0);
      expect(values.get('idempotent_jobs_ready{component="process",check="slow"}')).toBe(0);
      const response = await fetch(`${server.url}/healthz`);
      expect(response.status).toBe(503);
      expect(await response.json()).toEqual({
        status: 'unhealthy',
        checks: { postgres: { ok: true }, redis: { ok: false, error: 'ECONNREFUSED' }, slow: { ok: false, error: 'no answer within 50 ms' } },
      });
    } finally {
      await server.close();
    }
    // A closed server's checks leave the gauge with it.
    const { values } = await scrape(worker!.metricsServer!.url);
    expect([...values.keys()].filter((name) => name.startsWith('idempotent_jobs_ready{component="process"'))).toEqual([]);
    expect(await runHealthChecks({}, 10)).toEqual({ status: 'ok', checks: {} });
  });

  it('turns /healthz to 503 once the worker is stopping, then closes the server', async () => {
    const running = worker!;
    const url = running.metricsServer!.url;
    await running.worker.bullWorker.close();
    const response = await fetch(`${url}/healthz`);
    expect(response.status).toBe(503);
    expect(((await response.json()) as { checks: Record<string, unknown> }).checks.worker).toEqual({ ok: false, error: 'the worker is not running (closing or closed)' });
    await running.stop();
    worker = undefined;
    await expect(fetch(`${url}/healthz`)).rejects.toThrow();
  });
});

describe('maintenance metrics', () => {
  it('count sweeper recoveries by queue and action, and drop the key gauges when another process refreshes them', async () => {
    const maintenance = new EventEmitter<MaintenanceEvents>();
    const stop = instrumentMaintenance(maintenance, 'other_schema');
    const server = await startMetricsServer({ port: 0, processMetrics: false });
    const s = 'schema="other_schema"';
    const stats = {
      processing: 4,
      completed: 10,
      failed: 2,
      expiredLeases: 1,
      pastSweepHorizon: 2,
      expiredKeys: 3,
      tombstones: 11,
      oldestProcessing: { scope: 'a', key: 'b', createdAt: new Date(), ageMs: 90_000 },
      outboxUnsent: 5,
      oldestUnsentAgeMs: 2_500,
    };
    try {
      maintenance.emit('sweeper', {
        examined: 3,
        alive: 0,
        unverifiable: 1,
        changed: 0,
        more: false,
        recoveries: [
          { scope: 'a', key: 'k1', fence: 1, queue: 'payments', jobId: 'j1', action: 'reenqueued', jobWas: 'missing' },
          { scope: 'a', key: 'k2', fence: 3, queue: 'payments', jobId: 'j2', action: 'abandoned', jobWas: 'finished' },
        ],
      });
      maintenance.emit('janitor', { keysDeleted: 7, tombstonesDeleted: 6, outboxRowsDeleted: 2, concurrencyRecordsDeleted: 0, concurrencySlotsDeleted: 0, coalescingKeysDeleted: 3, coalescingArrivalsDeleted: 4, more: false });
      maintenance.emit('stats', stats);
      maintenance.emit('error', 'sweeper', new Error('redis down'));
      let { values } = await scrape(server.url);
      expect(values.get(`idempotent_jobs_sweeper_recoveries_total{${s},queue="payments",action="reenqueued"}`)).toBe(1);
      expect(values.get(`idempotent_jobs_sweeper_recoveries_total{${s},queue="payments",action="abandoned"}`)).toBe(1);
      expect(values.get(`idempotent_jobs_sweeper_unverifiable_keys{${s}}`)).toBe(1);
      expect(values.get(`idempotent_jobs_janitor_deleted_total{${s},table="keys"}`)).toBe(7);
      expect(values.get(`idempotent_jobs_janitor_deleted_total{${s},table="outbox"}`)).toBe(2);
      expect(values.get(`idempotent_jobs_janitor_deleted_total{${s},table="tombstones"}`)).toBe(6);
      expect(values.get(`idempotent_jobs_janitor_deleted_total{${s},table="coalescing_keys"}`)).toBe(3);
      expect(values.get(`idempotent_jobs_janitor_deleted_total{${s},table="coalescing_arrivals"}`)).toBe(4);
      expect(values.get(`idempotent_jobs_key_tombstones{${s}}`)).toBe(11);
      expect(values.get(`idempotent_jobs_maintenance_errors_total{${s},task="sweeper"}`)).toBe(1);
      expect(values.get(`idempotent_jobs_keys{${s},status="processing"}`)).toBe(4);
      expect(values.get(`idempotent_jobs_oldest_processing_key_age_seconds{${s}}`)).toBe(90);
      expect(values.get(`idempotent_jobs_keys_past_sweep_horizon{${s}}`)).toBe(2);
      expect(values.get(`idempotent_jobs_outbox_oldest_unsent_age_seconds{${s}}`)).toBe(2.5);

      maintenance.emit('stats', null);
      ({ values } = await scrape(server.url));
      for (const [name] of values) {
        if (name.includes(s) && /idempotent_jobs_(keys|key_tombstones|expired_leases|expired_keys|oldest_processing|outbox_unsent|outbox_oldest)[{_]/.test(name)) {
          throw new Error(`${name} should have been dropped`);
        }
      }
      expect(values.get(`idempotent_jobs_janitor_deleted_total{${s},table="keys"}`)).toBe(7);
    } finally {
      stop();
      await server.close();
    }
  });

  it('count processing keys past the sweep horizon that Maintenance is given (keys_past_sweep_horizon)', async () => {
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
    const server = await startMetricsServer({ port: 0, processMetrics: false });
    const horizonOf = async (sweepAfterMs: number) => {
      const maintenance = new Maintenance({ db: env.db, schema: env.schema, sweepAfterMs, logger: silent });
      const seen: number[] = [];
      const stop = instrumentMaintenance(maintenance, env.schema);
      maintenance.on('stats', (stats) => seen.push(stats!.pastSweepHorizon));
      try {
        const run = await maintenance.refreshStats();
        expect(run.ran).toBe(true);
        const { values } = await scrape(server.url);
        expect(values.get(`idempotent_jobs_keys_past_sweep_horizon{schema="${env.schema}"}`)).toBe(seen[0]);
        return seen[0]!;
      } finally {
        stop();
      }
    };
    try {
      const before = await horizonOf(5_000);
      const claim = await keys.claim('default', 'lease-ended-10s-ago', keys.fingerprint({}));
      if (claim.kind !== 'claimed') throw new Error(claim.kind);
      await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '10 seconds'
                 where key = 'lease-ended-10s-ago'`.execute(env.db);
      expect(await horizonOf(5_000)).toBe(before + 1);
      expect(await horizonOf(60_000)).toBe(before);
    } finally {
      await server.close();
    }
  });
});

describe('step metrics', () => {
  it('count ctx.step calls by step name and outcome (ran, replayed, failed, lease-lost) from the worker\'s step events', async () => {
    const STEPPED = 'stepped';
    const stepped = new Queue(STEPPED, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 60_000 });
    const events: WorkerEvent[] = [];
    const stepWorker = createIdempotentWorker<Record<string, never>>({
      queue: STEPPED,
      connection: { url: env.redisUrl },
      prefix: env.redisPrefix,
      keys,
      concurrency: 2,
      logger: silent,
      handler: async (ctx) => {
        await ctx.step('reserve', { transaction: async () => ({ held: true }) });
        await ctx.step('charge', async () => {
          if (ctx.key === 'flaky' && ctx.attempt === 1) throw new Error('provider timeout');
          // Another worker takes the key over while the charge is in flight: its record is refused.
          if (ctx.key === 'lost') {
            await sql`update ${sql.id(env.schema, 'idempotency_keys')} set fence = fence + 1
                       where scope = ${ctx.scope} and key = ${ctx.key}`.execute(env.db);
          }
          return { charged: true };
        });
        return ctx.transaction(async () => ({ done: true }));
      },
    });
    stepWorker.on('event', (event) => events.push(event));
    const stop = instrumentWorker(stepWorker, STEPPED);
    const server = await startMetricsServer({ port: 0, processMetrics: false });
    const add = (key: string, jobId: string, opts: Record<string, unknown> = {}) =>
      stepped.add('order', { idempotencyKey: key, payload: {} }, { jobId, ...opts });
    try {
      await add('ok', 'ok-1');
      await add('flaky', 'flaky-1', { attempts: 2 });
      await add('lost', 'lost-1');
      await waitForJobState(stepped, 'ok-1', ['completed']);
      await waitForJobState(stepped, 'flaky-1', ['completed']);
      await waitFor('the lost lease to be reported', async () => events.some((e) => e.kind === 'step-lease-lost'));
      // A duplicate of a completed key replays its result and runs no step.
      await add('ok', 'ok-2');
      await waitForJobState(stepped, 'ok-2', ['completed']);

      const stepsOf = (key: string) => events.filter((e) => e.key === key && e.kind.startsWith('step-')).map((e) => [e.kind, e.step, e.position, e.fence]);
      expect(stepsOf('flaky')).toEqual([
        ['step-ran', 'reserve', 1, 1],
        ['step-failed', 'charge', 2, 1],
        ['step-replayed', 'reserve', 1, 2],
        ['step-ran', 'charge', 2, 2],
      ]);
      expect(stepsOf('ok')).toEqual([
        ['step-ran', 'reserve', 1, 1],
        ['step-ran', 'charge', 2, 1],
      ]);
      expect(stepsOf('lost')).toEqual([
        ['step-ran', 'reserve', 1, 1],
        ['step-lease-lost', 'charge', 2, 1],
      ]);

      const { values } = await scrape(server.url);
      const m = (step: string, outcome: string) => values.get(`idempotent_jobs_step_outcomes_total{queue="${STEPPED}",step="${step}",outcome="${outcome}"}`);
      expect(m('reserve', 'ran')).toBe(3);
      expect(m('reserve', 'replayed')).toBe(1);
      expect(m('charge', 'ran')).toBe(2);
      expect(m('charge', 'failed')).toBe(1);
      expect(m('charge', 'lease-lost')).toBe(1);
      expect(m('reserve', 'failed')).toBeUndefined();
      // Each call's time, under the same labels.
      const d = (step: string, outcome: string, part: string) =>
        values.get(`idempotent_jobs_step_duration_seconds_${part}{queue="${STEPPED}",step="${step}",outcome="${outcome}"}`);
      expect(d('reserve', 'ran', 'count')).toBe(3);
      expect(d('reserve', 'replayed', 'count')).toBe(1);
      expect(d('charge', 'failed', 'count')).toBe(1);
      expect(d('charge', 'lease-lost', 'count')).toBe(1);
      expect(d('charge', 'ran', 'sum')).toBeGreaterThan(0);
    } finally {
      stop();
      await stepWorker.close({ force: true });
      await stepped.close();
      await server.close();
    }
  });

  it(`give at most ${MAX_STEP_NAMES} step names a label of their own per worker; later names count as step="other"`, async () => {
    const worker = new EventEmitter<{ event: [WorkerEvent] }>();
    const stop = instrumentWorker(worker, 'capped');
    const server = await startMetricsServer({ port: 0, processMetrics: false });
    try {
      for (let i = 0; i < MAX_STEP_NAMES + 5; i++) worker.emit('event', { kind: 'step-ran', step: `charge-${i}`, position: 1 });
      worker.emit('event', { kind: 'step-replayed', step: 'charge-0', position: 1 });
      const { values } = await scrape(server.url);
      const series = [...values.keys()].filter((name) => name.startsWith('idempotent_jobs_step_outcomes_total{queue="capped"'));
      expect(series).toHaveLength(MAX_STEP_NAMES + 2);
      expect(values.get('idempotent_jobs_step_outcomes_total{queue="capped",step="other",outcome="ran"}')).toBe(5);
      expect(values.get('idempotent_jobs_step_outcomes_total{queue="capped",step="charge-0",outcome="ran"}')).toBe(1);
      expect(values.get('idempotent_jobs_step_outcomes_total{queue="capped",step="charge-0",outcome="replayed"}')).toBe(1);
    } finally {
      stop();
      await server.close();
    }
  });
});
