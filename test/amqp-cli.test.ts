/** `idempotent-jobs consume --broker amqp`: a user's handler module on a RabbitMQ queue, as a process. */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys } from '../src/index.js';
import { createAmqpTestEnv, type AmqpTestEnv, AMQP_URL } from './support/amqp-test-env.js';
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

function runCli(args: string[]) {
  const child = spawn(process.execPath, ['bin/idempotent-jobs.js', ...args], {
    env: { ...process.env, DATABASE_URL: env.databaseUrl, SCHEMA: env.schema, AMQP_URL, LOG_LEVEL: 'info' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr!.on('data', (c) => (stderr += c));
  const exited = once(child, 'exit').then(([code]) => ({ code: code as number, stderr }));
  return { child, exited };
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

  it('exits 2 for an unknown broker, and for --key-from header without --scope', async () => {
    const unknown = await runCli(['consume', '--broker', 'kafka', '--handler', 'test/support/echo-handler.mjs']).exited;
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/--broker kafka: unknown broker; one of amqp/);
    const noScope = await runCli(['consume', '--broker', 'amqp', '--handler', 'test/support/echo-handler.mjs', '--key-from', 'header']).exited;
    expect(noScope.code).toBe(2);
    expect(noScope.stderr).toMatch(/--key-from header needs --scope/);
  });
});
