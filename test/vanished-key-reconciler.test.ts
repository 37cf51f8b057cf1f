// @module-tag redis
/**
 * The reconciler for what a Postgres failover with asynchronous replication loses: a job BullMQ
 * holds as completed whose key and effect vanished together (the promoted standby never had
 * the commit), or whose claim survived but not its completion (the key left `processing`).
 * The loss is made here as the failover makes it — the key's row and its effect deleted
 * together, or the completion undone — on this file's own schema; the chaos suite's Patroni
 * profile makes it with a real failover (`--async-replication --reconcile`). Each such job runs
 * again once, and only those: completed keys, keys held under a live lease, jobs older than the
 * window are left alone.
 */
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotentProducer } from '../src/index.js';
import { VanishedKeyReconciler, loadEnvConfig, startWorkerProcess, type WorkerProcess } from '../src/process/index.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const QUEUE = 'reconciled';
let env: TestEnv;
let worker: WorkerProcess<any, any>;
let producer: IdempotentProducer;
let queue: Queue;

beforeAll(async () => {
  env = await createTestEnv('vanished-key-reconciler');
  await sql`create table ${sql.id(env.schema, 'ledger')} (id bigint generated always as identity primary key, key text not null)`.execute(env.db);
  worker = await startWorkerProcess({
    config: loadEnvConfig({ DATABASE_URL: env.databaseUrl, DATABASE_DIRECT_URL: env.databaseDirectUrl, REDIS_URL: env.redisUrl, REDIS_PREFIX: env.redisPrefix, SCHEMA: env.schema, QUEUE, SWEEPER_ENABLED: 'false' }),
    handler: async (ctx) =>
      ctx.transaction(async (tx) => {
        await tx.insertInto(`${env.schema}.ledger`).values({ key: ctx.key }).execute();
        return { booked: ctx.key };
      }),
    logger: pino({ level: 'silent' }),
    handleSignals: false,
  });
  producer = new IdempotentProducer({ queue: QUEUE, connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  queue = new Queue(QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
});
afterAll(async () => {
  await worker?.stop();
  await producer?.close();
  await queue?.close();
  await env?.teardown();
});

const ledgerRows = async (key: string) => (await env.db.selectFrom(`${env.schema}.ledger`).select('id').where('key', '=', key).execute()).length;

async function completed(key: string): Promise<string> {
  const { jobId } = await producer.enqueue({ name: 'book', key, data: {} });
  expect((await waitForJobState(queue, jobId, ['completed', 'failed'])).state).toBe('completed');
  return jobId;
}

function reconciler(windowMs = 3_600_000) {
  return new VanishedKeyReconciler({ queue: QUEUE, connection: { url: env.redisUrl }, prefix: env.redisPrefix, db: env.db, schema: env.schema, windowMs, pageSize: 2 });
}

describe('VanishedKeyReconciler', () => {
  it('sends again exactly the completed jobs whose key vanished or lost its completion; each effect ends up once', async () => {
    for (const key of ['kept', 'vanished', 'unfinished', 'held', 'also-kept']) await completed(key);
    // What the failover lost: "vanished" whole (key row and effect), "unfinished" its completion
    // and effect (the claim had reached the standby; its lease has run out).
    await sql`delete from ${sql.id(env.schema, 'idempotency_keys')} where key = 'vanished'`.execute(env.db);
    await sql`delete from ${sql.id(env.schema, 'ledger')} where key in ('vanished', 'unfinished')`.execute(env.db);
    await sql`update ${sql.id(env.schema, 'idempotency_keys')}
                 set status = 'processing', locked_until = now() - interval '1 second', result = null, completed_at = null
               where key = 'unfinished'`.execute(env.db);
    // A live lease: some worker holds the key now; not the reconciler's to touch.
    await sql`update ${sql.id(env.schema, 'idempotency_keys')}
                 set status = 'processing', locked_until = now() + interval '1 hour', result = null, completed_at = null
               where key = 'held'`.execute(env.db);

    const each = reconciler();
    const report = await each.run().finally(() => each.close());
    expect(report.checked).toBe(5);
    expect(report.vanished.map(({ key, found }) => ({ key, found })).sort((a, b) => a.key.localeCompare(b.key))).toEqual([
      { key: 'unfinished', found: 'unfinished' },
      { key: 'vanished', found: 'missing' },
    ]);
    expect(report).toMatchObject({ reenqueued: 2, skipped: 0 });

    await waitFor('the re-sent jobs to complete', async () =>
      (await env.db.selectFrom(`${env.schema}.idempotency_keys`).select('status').where('key', 'in', ['vanished', 'unfinished']).where('status', '=', 'completed').execute()).length === 2 || undefined,
    );
    expect({ kept: await ledgerRows('kept'), vanished: await ledgerRows('vanished'), unfinished: await ledgerRows('unfinished'), held: await ledgerRows('held') }).toEqual({
      kept: 1,
      vanished: 1,
      unfinished: 1,
      // Its effect stayed; the reconciler left it to its (pretend) owner.
      held: 1,
    });
    expect(await queue.getJobCounts('failed')).toEqual({ failed: 0 });

    // A second pass finds nothing more to do.
    const again = reconciler();
    const second = await again.run().finally(() => again.close());
    expect(second.vanished.filter((v) => v.key !== 'held')).toEqual([]);
    expect(second.reenqueued).toBe(0);
  }, 60_000);

  it('leaves alone a job whose own retention ended: its key was deleted by design, not lost', async () => {
    const { jobId } = await producer.enqueue({ name: 'book', key: 'kept-briefly', data: {}, retention: { resultMs: 1_000 } });
    expect((await waitForJobState(queue, jobId, ['completed', 'failed'])).state).toBe('completed');
    await new Promise((resolve) => setTimeout(resolve, 1_100));
    // The janitor's deletion, as it makes it: the key goes, its effect stays.
    await sql`delete from ${sql.id(env.schema, 'idempotency_keys')} where key = 'kept-briefly'`.execute(env.db);
    const each = reconciler();
    const report = await each.run().finally(() => each.close());
    expect(report.vanished.map((v) => v.key)).not.toContain('kept-briefly');
    expect(await ledgerRows('kept-briefly')).toBe(1);
  });

  it('leaves coalescing jobs alone: their keys are their generations, which their data does not name', async () => {
    for (const v of [1, 2]) {
      const { jobId } = await producer.enqueue({ name: 'book', key: 'coalesced-account', data: { v }, coalesce: true });
      expect((await waitForJobState(queue, jobId, ['completed', 'failed'])).state).toBe('completed');
    }
    const each = reconciler();
    const report = await each.run().finally(() => each.close());
    expect(report.vanished.map((v) => v.key)).not.toContain('coalesced-account');
    expect(report.reenqueued).toBe(0);
    expect(await ledgerRows('coalesced-account#1')).toBe(1);
    expect(await ledgerRows('coalesced-account#2')).toBe(1);
  });

  it('leaves alone a job completed before its window', async () => {
    await completed('old');
    await sql`delete from ${sql.id(env.schema, 'idempotency_keys')} where key = 'old'`.execute(env.db);
    await new Promise((resolve) => setTimeout(resolve, 50));
    const each = reconciler(10);
    const report = await each.run().finally(() => each.close());
    expect(report.vanished.map((v) => v.key)).not.toContain('old');
    expect(report.reenqueued).toBe(0);
  });
});
