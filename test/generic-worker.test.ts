import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotentProducer, loadEnvConfig, ConfigError } from '../src/index.js';
import { waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let producer: IdempotentProducer;

beforeAll(async () => {
  env = await createTestEnv('generic_worker');
  producer = new IdempotentProducer({ queue: 'echo', connection: { url: env.redisUrl }, prefix: env.redisPrefix });
});
afterAll(async () => {
  await producer?.close();
  await env?.teardown();
});

function runCli(args: string[], extraEnv: Record<string, string> = {}) {
  const child = spawn(process.execPath, ['bin/idempotent-jobs.js', ...args], {
    env: { ...process.env, DATABASE_URL: env.databaseUrl, REDIS_URL: env.redisUrl, SCHEMA: env.schema, REDIS_PREFIX: env.redisPrefix, ...extraEnv },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (c) => (stdout += c));
  child.stderr!.on('data', (c) => (stderr += c));
  const exited = once(child, 'exit').then(([code]) => ({ code: code as number, stdout, stderr }));
  return { child, exited };
}

describe('idempotent-jobs worker --handler', () => {
  it("runs a user's handler module, stores its result, and shuts down on SIGTERM", async () => {
    const { child, exited } = runCli(['worker', '--queue', 'echo', '--handler', 'test/support/echo-handler.mjs', '--concurrency', '2']);
    await new Promise<void>((resolve, reject) => {
      createInterface({ input: child.stdout! }).on('line', (line) => line.includes('worker ready') && resolve());
      child.once('exit', (code) => reject(new Error(`worker exited early with ${code}`)));
    });
    const { jobId } = await producer.enqueue({ name: 'echo', scope: 's', key: 'k1', data: { hello: 'world' } });
    const { job } = await waitForJobState(producer.queue, jobId, ['completed']);
    expect(job.returnvalue).toEqual({ echoed: { hello: 'world' }, key: 'k1', fence: 1 });
    child.kill('SIGTERM');
    expect((await exited).code).toBe(0);
  });

  it('exits 2 naming the module when it has no default export', async () => {
    const { exited } = runCli(['worker', '--queue', 'echo', '--handler', 'test/support/not-a-handler.mjs']);
    const { code, stderr } = await exited;
    expect(code).toBe(2);
    expect(stderr).toMatch(/not-a-handler\.mjs: the module has no default export/);
  });

  it('exits 2 naming each wrong environment variable', async () => {
    const { exited } = runCli(['migrate'], { CONCURRENCY: '0', LEASE_MS: 'soon' });
    const { code, stderr } = await exited;
    expect(code).toBe(2);
    expect(stderr).toMatch(/CONCURRENCY: .*>=1.*"0"/);
    expect(stderr).toMatch(/LEASE_MS: .*"soon"/);
  });
});

describe('loadEnvConfig', () => {
  it('applies defaults and validates', () => {
    const config = loadEnvConfig({ QUEUE: 'q', CONCURRENCY: '3', FAST_PATH: 'true' });
    expect(config).toMatchObject({ QUEUE: 'q', CONCURRENCY: 3, FAST_PATH: true, LEASE_MS: 30_000, SCHEMA: 'idempotent_jobs' });
    expect(() => loadEnvConfig({ DATABASE_URL: 'not a url' })).toThrow(ConfigError);
    expect(() => loadEnvConfig({ SCHEMA: 'Robert"; drop' })).toThrow(/SCHEMA/);
  });
});
