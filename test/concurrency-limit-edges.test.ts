// @module-tag redis
/**
 * Per-key concurrency limits at their edges: a run longer than the lease keeps its slot (on the
 * fast path, whose key is not `processing` while it runs, and after a leased run's commit), a
 * run that loses its slot rolls back instead of committing outside its limit, a freed slot wakes
 * the oldest waiter at once instead of at the end of its backoff, and the janitor deletes slot
 * rows that hold nothing.
 */
import { sql } from 'kysely';
import { pino } from 'pino';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { IdempotencyKeys, KeySettledListener, databaseOnly, type IdempotentWorkerOptions, type WorkerEvent } from '../src/index.js';
import { pgDataLayer } from '../src/pg/index.js';
import { Janitor } from '../src/process/index.js';
import { concurrencyGroupCounts } from '../src/store/sql/concurrency-slots.js';
import { createEffectsTable, effectsOf } from './support/protocol-fixtures.js';
import { sleep, waitForJobState } from './support/queue-helpers.js';
import { LimitedJobs } from './support/limited-jobs.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let listener: KeySettledListener;
let jobs: LimitedJobs;
const LEASE_MS = 1_000;

beforeAll(async () => {
  env = await createTestEnv('concurrency-limit-edges');
  jobs = new LimitedJobs(env);
  await createEffectsTable(env.db, env.schema);
  listener = new KeySettledListener({ connectionString: env.databaseDirectUrl, schema: env.schema });
});
afterEach(() => jobs.closeAll());
afterAll(async () => {
  await listener?.close();
  await env?.teardown();
});

/** Runs of one concurrency key, as the handlers saw them: how many at once at most, and each job's runs. */
class RunLog {
  running = 0;
  most = 0;
  readonly runsOf = new Map<string, number>();
  readonly spans: Array<{ start: number; end: number }> = [];

  async run<T>(key: string, body: () => Promise<T>): Promise<T> {
    this.running++;
    this.most = Math.max(this.most, this.running);
    this.runsOf.set(key, (this.runsOf.get(key) ?? 0) + 1);
    const start = performance.now();
    try {
      return await body();
    } finally {
      this.running--;
      this.spans.push({ start, end: performance.now() });
    }
  }
}

function startWorker<P>(
  queue: string,
  options: Partial<IdempotentWorkerOptions<P, unknown>> & Pick<IdempotentWorkerOptions<P, unknown>, 'handler'>,
  keysOptions: { leaseMs?: number; groupCommit?: boolean } = {},
) {
  return jobs.startWorker<P>(queue, { keys: new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: LEASE_MS, ...keysOptions }), ...options });
}

const addJobs = (queueName: string, scope: string, count: number, limit: { key: string; limit: number }) => jobs.addJobs(queueName, scope, count, limit);
const insertEffect = (tx: any, scope: string, key: string, fence: number) => jobs.insertEffect(tx, scope, key, fence);

describe('a run longer than the lease keeps its slot', () => {
  it('on the fast path (a database-only handler): limit 1, runs of 2.5 leases, never two at once, each job committed once', { timeout: 60_000 }, async () => {
    const runs = new RunLog();
    startWorker<{ n: number }>('edges-fast', {
      handler: {
        transaction: (tx, ctx) =>
          runs.run(ctx.key, async () => {
            await sleep(LEASE_MS * 2.5);
            await insertEffect(tx, ctx.scope, ctx.key, ctx.fence);
            return ctx.data.n;
          }),
      },
    });
    const { queue, ids } = await addJobs('edges-fast', 'fast', 3, { key: 'tenant:fast', limit: 1 });
    for (const id of ids) await waitForJobState(queue, id, ['completed'], 50_000);
    expect(runs.most).toBe(1);
    for (const id of ids) {
      // Group commit runs a job that outran slowJobMs once more, alone, after its grouped run
      // ended (only one run commits): its runs follow each other, in its one slot.
      expect(runs.runsOf.get(id)).toBeGreaterThanOrEqual(1);
      expect(await effectsOf(env.db, env.schema, 'fast', id)).toHaveLength(1);
    }
    expect(await concurrencyGroupCounts(env.db, env.schema, 'tenant:fast')).toEqual({ running: 0, waiting: 0 });
  });

  it('on the leased path, including a handler that goes on past its commit: never two at once', { timeout: 60_000 }, async () => {
    const runs = new RunLog();
    startWorker<{ n: number }>('edges-leased', {
      handler: (ctx) =>
        runs.run(ctx.key, async () => {
          await sleep(LEASE_MS * 1.5);
          const result = await ctx.transaction((tx) => insertEffect(tx, ctx.scope, ctx.key, ctx.fence).then(() => ctx.data.n));
          // Work after the commit is still the run's: the slot is held until the handler returns.
          await sleep(LEASE_MS * 1.5);
          return result;
        }),
    });
    const { queue, ids } = await addJobs('edges-leased', 'leased', 3, { key: 'tenant:leased', limit: 1 });
    for (const id of ids) await waitForJobState(queue, id, ['completed'], 50_000);
    expect(runs.most).toBe(1);
    for (const id of ids) {
      expect(runs.runsOf.get(id)).toBe(1);
      expect(await effectsOf(env.db, env.schema, 'leased', id)).toHaveLength(1);
    }
  });

  it('a fast-path run in a data layer whose slot another run took rolls back and is deferred without using an attempt; it commits once, later', { timeout: 60_000 }, async () => {
    // A data layer's transaction is the handler's, so its slots are rows (the Kysely fast path
    // holds them by its transaction: concurrency-slots-in-transaction.test.ts).
    const events: WorkerEvent[] = [];
    let runsOfStolen = 0;
    const pool = new pg.Pool({ connectionString: env.databaseUrl, max: 4 });
    const worker = startWorker<{ n: number }>('edges-stolen', {
      handler: databaseOnly(pgDataLayer(pool), async (client, ctx: { scope: string; key: string; fence: number; data: { n: number } }) => {
        runsOfStolen++;
        if (runsOfStolen === 1) {
          // Another run takes the slot (as after its time ran out): the next renewal finds it gone.
          await sql`update ${sql.id(env.schema, 'concurrency_slots')} set owner = gen_random_uuid() where group_key = 'tenant:stolen'`.execute(env.db);
          await sleep(LEASE_MS);
        }
        await client.query(`insert into "${env.schema}".effects (scope, key, fence, worker) values ($1, $2, $3, 'w')`, [ctx.scope, ctx.key, ctx.fence]);
        return ctx.data.n;
      }),
    }, { groupCommit: false });
    onTestFinished(() => pool.end());
    worker.on('event', (event: WorkerEvent) => events.push(event));
    const { queue, ids } = await addJobs('edges-stolen', 'stolen', 1, { key: 'tenant:stolen', limit: 1 });
    const { job } = await waitForJobState(queue, ids[0]!, ['completed'], 30_000);
    expect(runsOfStolen).toBe(2);
    expect(job.attemptsMade).toBeLessThanOrEqual(1);
    expect(await effectsOf(env.db, env.schema, 'stolen', ids[0]!)).toHaveLength(1);
    expect(events.some((e) => e.kind === 'store-unavailable' || e.kind === 'deferred')).toBe(true);
  });
});

