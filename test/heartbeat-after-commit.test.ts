// @module-tag redis
/**
 * A job's lease heartbeat stops when its key is settled: once the effect's transaction has
 * committed, the key is completed and an extension finds no lease to extend, which is the job's
 * own success, not a lost lease. A heartbeat still ticking then reported `lease-lost` (a metric
 * operators alert on) and aborted the handler's signal while it finished its work.
 */
import { randomUUID } from 'node:crypto';
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createIdempotentWorker, createPostgresDb, IdempotencyKeys, type WorkerEvent } from '../src/index.js';
import { createEffectsTable, effectsOf } from './support/protocol-fixtures.js';
import { waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let queue: Queue;
const QUEUE = 'heartbeat';

beforeAll(async () => {
  env = await createTestEnv('heartbeat_after_commit');
  await createEffectsTable(env.db, env.schema);
  queue = new Queue(QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
});
afterAll(async () => {
  await queue?.close();
  await env?.teardown();
});

it('reports no lease loss and leaves the signal alone while a handler finishes after its transaction committed', async () => {
  const db = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 4, applicationName: 'test:heartbeat' });
  const keys = new IdempotencyKeys({ db, schema: env.schema, leaseMs: 1_000 });
  const abortedAfterCommit: boolean[] = [];
  const worker = createIdempotentWorker<{ n: number }>({
    queue: QUEUE,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    keys,
    leaseMs: 1_000,
    heartbeatMs: 50,
    logger: pino({ level: 'silent' }),
    handler: async (ctx) => {
      const result = await ctx.transaction(async (tx) => {
        await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, 'w')`.execute(tx);
        return { n: ctx.data.n };
      });
      // Work after the commit (a notification, say), spanning several heartbeat periods.
      await new Promise((resolve) => setTimeout(resolve, 400));
      abortedAfterCommit.push(ctx.signal.aborted);
      return result;
    },
  });
  const events: WorkerEvent[] = [];
  worker.on('event', (event) => events.push(event));
  try {
    const key = `after-commit-${randomUUID()}`;
    const job = await queue.add('pay', { idempotencyKey: key, scope: 's', payload: { n: 1 } });
    const { state } = await waitForJobState(queue, job.id!, ['completed', 'failed'], 20_000);
    expect(state).toBe('completed');
    expect(abortedAfterCommit).toEqual([false]);
    expect(events.map((e) => e.kind).filter((kind) => kind === 'lease-lost')).toEqual([]);
    expect(await effectsOf(env.db, env.schema, 's', key)).toHaveLength(1);
  } finally {
    await worker.close({ force: true });
    await db.destroy();
  }
});
