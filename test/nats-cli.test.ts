import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, toWireJobData } from '../src/index.js';
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
