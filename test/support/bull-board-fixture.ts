/**
 * The jobs the Bull Board tests look at, settled by a real worker on a queue of the test's own:
 * `order-1` run twice (job `a` runs it, with a step; job `b` replays it), a key that is markup
 * (job `h`), a key the janitor deleted leaving its tombstone (job `t`), and on a second queue
 * without a worker, a job waiting (`w`, its key not claimed yet). The keys' scope is the queue's
 * name, so that fixtures of several queues share no key.
 */
import { sql } from 'kysely';
import { pino } from 'pino';
import { IdempotencyKeys, IdempotentProducer, createIdempotentWorker, toWireJobData, type AnyQueue, type IdempotentWorker, type QueueConnectionOptions } from '../../src/index.js';
import { PostgresOperatorStore } from '../../src/store/operator-store.js';
import { createEffectsTable, effectsOf, insertEffect } from './protocol-fixtures.js';
import { waitForJobState } from './queue-helpers.js';
import type { TestEnv } from './test-env.js';

export const HOSTILE_KEY = '<img src=x onerror=alert(1)>';

export interface BoardFixture {
  readonly keys: IdempotencyKeys;
  /** The queue the worker ran (jobs a, b, h, t). */
  readonly queue: AnyQueue;
  /** The queue without a worker (job w). */
  readonly idle: AnyQueue;
  /** The effects committed for `order-1`. */
  effectsOfOrder1(): Promise<number>;
  close(): Promise<void>;
}

export async function boardFixture(env: TestEnv, name: string, connection: QueueConnectionOptions): Promise<BoardFixture> {
  await createEffectsTable(env.db, env.schema);
  const keys = new IdempotencyKeys({ db: env.db, schema: env.schema, retentionMs: 3_600_000 });
  const worker: IdempotentWorker<{ cents: number }> = createIdempotentWorker<{ cents: number }>({
    ...connection,
    queue: name,
    keys,
    logger: pino({ level: 'silent' }),
    handler: async (ctx) => {
      const charge = await ctx.step('charge-card', async () => ({ chargeId: `ch_${ctx.data.cents}` }));
      return ctx.transaction(async (tx) => {
        await insertEffect(tx, env.schema, { scope: ctx.scope, key: ctx.key, fence: ctx.fence, worker: 'board' });
        return { receipt: `r-${ctx.key}`, ...charge };
      });
    },
  });
  // Raw adds under chosen job ids, through a producer's queue (either backend).
  const producer = new IdempotentProducer({ ...connection, queue: name, schema: env.schema });
  const jobs = producer.queue;
  // One after another, so that `a` runs the key and `b` replays it.
  for (const [jobId, key] of [['a', 'order-1'], ['b', 'order-1'], ['h', HOSTILE_KEY], ['t', 'gone-1']] as const) {
    await jobs.add('charge', toWireJobData(name, key, { cents: 1999 }), { jobId });
    const settled = await waitForJobState(jobs as never, jobId, ['completed', 'failed']);
    if (settled.state !== 'completed') throw new Error(`fixture: job ${jobId} ${settled.state}: ${settled.job.failedReason}`);
  }
  await worker.close();
  // The janitor deletes gone-1 after its retention, leaving a tombstone.
  await sql`update ${sql.id(env.schema, 'idempotency_keys')} set expires_at = now() - interval '1 minute' where scope = ${name} and key = 'gone-1'`.execute(env.db);
  await new PostgresOperatorStore(env.db, env.schema).deleteExpiredKeys(10, undefined, 86_400_000);
  const idleProducer = new IdempotentProducer({ ...connection, queue: `${name}-idle`, schema: env.schema });
  const idle = idleProducer.queue;
  await idle.add('charge', toWireJobData(name, 'waiting-1', { cents: 5 }), { jobId: 'w' });
  return {
    keys,
    queue: jobs,
    idle,
    effectsOfOrder1: async () => (await effectsOf(env.db, env.schema, name, 'order-1')).length,
    close: async () => {
      await producer.close();
      await idleProducer.close();
    },
  };
}
