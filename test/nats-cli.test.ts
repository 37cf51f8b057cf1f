// @module-tag nats
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, toWireJobData } from '../src/index.js';
import { operationsEnv, scrapeMetrics, seedMaintenanceKeys } from './support/consumer-operations.js';
import { createNatsTestEnv, type NatsTestEnv } from './support/nats-env.js';
import { waitFor } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const BIN = fileURLToPath(new URL('../bin/idempotent-jobs.js', import.meta.url));
const HANDLER = fileURLToPath(new URL('./support/echo-handler.mjs', import.meta.url));

let env: TestEnv;
let nats: NatsTestEnv;

beforeAll(async () => {
  env = await createTestEnv('nats_cli');
  nats = await createNatsTestEnv('nats_cli');
});
afterAll(async () => {
  await nats?.teardown();
  await env?.teardown();
});

describe('idempotent-jobs consume --broker nats', () => {
  it('consumes a stream with a handler module, creates its durable consumer and dead-letter stream, and stops on SIGTERM', async () => {
    const stream = nats.name('orders');
    await nats.jsm.streams.add({ name: stream, subjects: [`${stream}.>`] });
    const child = spawn(process.execPath, [BIN, 'consume', '--broker', 'nats', '--queue', `${stream}/payments`, '--handler', HANDLER, '--url', nats.servers], {
      env: { ...process.env, DATABASE_URL: env.databaseUrl, SCHEMA: env.schema, LOG_LEVEL: 'silent' },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr!.on('data', (chunk) => (stderr += chunk));
    try {
      await nats.js.publish(`${stream}.created`, new TextEncoder().encode(JSON.stringify(toWireJobData('cli', 'order-1', { amount: 5 }))));
      const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
      const row = await waitFor('the key completed by the CLI consumer', async () => {
        const found = await keys.get('cli', 'order-1');
        return found?.status === 'completed' ? found : undefined;
      }, 30_000);
      expect(row.result).toEqual({ echoed: { amount: 5 }, key: 'order-1', fence: 1 });
      expect((await nats.jsm.streams.info(`${stream}_DEAD_LETTERS`)).config.subjects).toEqual([`dead-letters.${stream}.payments`]);
      child.kill('SIGTERM');
      const [code] = await once(child, 'exit');
      expect(code, stderr).toBe(0);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
    }
  });

  it('serves /healthz and /metrics on METRICS_PORT and runs the janitor and key statistics, never the sweeper', async () => {
    const stream = nats.name('ops');
    await nats.jsm.streams.add({ name: stream, subjects: [`${stream}.>`] });
    await seedMaintenanceKeys(env, 'nats-ops', `nats:${stream}/payments`);
    const child = spawn(process.execPath, [BIN, 'consume', '--broker', 'nats', '--queue', `${stream}/payments`, '--handler', HANDLER, '--url', nats.servers], {
      env: { ...process.env, DATABASE_URL: env.databaseUrl, SCHEMA: env.schema, LOG_LEVEL: 'info', ...operationsEnv(env) },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr!.on('data', (chunk) => (stderr += chunk));
    const lines: Array<Record<string, unknown>> = [];
    createInterface({ input: child.stdout! }).on('line', (line) => {
      if (line.startsWith('{')) lines.push(JSON.parse(line) as Record<string, unknown>);
    });
    try {
      const ready = await waitFor('the consumer to be ready', async () => lines.find((line) => line.msg === 'nats consumer ready'), 30_000);
      const port = ready.metricsPort as number;
      expect(port).toBeGreaterThan(0);
      const health = await fetch(`http://127.0.0.1:${port}/healthz`);
      expect(health.status).toBe(200);
      expect(await health.json()).toEqual({ status: 'ok', checks: { postgres: { ok: true }, broker: { ok: true }, consumer: { ok: true } } });

      await nats.js.publish(`${stream}.created`, new TextEncoder().encode(JSON.stringify(toWireJobData('nats-ops', 'm1', { amount: 5 }))));
      const queue = `queue="${stream}/payments"`;
      const s = `schema="${env.schema}"`;
      const values = await waitFor('the message counted, the expired key deleted and the statistics refreshed', async () => {
        const scraped = await scrapeMetrics(port);
        const done =
          scraped.get(`idempotent_jobs_job_results_total{${queue},result="completed"}`) === 1 &&
          scraped.get(`idempotent_jobs_janitor_deleted_total{${s},table="keys"}`) === 1 &&
          // Statistics refreshed since: no expired key left for the janitor, only the stuck key processing.
          scraped.get(`idempotent_jobs_expired_keys{${s}}`) === 0 &&
          scraped.get(`idempotent_jobs_keys{${s},status="processing"}`) === 1;
        return done ? scraped : undefined;
      }, 30_000);
      expect(values.get(`idempotent_jobs_claim_outcomes_total{${queue},outcome="claimed"}`)).toBe(1);
      expect(values.get(`idempotent_jobs_handler_duration_seconds_count{${queue}}`)).toBe(1);
      for (const check of ['postgres', 'broker', 'consumer']) {
        expect(values.get(`idempotent_jobs_ready{component="nats-consumer",check="${check}"}`), check).toBe(1);
      }
      expect(values.get(`idempotent_jobs_janitor_runs_total{${s}}`)).toBeGreaterThan(0);
      // The stuck key: counted, and left alone (a sweeper would have abandoned it as a lost BullMQ job).
      expect(values.get(`idempotent_jobs_keys_past_sweep_horizon{${s}}`)).toBe(1);
      expect(values.get(`idempotent_jobs_sweeper_runs_total{${s}}`)).toBe(0);
      for (const task of ['janitor', 'sweeper', 'stats']) expect(values.get(`idempotent_jobs_maintenance_errors_total{${s},task="${task}"}`), task).toBe(0);
      const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
      expect(await keys.get('nats-ops', 'stuck')).toMatchObject({ status: 'processing' });
      expect(await keys.get('nats-ops', 'expired')).toBeUndefined();

      child.kill('SIGTERM');
      const [code] = await once(child, 'exit');
      expect(code, stderr).toBe(0);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  });

  it('refuses a --queue that is not <stream>/<consumer>, with usage exit code 2', async () => {
    const child = spawn(process.execPath, [BIN, 'consume', '--broker', 'nats', '--queue', 'orders', '--handler', HANDLER], {
      env: { ...process.env, DATABASE_URL: env.databaseUrl, SCHEMA: env.schema, LOG_LEVEL: 'silent' },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr!.on('data', (chunk) => (stderr += chunk));
    const [code] = await once(child, 'exit');
    expect(code).toBe(2);
    expect(stderr).toContain('<stream>/<durable consumer>');
  });
});
