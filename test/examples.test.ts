// @module-tag redis
/**
 * The examples run as their READMEs say (`tsx <file>`, configured by the environment), each
 * against this file's schema and Redis prefix, and do what they claim.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { jetstreamManager } from '@nats-io/jetstream';
import { connect as connectNats } from '@nats-io/transport-node';
import { connect as connectAmqp } from 'amqplib';
import { sql } from 'kysely';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { amqpTopology } from 'idempotent-jobs/amqp';
import { freePort } from './chaos/private-redis.js';
import { AMQP_URL } from './support/amqp-test-env.js';
import { sharedNatsUrl } from './support/nats-env.js';
import { systemToolForTests, withToolOnPath } from './support/system-tools.js';
import { prismaGenerate } from './support/prisma-cli.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const TSX = fileURLToPath(new URL('../node_modules/.bin/tsx', import.meta.url));
const PYTHON3 = systemToolForTests('python3');
const CURL = systemToolForTests('curl');
let env: TestEnv;
const children: ChildProcess[] = [];

beforeAll(async () => {
  env = await createTestEnv('examples');
});
/**
 * Stops the examples a test started. Several examples consume the queue `payments` under this
 * file's prefix: a worker left running would take the next example's jobs with its own handler.
 */
async function stopChildren(): Promise<void> {
  for (const child of children) if (child.exitCode === null) child.kill('SIGTERM');
  await Promise.all(children.map((child) => (child.exitCode === null ? new Promise((resolve) => child.once('exit', resolve)) : undefined)));
  children.length = 0;
}
afterEach(stopChildren);
afterAll(async () => {
  await stopChildren();
  await env.teardown();
});

function exampleEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  return { ...process.env, DATABASE_URL: env.databaseUrl, REDIS_URL: env.redisUrl, SCHEMA: env.schema, REDIS_PREFIX: env.redisPrefix, LOG_LEVEL: 'warn', ...extra };
}

