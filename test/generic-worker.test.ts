// @module-tag redis
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotentProducer, ConfigError } from '../src/index.js';
import { loadEnvConfig, loadHandlerModule } from '../src/process/index.js';
import { waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let producer: IdempotentProducer;
let ledgerProducer: IdempotentProducer;

beforeAll(async () => {
  env = await createTestEnv('generic_worker');
  producer = new IdempotentProducer({ queue: 'echo', connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  ledgerProducer = new IdempotentProducer({ queue: 'ledger', connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  await sql`create table ${sql.id(env.schema, 'ledger')} (key text not null, amount int not null)`.execute(env.db);
});
afterAll(async () => {
  await producer?.close();
  await ledgerProducer?.close();
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

function untilReady(child: ReturnType<typeof runCli>['child']): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (line) => line.includes('worker ready') && resolve());
    child.once('exit', (code) => reject(new Error(`worker exited early with ${code}`)));
  });
}

describe('idempotent-jobs worker --handler', () => {
  it("runs a user's handler module, stores its result, and shuts down on SIGTERM", async () => {
    const { child, exited } = runCli(['worker', '--queue', 'echo', '--handler', 'test/support/echo-handler.mjs', '--concurrency', '2']);
    await untilReady(child);
    const { jobId } = await producer.enqueue({ name: 'echo', scope: 's', key: 'k1', data: { hello: 'world' } });
    const { job } = await waitForJobState(producer.queue, jobId, ['completed']);
    expect(job.returnvalue).toEqual({ echoed: { hello: 'world' }, key: 'k1', fence: 1 });
    child.kill('SIGTERM');
    expect((await exited).code).toBe(0);
  });

  it('runs a database-only handler module ({ transaction }): each effect once, its result stored, on the fast path by default', async () => {
    const { child, exited } = runCli(['worker', '--queue', 'ledger', '--handler', 'test/support/ledger-handler.mjs', '--concurrency', '4']);
    await untilReady(child);
    const enqueued = await Promise.all([1, 2, 3].map((n) => ledgerProducer.enqueue({ name: 'book', scope: 's', key: `l${n}`, data: { amount: n * 10 } })));
    const done = await Promise.all(enqueued.map(({ jobId }) => waitForJobState(ledgerProducer.queue, jobId, ['completed'])));
    expect(done.map(({ job }) => job.returnvalue)).toEqual([1, 2, 3].map((n) => ({ booked: n * 10, key: `l${n}` })));
    const { rows } = await sql<{ key: string; claimed_with_effect: boolean }>`
      select l.key, k.created_at = k.updated_at as claimed_with_effect
        from ${sql.id(env.schema, 'ledger')} l join ${sql.id(env.schema, 'idempotency_keys')} k on k.scope = 's' and k.key = l.key
       order by l.key`.execute(env.db);
    // One row per key; each key claimed in its effect's transaction (the fast path, no lease):
    // written in that transaction alone, so never updated after it was created, as a leased
    // key's completion updates it.
    expect(rows).toEqual([1, 2, 3].map((n) => ({ key: `l${n}`, claimed_with_effect: true })));
    child.kill('SIGTERM');
    expect((await exited).code).toBe(0);
  });

  it('exits 2 naming the module when its default export is neither a function nor { transaction }', async () => {
    const { exited } = runCli(['worker', '--queue', 'echo', '--handler', 'test/support/object-handler.mjs']);
    const { code, stderr } = await exited;
    expect(code).toBe(2);
    expect(stderr).toMatch(/object-handler\.mjs: its default export is an object without a transaction function; export default a function \(async \(ctx\) => result\) or a database-only handler \(\{ transaction: async \(tx, ctx\) => result \}, or databaseOnly\(dataLayer, async \(tx, ctx\) => result\)\)/);
    await expect(loadHandlerModule('test/support/object-handler.mjs')).rejects.toThrow(ConfigError);
    await expect(loadHandlerModule('test/support/not-a-handler.mjs')).rejects.toThrow(/not-a-handler\.mjs: the module has no default export/);
    expect(typeof (await loadHandlerModule('test/support/echo-handler.mjs'))).toBe('function');
    expect(await loadHandlerModule('test/support/ledger-handler.mjs')).toHaveProperty('transaction');
  });

  it('exits 2 when no queue is named (no --queue, no QUEUE), saying how to name it', async () => {
    const { exited } = runCli(['worker', '--handler', 'test/support/echo-handler.mjs'], { QUEUE: '' });
    const { code, stderr } = await exited;
    expect(code).toBe(2);
    expect(stderr).toContain('worker: no queue named. Pass --queue <name> (or set QUEUE)');
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
