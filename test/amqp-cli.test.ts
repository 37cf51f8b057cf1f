// @module-tag rabbitmq
/** `idempotent-jobs consume --broker amqp`: a user's handler module on a RabbitMQ queue, as a process. */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startAmqpConsumerProcess } from '../src/amqp/index.js';
import { IdempotencyKeys } from '../src/index.js';
import { loadEnvConfig } from '../src/process/index.js';
import { freePort } from './chaos/private-redis.js';
import { createAmqpTestEnv, type AmqpTestEnv, AMQP_URL } from './support/amqp-test-env.js';
import { operationsEnv, scrapeMetrics, seedMaintenanceKeys } from './support/consumer-operations.js';
import { waitFor } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let amqp: AmqpTestEnv;

beforeAll(async () => {
  env = await createTestEnv('amqp_cli');
  amqp = await createAmqpTestEnv('amqp-cli');
});
afterAll(async () => {
  await amqp?.teardown();
  await env?.teardown();
});

function runCli(args: string[], extraEnv: Record<string, string> = {}) {
  const child = spawn(process.execPath, ['bin/idempotent-jobs.js', ...args], {
    env: { ...process.env, DATABASE_URL: env.databaseUrl, SCHEMA: env.schema, AMQP_URL, LOG_LEVEL: 'info', ...extraEnv },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr!.on('data', (c) => (stderr += c));
  // The process's log lines (pino's JSON on stdout), as they come.
  const lines: Array<Record<string, unknown>> = [];
  createInterface({ input: child.stdout! }).on('line', (line) => {
    if (line.startsWith('{')) lines.push(JSON.parse(line) as Record<string, unknown>);
  });
  const exited = once(child, 'exit').then(([code]) => ({ code: code as number, stderr }));
  return { child, exited, lines };
}

describe('idempotent-jobs consume --broker amqp', () => {
  it("runs a user's handler module on a queue, keys from a header, and shuts down on SIGTERM", async () => {
    const queue = amqp.queueName('cli');
    const { child, exited } = runCli(['consume', '--broker', 'amqp', '--queue', queue, '--handler', 'test/support/echo-handler.mjs', '--key-from', 'header', '--scope', 'cli']);
    await new Promise<void>((resolve, reject) => {
      createInterface({ input: child.stdout! }).on('line', (line) => line.includes('amqp consumer ready') && resolve());
      child.once('exit', (code) => reject(new Error(`consumer exited early with ${code}`)));
    });
    amqp.publish(queue, { hello: 'world' }, { headers: { 'Idempotency-Key': 'c1' } });
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
    const deadline = Date.now() + 20_000;
    let record = await keys.get('cli', 'c1');
    while (record?.status !== 'completed' && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      record = await keys.get('cli', 'c1');
    }
    expect(record).toMatchObject({ status: 'completed', result: { echoed: { hello: 'world' }, key: 'c1', fence: 1 } });
    child.kill('SIGTERM');
    expect((await exited).code).toBe(0);
  });

  it('serves /healthz and /metrics on METRICS_PORT and runs the janitor and key statistics, never the sweeper', async () => {
    const queue = amqp.queueName('ops');
    await seedMaintenanceKeys(env, 'amqp-ops', queue);
    const { child, exited, lines } = runCli(
      ['consume', '--broker', 'amqp', '--queue', queue, '--handler', 'test/support/echo-handler.mjs', '--key-from', 'header', '--scope', 'amqp-ops'],
      operationsEnv(env),
    );
    try {
      const ready = await waitFor('the consumer to be ready', async () => lines.find((line) => line.msg === 'amqp consumer ready'), 30_000);
      const port = ready.metricsPort as number;
      expect(port).toBeGreaterThan(0);
      const health = await fetch(`http://127.0.0.1:${port}/healthz`);
      expect(health.status).toBe(200);
      expect(await health.json()).toEqual({ status: 'ok', checks: { postgres: { ok: true }, broker: { ok: true }, consumer: { ok: true } } });

      amqp.publish(queue, { n: 1 }, { headers: { 'Idempotency-Key': 'm1' } });
      const s = `schema="${env.schema}"`;
      const values = await waitFor('the message counted, the expired key deleted and the statistics refreshed', async () => {
        const scraped = await scrapeMetrics(port);
        const done =
          scraped.get(`idempotent_jobs_job_results_total{queue="${queue}",result="completed"}`) === 1 &&
          scraped.get(`idempotent_jobs_janitor_deleted_total{${s},table="keys"}`) === 1 &&
          // Statistics refreshed since: no expired key left for the janitor, only the stuck key processing.
          scraped.get(`idempotent_jobs_expired_keys{${s}}`) === 0 &&
          scraped.get(`idempotent_jobs_keys{${s},status="processing"}`) === 1;
        return done ? scraped : undefined;
      });
      expect(values.get(`idempotent_jobs_claim_outcomes_total{queue="${queue}",outcome="claimed"}`)).toBe(1);
      expect(values.get(`idempotent_jobs_handler_duration_seconds_count{queue="${queue}"}`)).toBe(1);
      for (const check of ['postgres', 'broker', 'consumer']) {
        expect(values.get(`idempotent_jobs_ready{component="amqp-consumer",check="${check}"}`), check).toBe(1);
      }
      expect(values.get(`idempotent_jobs_janitor_runs_total{${s}}`)).toBeGreaterThan(0);
      // The stuck key: counted, and left alone (a sweeper would have abandoned it as a lost BullMQ job).
      expect(values.get(`idempotent_jobs_keys_past_sweep_horizon{${s}}`)).toBe(1);
      expect(values.get(`idempotent_jobs_sweeper_runs_total{${s}}`)).toBe(0);
      for (const task of ['janitor', 'sweeper', 'stats']) expect(values.get(`idempotent_jobs_maintenance_errors_total{${s},task="${task}"}`), task).toBe(0);
      const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
      expect(await keys.get('amqp-ops', 'stuck')).toMatchObject({ status: 'processing' });
      expect(await keys.get('amqp-ops', 'expired')).toBeUndefined();

      child.kill('SIGTERM');
      expect((await exited).code).toBe(0);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  });

  it('answers /healthz with 503 and the broker check failing while RabbitMQ is unreachable', async () => {
    const [metricsPort, closedPort] = [await freePort(), await freePort()];
    const { child } = runCli(['consume', '--broker', 'amqp', '--queue', amqp.queueName('unreachable'), '--handler', 'test/support/echo-handler.mjs'], {
      ...operationsEnv(env),
      METRICS_PORT: String(metricsPort),
      AMQP_URL: `amqp://guest:guest@127.0.0.1:${closedPort}`,
    });
    try {
      const health = await waitFor('/healthz to answer', () => fetch(`http://127.0.0.1:${metricsPort}/healthz`).catch(() => undefined), 30_000);
      expect(health.status).toBe(503);
      const report = (await health.json()) as { checks: Record<string, { ok: boolean }> };
      expect(report.checks).toMatchObject({ postgres: { ok: true }, broker: { ok: false }, consumer: { ok: true } });
    } finally {
      child.kill('SIGKILL');
      await once(child, 'exit');
    }
  });

  it('turns /healthz to 503 with the consumer check failing once the consumer closes, then closes the server', async () => {
    const started = await startAmqpConsumerProcess({
      config: loadEnvConfig({ DATABASE_URL: env.databaseUrl, SCHEMA: env.schema, ...operationsEnv(env), LOG_LEVEL: 'silent' }),
      handler: async (ctx) => ctx.data,
      url: AMQP_URL,
      queue: amqp.queueName('closing'),
      handleSignals: false,
    });
    try {
      const url = started.metricsServer!.url;
      expect((await fetch(`${url}/healthz`)).status).toBe(200);
      await started.consumer.close();
      const health = await fetch(`${url}/healthz`);
      expect(health.status).toBe(503);
      expect(((await health.json()) as { checks: Record<string, unknown> }).checks.consumer).toEqual({ ok: false, error: 'the consumer is not running (closing or closed)' });
      await started.stop();
      await expect(fetch(`${url}/healthz`)).rejects.toThrow();
    } finally {
      await started.stop();
    }
  });

  it('exits 2 for an unknown broker, and for --key-from header without --scope', async () => {
    const unknown = await runCli(['consume', '--broker', 'kafka', '--handler', 'test/support/echo-handler.mjs']).exited;
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/--broker kafka: unknown broker; one of amqp/);
    const noScope = await runCli(['consume', '--broker', 'amqp', '--handler', 'test/support/echo-handler.mjs', '--key-from', 'header']).exited;
    expect(noScope.code).toBe(2);
    expect(noScope.stderr).toMatch(/--key-from header needs --scope/);
  });
});
