// @module-tag redis
/**
 * `npm run demo`, small (`DEMO_JOBS`), on a schema and Redis prefix of this file's: it passes its
 * own checks, explains why the BullMQ jobs it counts are fewer than the requests enqueued, and
 * removes its schema and every Redis key under its prefix when it ends. The same on BullMQ's
 * PostgreSQL backend, and on an embedded Postgres when neither Postgres nor Redis answers.
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createTestEnv, type TestEnv } from './support/test-env.js';
import { freePort } from './chaos/private-redis.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
let env: TestEnv;

beforeAll(async () => {
  env = await createTestEnv('demo');
});
afterAll(async () => {
  await env?.teardown();
});

it('runs, explains "jobs finished" against "enqueued", and leaves no schema and no Redis key behind', async () => {
  const schema = `${env.schema}_demo`;
  const prefix = `${env.redisPrefix}-demo`;
  const child = spawn(process.execPath, ['--import', 'tsx', 'demo/run-demo.ts'], {
    cwd: ROOT,
    env: { ...process.env, DATABASE_URL: env.databaseDirectUrl, REDIS_URL: env.redisUrl, SCHEMA: schema, REDIS_PREFIX: prefix, DEMO_JOBS: '300' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
  expect(code, output).toBe(0);
  expect(output).toMatch(/^OK: /m);
  expect(output).toContain('"jobs finished" counts BullMQ jobs: a duplicate enqueued under an existing job id adds none');
  const enqueued = Number(/^ {2}enqueued +(\d+)$/m.exec(output)![1]);
  const [, jobs, dropped] = /^ {2}BullMQ jobs +(\d+) \((\d+) duplicates enqueued under the job id of one already there: BullMQ adds no second job\)$/m.exec(output)!;
  expect(Number(jobs) + Number(dropped)).toBe(enqueued);
  expect(output).toMatch(new RegExp(`^removed schema ${schema} and \\d+ Redis keys under ${prefix}: \\(DEMO_KEEP=true keeps them\\)$`, 'm'));

  const schemas = await sql<{ n: string }>`select count(*) as n from information_schema.schemata where schema_name = ${schema}`.execute(env.db);
  expect(Number(schemas.rows[0]!.n)).toBe(0);
  const redis = env.openRedis();
  expect(await redis.keys(`${prefix}:*`)).toEqual([]);
}, 300_000);

/**
 * Runs the demo with `env` over the process's own; its exit code and everything it printed. A
 * demo still running after `deadlineMs` is killed, so that the test fails with what it printed
 * rather than as a bare timeout.
 */
async function runDemo(env: NodeJS.ProcessEnv, deadlineMs = 270_000): Promise<{ code: number | null; output: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'demo/run-demo.ts'], { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const deadline = setTimeout(() => {
    output += `\n[test] the demo was still running after ${deadlineMs} ms: killed\n`;
    child.kill('SIGKILL');
  }, deadlineMs);
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
  clearTimeout(deadline);
  return { code, output };
}

/** A port on which nothing answers: one the kernel just handed out and that was closed again. */
const deadPort = freePort;

it('runs on BullMQ\'s PostgreSQL backend (QUEUE_BACKEND=postgres), says so, and drops its schemas', async () => {
  const schema = `${env.schema}_pgdemo`;
  const queueSchema = `${env.schema}_pgdemo_q`;
  const { code, output } = await runDemo({
    DATABASE_URL: env.databaseDirectUrl,
    REDIS_URL: env.redisUrl,
    QUEUE_BACKEND: 'postgres',
    SCHEMA: schema,
    QUEUE_SCHEMA: queueSchema,
    DEMO_JOBS: '300',
  });
  expect(code, output).toBe(0);
  expect(output).toContain(`demo: the queue is in Postgres (BullMQ's PostgreSQL backend, schema ${queueSchema}) because QUEUE_BACKEND=postgres`);
  expect(output).toMatch(/^OK: /m);
  expect(output).toContain(`removed schema ${schema} and BullMQ's schema ${queueSchema} (DEMO_KEEP=true keeps them)`);
  const schemas = await sql<{ n: string }>`select count(*) as n from information_schema.schemata where schema_name in (${schema}, ${queueSchema})`.execute(env.db);
  expect(Number(schemas.rows[0]!.n)).toBe(0);
}, 300_000);

it('starts an embedded Postgres when neither Postgres nor Redis answers, runs on it, says so, and removes it', async () => {
  const [postgresPort, redisPort] = [await deadPort(), await deadPort()];
  const { code, output } = await runDemo({
    DATABASE_URL: `postgres://postgres@127.0.0.1:${postgresPort}/postgres`,
    DATABASE_DIRECT_URL: '',
    REDIS_URL: `redis://127.0.0.1:${redisPort}`,
    QUEUE_BACKEND: '',
    DEMO_JOBS: '300',
  });
  expect(code, output).toBe(0);
  expect(output).toMatch(/^demo: the queue is in Postgres \(BullMQ's PostgreSQL backend, schema ij_demo_queue\) because neither Postgres nor Redis answered .*; started an embedded Postgres at postgres:\/\/postgres:\S+@127\.0\.0\.1:\d+\/postgres/m);
  expect(output).toMatch(/^OK: /m);
  const directory = /^stopped the embedded Postgres and removed its data \((.+)\)$/m.exec(output)?.[1];
  expect(directory, output).toBeDefined();
  expect(existsSync(directory!)).toBe(false);
}, 300_000);
