// @module-tag redis
/**
 * examples/nestjs-payments as a real Nest application: compiled as `nest build` compiles it
 * (tsc, Nest's decorator settings) against the built package (`npm run build` first: its
 * imports of 'idempotent-jobs/*' go through package.json's "exports"), run with node on this
 * file's schema and Redis prefix. The smoke: a payment posted twice is charged and booked once,
 * Bull Board (mounted through @bull-board/nestjs) shows the job's key, /health is up. Then the
 * kill: payments are posted while the application is SIGKILLed mid-job and restarted, then
 * SIGTERMed mid-job (it drains, releasing the keys of jobs still running past its shutdown
 * timeout) and restarted: every payment ends booked once and charged once, no job failed.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { IdempotentProducer, jobIdFor } from '../src/index.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const APP = 'examples/nestjs-payments';
const MAIN = `${APP}/dist/main.js`;
const PAYMENTS = 60;

let env: TestEnv;
const running = new Set<ChildProcess>();

beforeAll(async () => {
  if (!existsSync(`${ROOT}/dist/src/nestjs/index.js`)) {
    throw new Error('The Nest application is built against the built package: run `npm run build` first.');
  }
  rmSync(`${ROOT}/${APP}/dist`, { recursive: true, force: true });
  const built = spawnSync(process.execPath, [`${ROOT}/node_modules/typescript/bin/tsc`, '-p', `${APP}/tsconfig.build.json`], { cwd: ROOT, encoding: 'utf8', timeout: 240_000 });
  if (built.status !== 0) throw new Error(`tsc -p ${APP}/tsconfig.build.json failed:\n${built.stdout}${built.stderr}`);
  env = await createTestEnv('nestjs-payments-kill');
}, 300_000);

afterAll(async () => {
  for (const child of running) child.kill('SIGKILL');
  await env?.teardown();
});

interface App {
  readonly url: string;
  readonly child: ChildProcess;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  output(): string;
}

/** Starts the application; resolves once it listens. */
function startApp(): Promise<App> {
  const child = spawn(process.execPath, [MAIN], {
    cwd: ROOT,
    env: {
      ...process.env,
      DATABASE_URL: env.databaseUrl,
      REDIS_URL: env.redisUrl,
      SCHEMA: env.schema,
      REDIS_PREFIX: env.redisPrefix,
      PORT: '0',
      // Slow enough that a kill lands mid-job, with a short lease so that a killed instance's keys are taken over soon.
      GATEWAY_DELAY_MS: '150',
      CONCURRENCY: '4',
      LEASE_MS: '3000',
      SHUTDOWN_TIMEOUT_MS: '200',
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  running.add(child);
  let output = '';
  child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('exit', (code, signal) => {
      running.delete(child);
      resolve({ code, signal });
    }),
  );
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the application did not listen within 60 s:\n${output}`)), 60_000);
    const onData = () => {
      const url = /payments app listening on (http:\S+)/.exec(output)?.[1];
      if (!url) return;
      clearTimeout(timer);
      child.stdout!.off('data', onData);
      resolve({ url, child, exited, output: () => output });
    };
    child.stdout!.on('data', onData);
    void exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`the application exited (${code ?? signal}) before it listened:\n${output}`));
    });
  });
}

async function post(app: App, orderId: string, cents: number): Promise<{ status: number; body: { jobId?: string; status?: string } }> {
  const response = await fetch(`${app.url}/payments`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ orderId, cents }) });
  return { status: response.status, body: (await response.json()) as { jobId?: string; status?: string } };
}

async function count(table: string, where = sql`true`): Promise<number> {
  const { rows } = await sql<{ n: number }>`select count(*)::int as n from ${sql.id(env.schema, table)} where ${where}`.execute(env.db);
  return rows[0]!.n;
}

async function until(what: string, check: () => Promise<boolean>, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

it('smoke: a payment posted twice is charged and booked once; Bull Board shows its key; /health is up', async () => {
  const app = await startApp();
  try {
    expect(await post(app, 'smoke', 1999)).toEqual({ status: 202, body: { jobId: jobIdFor('default', 'order-smoke'), status: 'added' } });
    expect((await post(app, 'smoke', 1999)).body.status).toBe('duplicate');
    expect((await post(app, '<script>', 5)).status).toBe(400);
    await until('the smoke payment', async () => (await count('nest_ledger', sql`key = 'order-smoke'`)) === 1);

    const board = await fetch(`${app.url}/queues/api/queues/payments/${encodeURIComponent(jobIdFor('default', 'order-smoke'))}`);
    const { job } = (await board.json()) as { job: { name: string; progress: { idempotencyKey: Record<string, unknown> }; externalUrl: { href: string } } };
    expect(job.name).toBe('charge · key completed, fence 1');
    expect(job.progress.idempotencyKey).toMatchObject({ key: 'order-smoke', status: 'completed', effect: "this job's run", steps: [{ name: 'charge-card', state: 'recorded' }] });
    expect(job.externalUrl.href).toBe('http://127.0.0.1:8080/ui/#/key?scope=default&key=order-smoke');
    expect(await (await fetch(`${app.url}/queues/`)).text()).toContain('<div id="root">');

    const health = (await (await fetch(`${app.url}/health`)).json()) as { status: string; details: { jobs: { workers: Record<string, string> } } };
    expect(health.status).toBe('ok');
    expect(health.details.jobs.workers).toEqual({ payments: 'running' });
  } finally {
    app.child.kill('SIGTERM');
    expect((await app.exited).signal ?? (await app.exited).code).toBe('SIGTERM');
  }
}, 120_000);

it(`kill: ${PAYMENTS} payments across a SIGKILL and a SIGTERM mid-job: 0 lost, 0 booked or charged twice, 0 failed`, async () => {
  let app = await startApp();
  const booked = () => count('nest_ledger', sql`key like 'order-kill-%'`);
  for (let i = 0; i < PAYMENTS / 2; i++) expect((await post(app, `kill-${i}`, 100 + i)).status).toBe(202);
  // SIGKILL while jobs run: their keys stay held until their leases end.
  await until('some payments booked before the SIGKILL', async () => (await booked()) >= 4);
  app.child.kill('SIGKILL');
  expect((await app.exited).signal).toBe('SIGKILL');

  app = await startApp();
  for (let i = PAYMENTS / 2; i < PAYMENTS; i++) expect((await post(app, `kill-${i}`, 100 + i)).status).toBe(202);
  // SIGTERM while jobs run: Nest's shutdown hooks drain the worker; jobs still running after
  // SHUTDOWN_TIMEOUT_MS are aborted, their keys released and their jobs put back.
  const before = await booked();
  await until('more payments booked before the SIGTERM', async () => (await booked()) >= before + 4);
  app.child.kill('SIGTERM');
  const stopped = await app.exited;
  expect(stopped.signal ?? stopped.code, app.output()).toBe('SIGTERM');

  app = await startApp();
  await until(`all ${PAYMENTS} payments booked`, async () => (await booked()) >= PAYMENTS, 120_000);
  // Let any second effect that would come show up.
  await new Promise((resolve) => setTimeout(resolve, 1_000));
  const { rows: perKey } = await sql<{ key: string; n: number }>`
    select key, count(*)::int as n from ${sql.id(env.schema, 'nest_ledger')} where key like 'order-kill-%' group by key`.execute(env.db);
  expect(perKey.length, 'lost payments').toBe(PAYMENTS);
  expect(perKey.filter((row) => row.n !== 1), 'payments booked twice').toEqual([]);
  const { rows: charges } = await sql<{ key: string; n: number }>`
    select request_key as key, count(*)::int as n from ${sql.id(env.schema, 'nest_gateway_charges')} group by request_key having count(*) > 1`.execute(env.db);
  expect(charges, 'gateway requests recorded twice').toEqual([]);
  const producer = new IdempotentProducer({ queue: 'payments', connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  try {
    const counts = await producer.queue.getJobCounts('completed', 'failed', 'wait', 'active', 'delayed');
    expect(counts).toEqual({ completed: PAYMENTS + 1, failed: 0, wait: 0, active: 0, delayed: 0 });
  } finally {
    await producer.close();
    app.child.kill('SIGTERM');
    await app.exited;
  }
}, 300_000);
