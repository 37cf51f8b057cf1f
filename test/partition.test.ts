// @module-tag redis
/**
 * A partition between a worker and Postgres (test/support/fault-proxy.ts between them; nothing
 * is closed, bytes are held) that lasts past the lease, and a link that delays every packet
 * past it: the worker's effect transaction is held mid-way, another worker takes the key over
 * once the lease has run out by the database's clock and commits the effect, and when the held
 * transaction finally reaches Postgres its completion is fenced out and rolled back with its
 * effect. One effect per key; no job fails; the held job replays the stored result.
 */
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadEnvConfig, startWorkerProcess, type WorkerProcess } from '../src/process/index.js';
import { FaultProxy } from './support/fault-proxy.js';
import { createGate } from './support/protocol-fixtures.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const LEASE_MS = 1_500;
let env: TestEnv;
const stops: Array<() => Promise<void>> = [];

beforeAll(async () => {
  env = await createTestEnv('partition');
  await sql`create table ${sql.id(env.schema, 'ledger')} (id bigint generated always as identity primary key, key text not null, fence bigint not null)`.execute(env.db);
});
afterAll(async () => {
  for (const stop of stops.reverse()) await stop().catch(() => {});
  await env?.teardown();
});

/** A worker on `queue` whose handler, for its first job, waits on `gate` before its effect's transaction. */
async function startWorker(queue: string, databaseUrl: string, gate?: { started: () => void; wait: Promise<void> }): Promise<WorkerProcess<any, any>> {
  let first = true;
  const worker = await startWorkerProcess({
    config: loadEnvConfig({
      DATABASE_URL: databaseUrl,
      DATABASE_DIRECT_URL: databaseUrl,
      REDIS_URL: env.redisUrl,
      REDIS_PREFIX: env.redisPrefix,
      SCHEMA: env.schema,
      QUEUE: queue,
      CONCURRENCY: '1',
      LEASE_MS: String(LEASE_MS),
      DEFER_MAX_MS: '500',
      SWEEPER_ENABLED: 'false',
      JANITOR_ENABLED: 'false',
    }),
    handler: async (ctx) => {
      if (gate && first) {
        first = false;
        gate.started();
        await gate.wait;
      }
      return ctx.transaction(async (tx) => {
        await tx.insertInto(`${env.schema}.ledger`).values({ key: ctx.key, fence: ctx.fence }).execute();
        return { fence: ctx.fence };
      });
    },
    logger: pino({ level: 'silent' }),
    handleSignals: false,
  });
  stops.push(() => worker.stop());
  return worker;
}

const ledger = async (key: string) =>
  (await env.db.selectFrom(`${env.schema}.ledger`).select(['fence']).where('key', '=', key).execute()).map((row) => Number(row.fence));
const keyRow = async (key: string) => env.db.selectFrom(`${env.schema}.idempotency_keys`).select(['status', 'fence']).where('key', '=', key).executeTakeFirst();

describe.each([
  { fault: 'a partition (nothing passes, nothing is closed) longer than the lease', apply: (proxy: FaultProxy) => proxy.partition() },
  { fault: 'a delay of every packet longer than the lease', apply: (proxy: FaultProxy) => proxy.setFaults({ latencyMs: LEASE_MS * 2 }) },
])('$fault between a worker and Postgres', ({ fault, apply }) => {
  it('another worker takes the key over; the held completion is fenced out; one effect, nothing failed', async () => {
    const queueName = `partition-${fault.length}-${Date.now()}`;
    const key = `key-${queueName}`;
    const target = new URL(env.databaseDirectUrl);
    const proxy = await FaultProxy.start({ target: { host: target.hostname, port: Number(target.port || 5432) } });
    stops.push(() => proxy.close());
    const started = createGate();
    const proceed = createGate();
    await startWorker(queueName, proxy.url(env.databaseDirectUrl), { started: started.open, wait: proceed.wait });
    const queue = new Queue(queueName, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
    stops.push(() => queue.close());
    const held = await queue.add('book', { idempotencyKey: key, payload: {} });
    await started.wait;
    // The claim is made; cut the worker off from Postgres, then let its effect begin: its
    // transaction and its heartbeats are held in the proxy.
    apply(proxy);
    proceed.open();
    await waitFor('the lease to run out by the database clock', async () =>
      (await sql<{ expired: boolean }>`select locked_until < now() as expired from ${sql.id(env.schema, 'idempotency_keys')} where key = ${key}`.execute(env.db)).rows[0]?.expired || undefined,
    );
    // Another worker, on a healthy link, gets the same key (a second job under a foreign id).
    await startWorker(queueName, env.databaseDirectUrl);
    await queue.add('book', { idempotencyKey: key, payload: {} }, { jobId: `foreign-${key}` });
    await waitFor('the takeover to complete the key', async () => ((await keyRow(key))?.status === 'completed' ? true : undefined), 30_000);
    expect(await ledger(key)).toEqual([2]);
    // The link comes back: the held transaction reaches Postgres, and its completion is fenced out.
    proxy.clear();
    const done = await waitForJobState(queue, held.id!, ['completed', 'failed'], 60_000);
    expect(done.state).toBe('completed');
    expect(await ledger(key)).toEqual([2]);
    expect(await keyRow(key)).toMatchObject({ status: 'completed' });
    expect(Number((await keyRow(key))!.fence)).toBe(2);
    expect(await queue.getJobCounts('failed')).toEqual({ failed: 0 });
  }, 90_000);
});