/** Starts a long-running example and resolves once it prints `ready` (a regular expression). */
function start(file: string, ready: RegExp, extra: Record<string, string> = {}): Promise<RegExpMatchArray> {
  const child = spawn(TSX, [file], { cwd: ROOT, env: exampleEnv(extra), stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  let output = '';
  return new Promise((resolve, reject) => {
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      const match = output.match(ready);
      if (match) resolve(match);
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.once('exit', (code) => reject(new Error(`${file} exited (${code}) before it was ready:\n${output}`)));
  });
}

/** Runs a command to its end; its stdout. */
function run(command: string, args: string[], extra: Record<string, string> = {}): string {
  const result = spawnSync(command, args, { cwd: ROOT, env: exampleEnv(extra), encoding: 'utf8', timeout: 60_000 });
  if (result.status !== 0) throw new Error(`${command} ${args.join(' ')} failed (${result.status}):\n${result.stdout}\n${result.stderr}`);
  return result.stdout;
}

async function until<T>(read: () => Promise<T>, done: (value: T) => boolean): Promise<T> {
  for (;;) {
    const value = await read();
    if (done(value)) return value;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/**
 * The broker examples' output: one line per settled message, then the ledger's rows per key
 * (log lines, JSON objects, left out).
 */
const EXPECTED_BROKER_EXAMPLE_OUTPUT = ['order-1: completed', 'order-1: replayed', 'order-2: completed', 'ledger rows per key: {"order-1":1,"order-2":1}'];
const printedLines = (stdout: string) => stdout.split('\n').filter((line) => line !== '' && !line.startsWith('{'));

/** Rows of a broker example's ledger per key, read from the database rather than from what it printed. */
async function ledgerRows(table: string): Promise<Array<{ key: string; n: number }>> {
  return (await sql<{ key: string; n: number }>`select key, count(*)::int as n from ${sql.id(env.schema, table)} group by key order by key`.execute(env.db)).rows;
}

/** Which of `queues` exist on the broker; then deletes them, so that a failed run leaves nothing behind either. */
async function existingQueuesDeleted(queues: readonly string[]): Promise<string[]> {
  const connection = await connectAmqp(AMQP_URL);
  try {
    const existing: string[] = [];
    for (const queue of queues) {
      // A channel per check: asking for a missing queue closes the channel it was asked on.
      const channel = await connection.createChannel();
      channel.on('error', () => {});
      if (await channel.checkQueue(queue).then(() => true, () => false)) existing.push(queue);
      await channel.close().catch(() => {});
    }
    const channel = await connection.createChannel();
    for (const queue of existing) await channel.deleteQueue(queue);
    return existing;
  } finally {
    await connection.close();
  }
}

/** Which of `streams` exist on the NATS server; then deletes them. */
async function existingStreamsDeleted(streams: readonly string[]): Promise<string[]> {
  const connection = await connectNats({ servers: sharedNatsUrl() });
  try {
    const jsm = await jetstreamManager(connection);
    const existing: string[] = [];
    for (const stream of streams) if (await jsm.streams.info(stream).then(() => true, () => false)) existing.push(stream);
    for (const stream of existing) await jsm.streams.delete(stream);
    return existing;
  } finally {
    await connection.close();
  }
}

const count = async (table: string) => Number((await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, table)}`.execute(env.db)).rows[0]!.n);

describe('examples', () => {
  it('outbox-service: the order and its job commit together; the job completes once', async () => {
    const [, url] = await start('examples/outbox-service/service.ts', /listening on (http:\S+)/, { PORT: '0' });
    await start('examples/outbox-service/worker.ts', /order worker running/);
    const post = () => fetch(`${url}/orders`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ id: 'A-1', cents: 1200 }) });
    expect((await post()).status).toBe(201);
    expect((await post()).status).toBe(200);
    await until(() => count('shipments'), (n) => n > 0);
    const keys = await sql<{ status: string }>`select status from ${sql.id(env.schema, 'idempotency_keys')} where key = 'order-A-1'`.execute(env.db);
    expect(keys.rows).toEqual([{ status: 'completed' }]);
    expect(await count('shipments')).toBe(1);
    expect(await count('outbox')).toBe(1);
  });

  it('orders-service: a retried POST with its Idempotency-Key replays the first response; one order, one payment', async () => {
    const [, url] = await start('examples/orders-service/service.ts', /listening on (http:\S+)/, { PORT: '0' });
    await start('examples/orders-service/worker.ts', /payment worker running/);
    const order = (body: unknown, key = 'order-A-1') =>
      fetch(`${url}/orders`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-tenant': 'acme', 'idempotency-key': key }, body: JSON.stringify(body) });
    const first = await order({ reference: 'A-1', cents: 1200 });
    expect(first.status).toBe(201);
    const created = (await first.json()) as { id: string };
    const retry = await order({ reference: 'A-1', cents: 1200 });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect(await retry.json()).toEqual(created);
    expect((await order({ reference: 'A-1', cents: 999 })).status).toBe(422);
    expect((await order({ reference: 'A-1' }, 'order-A-2')).status).toBe(400);
    await until(() => count('order_charges'), (n) => n > 0);
    expect(await count('customer_orders')).toBe(1);
    expect(await count('order_charges')).toBe(1);
    const charges = await sql<{ order_id: string }>`select order_id from ${sql.id(env.schema, 'order_charges')}`.execute(env.db);
    expect(charges.rows).toEqual([{ order_id: created.id }]);
  });

  it('multi-step-payment: each step recorded once, the step key passed to the provider', async () => {
    await start('examples/multi-step-payment/worker.ts', /payment worker running/);
    run(TSX, ['examples/multi-step-payment/enqueue.ts', 'order-9', '500']);
    run(TSX, ['examples/multi-step-payment/enqueue.ts', 'order-9', '500']);
    await until(() => count('payments'), (n) => n > 0);
    const steps = await sql<{ name: string; position: number }>`select name, position from ${sql.id(env.schema, 'job_steps')} where key = 'order-9' order by position`.execute(env.db);
    expect(steps.rows).toEqual([{ name: 'reserve', position: 1 }, { name: 'charge', position: 2 }]);
    const charges = await sql<{ idempotency_key: string }>`select idempotency_key from ${sql.id(env.schema, 'provider_charges')}`.execute(env.db);
    const { stepKeyFor } = await import('idempotent-jobs');
    expect(charges.rows).toEqual([{ idempotency_key: stepKeyFor('default', 'order-9', 'charge') }]);
    expect(await count('payments')).toBe(1);
  });

  it.skipIf(PYTHON3 === undefined || CURL === undefined)('python-producer: its README block, run as it is, waits for the server, submits with curl and Python, gets the results, and stops the server', async () => {
    const readme = readFileSync(new URL('../examples/python-producer/README.md', import.meta.url), 'utf8');
    const section = readme.split(/^## Over the HTTP API/m)[1]!.split(/^## /m)[0]!;
    const block = /^```sh\n([\s\S]*?)^```$/m.exec(section)![1]!;
    const port = await freePort();
    // The block as written, but on this file's port, database, Redis, schema and prefix.
    const substitutions: Array<[string, string]> = [
      ['DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres', `DATABASE_URL=${env.databaseUrl}`],
      ['REDIS_URL=redis://127.0.0.1:6379', `REDIS_URL=${env.redisUrl}`],
      ['SCHEMA=examples REDIS_PREFIX=examples', `SCHEMA=${env.schema} REDIS_PREFIX=${env.redisPrefix}`],
      ['port=3000', `port=${port}`],
    ];
    let script = block;
    for (const [from, to] of substitutions) {
      expect(script, `the README block sets ${from}`).toContain(from);
      script = script.replace(from, to);
    }
    const pythonDir = PYTHON3!.slice(0, PYTHON3!.lastIndexOf('/'));
    const result = spawnSync('bash', ['-c', script], {
      cwd: ROOT,
      env: { ...withToolOnPath(CURL!), PATH: `${pythonDir}:${withToolOnPath(CURL!).PATH}`, LOG_LEVEL: 'warn' },
      encoding: 'utf8',
      timeout: 120_000,
    });
    expect(result.status, `${result.stdout}\n${result.stderr}`).toBe(0);
    expect(result.stderr).not.toMatch(/Failed to connect|Traceback/);
    const lines = result.stdout.split('\n').filter((line) => !line.startsWith('{"level"'));
    const curlAnswer = lines.findIndex((line) => line.startsWith('{') && line.includes('"quote-1"'));
    expect(JSON.parse(lines[curlAnswer]!)).toMatchObject({ key: 'quote-1', state: 'completed', result: { totalCents: 2999 } });
    expect(lines[curlAnswer + 1]).toBe('HTTP 200');
    expect(lines.find((line) => /^POST 20[02] /.test(line))).toBeDefined();
    const pythonAnswer = lines.filter((line) => line.startsWith('{') && line.includes('"quote-2"')).at(-1)!;
    expect(JSON.parse(pythonAnswer)).toMatchObject({ key: 'quote-2', state: 'completed', result: { totalCents: 2999 } });
    // The server stopped with the block: nothing listens on its port any more.
    await expect(fetch(`http://127.0.0.1:${port}/healthz`)).rejects.toThrow();
  }, 150_000);

  it('group-commit-worker: every job processed once by each worker, ratio printed', async () => {
    const jobs = 200;
    const line = run(TSX, ['examples/group-commit-worker/run.ts', String(jobs), '1']).trim();
    expect(JSON.parse(line)).toMatchObject({ round: 1, jobs, ratio: expect.any(Number) });
    const perWorker = await sql<{ worker: string; n: string; keys: string }>`
      select worker, count(*) as n, count(distinct key) as keys from ${sql.id(env.schema, 'events')} group by worker order by worker`.execute(env.db);
    expect(perWorker.rows).toEqual([
      { worker: 'idempotent', n: String(jobs), keys: String(jobs) },
      { worker: 'plain', n: String(jobs), keys: String(jobs) },
    ]);
  });

  // The data-layer workers: the same ledger effect written with each adapter's data layer. On a
  // fresh clone the Prisma CLI is installed into tools/prisma at its first use (about a minute of
  // npm install), hence the longer time.
  it.each(['pg', 'postgres-js', 'drizzle', 'prisma', 'typeorm', 'knex', 'mikro-orm'])('%s-worker: a job added twice writes one ledger row', { timeout: 240_000 }, async (name) => {
    if (name === 'prisma') {
      // The generated client is not committed: generated as the example's README says.
      prismaGenerate('examples/prisma-worker/schema.prisma');
    }
    const printed = run(TSX, [`examples/${name}-worker/run.ts`]);
    expect(printedLines(printed)).toEqual(EXPECTED_BROKER_EXAMPLE_OUTPUT);
    expect(await ledgerRows(`${name.replaceAll('-', '_')}_ledger`)).toEqual([{ key: 'order-1', n: 1 }, { key: 'order-2', n: 1 }]);
  });

  it('rabbitmq-consumer: a message published twice writes one ledger row; its queues are deleted', { tags: ['rabbitmq'] }, async () => {
    const { queue, deadLetterQueue, delayQueues } = amqpTopology(`${env.schema}.example-payments`);
    let left: string[];
    try {
      const printed = run(TSX, ['examples/rabbitmq-consumer/run.ts']);
      expect(printedLines(printed)).toEqual(EXPECTED_BROKER_EXAMPLE_OUTPUT);
      expect(await ledgerRows('rabbitmq_ledger')).toEqual([{ key: 'order-1', n: 1 }, { key: 'order-2', n: 1 }]);
    } finally {
      left = await existingQueuesDeleted([queue, deadLetterQueue, ...delayQueues]);
    }
    expect(left, 'left behind by the example').toEqual([]);
  });

  it('nats-consumer: a message published twice writes one ledger row; its streams are deleted', { tags: ['nats'] }, async () => {
    const stream = `${env.schema}-example-orders`;
    let left: string[];
    try {
      const printed = run(TSX, ['examples/nats-consumer/run.ts']);
      expect(printedLines(printed)).toEqual(EXPECTED_BROKER_EXAMPLE_OUTPUT);
      expect(await ledgerRows('nats_ledger')).toEqual([{ key: 'order-1', n: 1 }, { key: 'order-2', n: 1 }]);
    } finally {
      left = await existingStreamsDeleted([stream, `${stream}-dead-letters`]);
    }
    expect(left, 'left behind by the example').toEqual([]);
  });
});