describe('a freed slot wakes the oldest waiter', () => {
  it('16 jobs of 400 ms at limit 2 on one worker, refused jobs deferred for 20 s each: every one runs long before a deferral could end by itself', { timeout: 60_000 }, async () => {
    // A refused job is deferred for DEFERRAL_MS (no jitter): it comes back on its own only after
    // that. So if the drain ends well within it, the jobs after the first two were woken by the
    // slots their predecessors freed; without wakes it would take at least 7 deferrals.
    const DEFERRAL_MS = 20_000;
    const runs = new RunLog();
    // The listener's connection is opened once per process, at its first use: not a cost of each wake.
    await listener.connect();
    startWorker<{ n: number }>(
      'edges-wake',
      {
        concurrency: 16,
        listener,
        deferMinMs: DEFERRAL_MS,
        deferMaxMs: DEFERRAL_MS,
        deferJitterRatio: 0,
        handler: (ctx) => runs.run(ctx.key, () => sleep(400).then(() => ctx.data.n)),
      },
      { leaseMs: 30_000 },
    );
    const { queue, ids } = await addJobs('edges-wake', 'wake', 16, { key: 'tenant:wake', limit: 2 });
    for (const id of ids) await waitForJobState(queue, id, ['completed'], 50_000);
    expect(runs.most).toBe(2);
    const busyMs = runs.spans.reduce((sum, span) => sum + (span.end - span.start), 0);
    const drainedMs = Math.max(...runs.spans.map((s) => s.end)) - Math.min(...runs.spans.map((s) => s.start));
    // For the log: against the ideal (both slots busy from the first start to the last end).
    console.log(`RATIO drained ${Math.round(drainedMs)} ms, ideal ${Math.round(busyMs / 2)} ms, ratio ${(drainedMs / (busyMs / 2)).toFixed(2)}`);
    expect(drainedMs).toBeLessThan(DEFERRAL_MS);
    expect(await concurrencyGroupCounts(env.db, env.schema, 'tenant:wake')).toEqual({ running: 0, waiting: 0 });
  });
});

describe('the janitor', () => {
  it('deletes slot rows that hold nothing once their time is up past the retention, and keeps those of live runs', async () => {
    const slots = sql.id(env.schema, 'concurrency_slots');
    await sql`insert into ${slots} (group_key, slot, owner, scope, key, acquired_until) values
      ('tenant:gone', 0, gen_random_uuid(), 's', 'dead', now() - interval '2 hours'),
      ('tenant:gone', 1, gen_random_uuid(), 's', 'live', now() + interval '1 minute')`.execute(env.db);
    const janitor = new Janitor({ db: env.db, schema: env.schema, retentionMs: 3_600_000, logger: pino({ level: 'silent' }) });
    const report = await janitor.runOnce();
    expect(report.concurrencySlotsDeleted).toBe(1);
    const { rows } = await sql<{ key: string }>`select key from ${slots} where group_key = 'tenant:gone'`.execute(env.db);
    expect(rows.map((r) => r.key)).toEqual(['live']);
  });
});
