// @module-tag redis
/**
 * Two replicas of the orders service (examples/orders-service, real processes) killed with
 * SIGKILL in turn, and started again, while clients keep sending `POST /orders` and retrying each
 * request with its Idempotency-Key, on the other replica when theirs is gone, until it is answered. Every key must end with exactly one order and one
 * payment job, and every answer a client got must be the first response (the same order) or
 * a clear 409: never a second order, never another answer. The request lease is 2 s: a retry
 * meeting a request that a kill cut off is answered 409 until then, and takes it over after.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { request as httpRequest } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { jobIdFor } from '../src/index.js';
import { freePort } from './chaos/private-redis.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
/** Keys sent at most; the clients stop sooner, once the kills are over. */
const MAX_KEYS = 2_000;
const CLIENTS = 6;
const KILLS = 3;

let env: TestEnv;
const ports: number[] = [];
/** The replicas, by index; a replica being started again is its start's promise. */
const replicas: Array<Promise<ChildProcess>> = [];

beforeAll(async () => {
  env = await createTestEnv('http_idempotency_kill');
  ports.push(await freePort(), await freePort());
});
afterAll(async () => {
  for (const replica of replicas) {
    const child = await replica.catch(() => undefined);
    if (child && child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      await once(child, 'exit');
    }
  }
  await env?.teardown();
});

/** Starts replica `index` on its port and resolves once it listens. */
async function startService(index: number): Promise<ChildProcess> {
  const port = ports[index]!;
  // Node itself with tsx's loader (the tsx command would run the service in a child of its own, which a kill of it leaves running).
  const child = spawn(process.execPath, ['--import', 'tsx', 'examples/orders-service/service.ts'], {
    cwd: ROOT,
    env: { ...process.env, DATABASE_URL: env.databaseUrl, REDIS_URL: env.redisUrl, SCHEMA: env.schema, REDIS_PREFIX: env.redisPrefix, PORT: String(port), LEASE_MS: '2000', LOG_LEVEL: 'warn' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on('data', (chunk: Buffer) => {
      output += chunk.toString();
      if (output.includes('listening on')) resolve();
    });
    child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.once('exit', (code, signal) => reject(new Error(`the service exited (${code ?? signal}) before it listened:\n${output}`)));
  });
  return child;
}

interface Answer {
  readonly status: number;
  readonly body: string;
  readonly replayed: boolean;
}

/** One POST to a replica; `refused` when it was down, `cut-off` when it was killed with the request in flight. */
function postOrder(port: number, key: string): Promise<Answer | 'refused' | 'cut-off'> {
  return new Promise((resolve) => {
    const body = JSON.stringify({ reference: key, cents: 100 + (Number.parseInt(key.slice(-3), 10) || 0) });
    const req = httpRequest(
      { host: '127.0.0.1', port, path: '/orders', method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'x-tenant': 'acme', 'idempotency-key': key } },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () => resolve({ status: res.statusCode!, body: Buffer.concat(chunks).toString('utf8'), replayed: res.headers['idempotent-replayed'] === 'true' }));
        res.on('error', () => resolve('cut-off'));
      },
    );
    req.setTimeout(30_000, () => req.destroy());
    req.on('error', (error: NodeJS.ErrnoException) => resolve(error.code === 'ECONNREFUSED' ? 'refused' : 'cut-off'));
    req.end(body);
  });
}

it('replicas killed mid-request: every key gets exactly one order and one job, every answer the first response or a 409', async () => {
  replicas.push(startService(0), startService(1));
  await Promise.all(replicas);
  const answers = new Map<string, Answer[]>();
  let cutOff = 0;
  let completed = 0;
  let killsOver = false;
  let sent = 0;
  const nextKey = () => (killsOver || sent >= MAX_KEYS ? undefined : `order-key-${String(sent++).padStart(4, '0')}`);

  /** Sends until answered, moving to the other replica when one does not answer. */
  const send = async (key: string, replica: number): Promise<{ answer: Answer; replica: number }> => {
    for (;;) {
      const answer = await postOrder(ports[replica]!, key);
      if (typeof answer !== 'string') return { answer, replica };
      if (answer === 'cut-off') cutOff++;
      replica = 1 - replica;
      await sleep(20);
    }
  };
  const client = async (index: number) => {
    let replica = index % 2;
    for (let key = nextKey(); key !== undefined; key = nextKey()) {
      const got: Answer[] = [];
      answers.set(key, got);
      for (;;) {
        const sent = await send(key, replica);
        replica = sent.replica;
        got.push(sent.answer);
        if (sent.answer.status === 201) break;
        await sleep(sent.answer.status === 409 ? 200 : 50);
      }
      // Every fifth key is sent once more after its answer, to the other replica: a retry that came late.
      if (key.endsWith('0') || key.endsWith('5')) got.push((await send(key, 1 - replica)).answer);
      completed++;
    }
  };

  const killer = async () => {
    for (let kill = 0; kill < KILLS; kill++) {
      const victim = kill % 2;
      // The other replica serves meanwhile: it is up before this one goes, and both take requests for a while.
      await replicas[1 - victim];
      const before = completed;
      while (completed < before + 20) await sleep(20);
      const child = await replicas[victim]!;
      const exited = once(child, 'exit');
      child.kill('SIGKILL');
      await exited;
      replicas[victim] = startService(victim);
    }
    await Promise.all(replicas);
    killsOver = true;
  };

  await Promise.all([killer(), ...Array.from({ length: CLIENTS }, (_, index) => client(index))]);

  // Kills landed on requests in flight.
  expect(cutOff).toBeGreaterThan(0);
  for (const [key, got] of answers) {
    const created = got.filter((answer) => answer.status === 201);
    expect(created.length, `${key}: ${JSON.stringify(got)}`).toBeGreaterThan(0);
    // Only the first response (201, one body) or a clear 409: nothing else was ever answered.
    expect(got.every((answer) => answer.status === 201 || answer.status === 409), `${key}: ${JSON.stringify(got)}`).toBe(true);
    expect(new Set(created.map((answer) => answer.body)).size, `${key}: ${JSON.stringify(created)}`).toBe(1);
  }
  const orders = await sql<{ id: string; reference: string }>`select id, reference from ${sql.id(env.schema, 'customer_orders')}`.execute(env.db);
  expect(orders.rows).toHaveLength(answers.size);
  const jobs = await sql<{ job_id: string; n: string }>`select job_id, count(*) as n from ${sql.id(env.schema, 'outbox')} group by job_id`.execute(env.db);
  const jobsById = new Map(jobs.rows.map((row) => [row.job_id, Number(row.n)]));
  expect(jobs.rows).toHaveLength(answers.size);
  for (const order of orders.rows) {
    const answered = JSON.parse(answers.get(order.reference)!.find((answer) => answer.status === 201)!.body) as { id: string };
    // The order the client was told about is the one that exists, and it has one payment job.
    expect(answered.id, order.reference).toBe(order.id);
    expect(jobsById.get(jobIdFor('default', `order-${order.id}`)), order.reference).toBe(1);
  }
  const replays = [...answers.values()].flat().filter((answer) => answer.replayed).length;
  console.log(`kill test: ${answers.size} keys, ${KILLS} kills, ${cutOff} requests cut off, ${replays} replays, ${[...answers.values()].flat().filter((a) => a.status === 409).length} answered 409`);
}, 240_000);
