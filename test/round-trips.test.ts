// @module-tag redis
/** Postgres round trips per protocol operation, counted at the driver (not guessed). */
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, createIdempotentWorker, isHeld, type JobHandler } from '../src/index.js';
import { type DatabaseOnlyJobHandler } from '../src/bullmq/idempotent-worker.js';
import { createCountingDb } from './support/counting-db.js';
import { createEffectsTable, insertEffect } from './support/protocol-fixtures.js';
import { waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let counting: ReturnType<typeof createCountingDb>;
let keys: IdempotencyKeys;
/** Over a plain Kysely instance (not made by createPostgresDb): no statement shares a round trip. */
let plainCounting: ReturnType<typeof createCountingDb>;
let plainKeys: IdempotencyKeys;
const scope = 'rt';

beforeAll(async () => {
  env = await createTestEnv('round_trips');
  await createEffectsTable(env.db, env.schema);
  counting = createCountingDb(env.databaseUrl, 'library', env.preparedStatements);
  keys = new IdempotencyKeys({ db: counting.db, schema: env.schema });
  await sql`select 1`.execute(counting.db); // open a connection outside the counts
  plainCounting = createCountingDb(env.databaseUrl, 'plain');
  plainKeys = new IdempotencyKeys({ db: plainCounting.db, schema: env.schema });
  await sql`select 1`.execute(plainCounting.db);
});
afterAll(async () => {
  await counting?.db.destroy();
  await plainCounting?.db.destroy();
  await env?.teardown();
});

describe('round trips', () => {
  it('every claim outcome costs one round trip when uncontended', async () => {
    const fp = keys.fingerprint({ a: 1 });
    const fresh = await counting.count(() => keys.claim(scope, 'k1', fp));
    const inProgress = await counting.count(() => keys.claim(scope, 'k1', fp));
    const reused = await counting.count(() => keys.claim(scope, 'k1', keys.fingerprint({ a: 2 })));
    const claim = await keys.claim(scope, 'k2', fp);
    if (!isHeld(claim)) throw new Error('expected to hold k2');
    await keys.runEffect(claim, async () => 'done');
    const replay = await counting.count(() => keys.claim(scope, 'k2', fp));
    const counts = { fresh: fresh.roundTrips, inProgress: inProgress.roundTrips, reused: reused.roundTrips, replay: replay.roundTrips };
    console.log('round trips per claim:', JSON.stringify(counts));
    expect(counts).toEqual({ fresh: 1, inProgress: 1, reused: 1, replay: 1 });
  });

  it('the leased effect boundary: 2 round trips (BEGIN rides with the effect, the completion with the COMMIT); the fast path 3', async () => {
    const { leased, fast } = await effectBoundaries(keys, counting, 'k3', 'k4');
    expect(leased.statements).toHaveLength(2);
    expect(leased.statements[0]).toMatch(/^begin isolation level read committed;\ninsert into /);
    expect(leased.statements[1]).toMatch(/^select .*complete_key\(.*;\s*commit$/s);
    expect(fast.statements).toHaveLength(3);
    expect(fast.statements[0]).toMatch(/^begin isolation level read committed;\s*select .*claim_new_key"\(/s);
    expect(fast.statements[1]).toMatch(/^insert into /);
    expect(fast.statements[2]).toMatch(/^select .*store_fast_path_result\(.*;\s*commit$/s);
  });

  it('over a Kysely instance not made by createPostgresDb, nothing is pipelined: every statement goes alone, 4 and 5 round trips', async () => {
    const { leased, fast } = await effectBoundaries(plainKeys, plainCounting, 'k5', 'k6');
    expect(leased.statements.map((s) => s.split(/\s+/)[0])).toEqual(['begin', 'insert', 'select', 'commit']);
    expect(fast.statements.map((s) => s.split(/\s+/)[0])).toEqual(['begin', 'select', 'insert', 'select', 'commit']);
  });
});

describe('round trips of a worker job (claim to completion)', () => {
  const effect = (key: string, fence: number) => (tx: Parameters<typeof insertEffect>[0]) => insertEffect(tx, env.schema, { scope, key, fence, worker: 'w' });

  it('by default, ctx.transaction joins a group: claim 1 + the group\'s 2 (BEGIN with the effect; the state check, the fenced completion and the COMMIT)', async () => {
    const job = withoutProbes(await countJobWith('w0', async (ctx) => ctx.transaction(async (tx) => (await effect(ctx.key, ctx.fence)(tx), 'ok'))));
    expect(job).toHaveLength(3);
    expect(job[0]).toMatch(/claim_keys?"?\(/);
    expect(job[1]).toMatch(/^begin isolation level read committed;\nselect pg_catalog\.set_config\('idempotent_jobs\.group_state', .*;\ninsert into /s);
    expect(job[2]).toMatch(/group_state_differs\(.*;\nselect .*complete_key\(.*;\ncommit$/s);
  });
});

/** The same jobs with group commit off: each ctx.transaction in a transaction of its own. */
describe('round trips of a worker job alone (groupCommit: false)', () => {
  const effect = (key: string, fence: number) => (tx: Parameters<typeof insertEffect>[0]) => insertEffect(tx, env.schema, { scope, key, fence, worker: 'w' });
  const countJob = (key: string, handler: JobHandler, opts: { attempts?: number } = {}) => countJobWith(key, handler, opts, { groupCommit: false });

  it('a handler that calls no step pays nothing for steps: claim 1 + effect boundary 2', async () => {
    const job = await countJob('w1', async (ctx) => ctx.transaction(async (tx) => (await effect(ctx.key, ctx.fence)(tx), 'ok')));
    expect(job.statements).toHaveLength(3);
    expect(job.statements[0]).toMatch(/claim_keys?"?\(/);
    expect(job.statements[1]).toMatch(/^begin isolation level read committed;\ninsert into /);
    expect(job.statements[2]).toMatch(/complete_key\(.*;\s*commit$/s);
    expect(job.statements.join('\n')).not.toMatch(/job_steps|_step\(/);
  });

  it('steps on a first claim: a database step costs its own statements (record with the COMMIT), an external step 1 (its start, carrying the record before it), no read of steps', async () => {
    const job = await countJob('w2', async (ctx) => {
      await ctx.step('reserve', { transaction: async (tx) => (await effect(`${ctx.key}/reserve`, ctx.fence)(tx), 'reserved') });
      await ctx.step('charge', async () => 'charged');
      return ctx.transaction(async (tx) => (await effect(ctx.key, ctx.fence)(tx), 'ok'));
    });
    expect(briefOf(job.statements)).toEqual(['claim_key', 'begin', 'record_step commit', 'start_step', 'begin record_step commit begin', 'complete_key commit']);
    // The charge's record commits on its own, ahead of the completion's BEGIN, in the round trip of its first statement.
    expect(job.statements[4]).toMatch(/^begin;\s*select .*record_step\(.*;\s*commit;\s*begin isolation level read committed;\s*insert into /s);
  });

  it('three external steps cost one round trip each: each start carries the record of the step before, the completion the last one', async () => {
    const handler: JobHandler = async (ctx) => {
      const a = await ctx.step('a', async () => 1);
      const b = await ctx.step('b', async () => a + 1);
      const c = await ctx.step('c', async () => b + 1);
      return ctx.transaction(async (tx) => (await effect(ctx.key, ctx.fence)(tx), c));
    };
    const withSteps = await countJob('w4', handler);
    const without = await countJob('w5', async (ctx) => ctx.transaction(async (tx) => (await effect(ctx.key, ctx.fence)(tx), 3)));
    expect(briefOf(withSteps.statements)).toEqual(['claim_key', 'start_step', 'record_step start_step', 'record_step start_step', 'begin record_step commit begin', 'complete_key commit']);
    expect(withSteps.roundTrips - without.roundTrips).toBe(3);
    const rows = await sql<{ name: string; recorded: boolean }>`
      select name, recorded_at is not null as recorded from ${sql.id(env.schema, 'job_steps')} where scope = ${scope} and key = 'w4' order by position`.execute(env.db);
    expect(rows.rows).toEqual([
      { name: 'a', recorded: true },
      { name: 'b', recorded: true },
      { name: 'c', recorded: true },
    ]);
  });

  it('an external step then a database step: the database step carries the record in front of its own transaction, no round trip of its own', async () => {
    const job = await countJob('w6', async (ctx) => {
      await ctx.step('charge', async () => 'charged');
      await ctx.step('ledger', { transaction: async (tx) => (await effect(`${ctx.key}/ledger`, ctx.fence)(tx), 'written') });
      return ctx.transaction(async (tx) => (await effect(ctx.key, ctx.fence)(tx), 'ok'));
    });
    expect(briefOf(job.statements)).toEqual(['claim_key', 'start_step', 'begin record_step commit begin', 'record_step commit', 'begin', 'complete_key commit']);
  });

  it('a run after a takeover reads the recorded steps once, at its first ctx.step, and replays them without a statement', async () => {
    const job = await countJob(
      'w3',
      async (ctx) => {
        await ctx.step('reserve', { transaction: async (tx) => (await effect(`${ctx.key}/reserve`, ctx.fence)(tx), 'reserved') });
        await ctx.step('charge', async () => 'charged');
        if (ctx.fence === 1) throw new Error('transient');
        return ctx.transaction(async (tx) => (await effect(ctx.key, ctx.fence)(tx), 'ok'));
      },
      { attempts: 2 },
    );
    const brief = job.statements.map((s) => (s.match(/(claim_keys?|record_step|start_step|complete_key|begin|job_steps|update)/) ?? ['?'])[0]);
    // First attempt: claim, two steps, release; the handler threw with the charge's record held,
    // so it goes alone before the release. Second: claim, one read of the steps, completion.
    expect(brief).toEqual(['claim_key', 'begin', 'record_step', 'start_step', 'record_step', 'update', 'claim_key', 'job_steps', 'begin', 'complete_key']);
  });
});

describe('round trips of a database-only handler\'s job ({ transaction })', () => {
  const handler: DatabaseOnlyJobHandler = {
    transaction: async (tx, ctx) => (await insertEffect(tx, env.schema, { scope, key: ctx.key, fence: ctx.fence, worker: 'w' }), 'ok'),
  };

  it('by default, the fast path in a group: BEGIN with the effect, then the key written completed with the COMMIT; no claim, no lease', async () => {
    const job = withoutProbes(await countJobWith('d1', handler));
    expect(job).toHaveLength(2);
    // The group keeps its watched settings with its BEGIN and checks them before its COMMIT.
    expect(job[0]).toMatch(/^begin isolation level read committed;\nselect pg_catalog\.set_config\('idempotent_jobs\.group_state', .*;\ninsert into /s);
    expect(job[1]).toMatch(/^select .*group_state_differs\(.*;\nselect .*insert_completed_keys\(.*\);\ncommit$/s);
    expect(job.join('\n')).not.toMatch(/claim_(new_)?keys?"?\(|complete_key|savepoint/);
  });

  it('groupCommit: false: the fast path in a transaction of its own (claimed completed, the effect, the result with the COMMIT)', async () => {
    const job = withoutProbes(await countJobWith('d2', handler, {}, { groupCommit: false }));
    expect(job).toHaveLength(3);
    expect(job[0]).toMatch(/^begin isolation level read committed;\s*select .*claim_new_key"\(/s);
    expect(job[1]).toMatch(/^insert into /);
    expect(job[2]).toMatch(/^select .*store_fast_path_result\(.*;\s*commit$/s);
  });

  it('fastPath: false: a leased claim, then the effect and the fenced completion', async () => {
    const job = await countJobWith('d3', handler, {}, { groupCommit: false }, { fastPath: false });
    expect(briefOf(job.statements)).toEqual(['claim_key', 'begin', 'complete_key commit']);
  });
});

/**
 * A job's statements without the fast path's settled-key probe, which only some jobs make (it
 * is adaptive: one job in 16 while few keys are found settled).
 */
function withoutProbes(job: { statements: string[] }): string[] {
  // Also without the reads a store's first group makes once (see group-settings.ts): the custom
  // settings, and whether the database's code can leave state.
  return job.statements.filter((s) => !/^select k\.scope, k\.key, k\.status/.test(s) && !/pg_db_role_setting|library_schemas/.test(s));
}

/**
 * Each round trip in brief: its transaction control and the step and key functions it calls,
 * in order (`begin record_step commit begin` is a record committing on its own ahead of a
 * transaction whose BEGIN went in the same string).
 */
function briefOf(statements: readonly string[]): string[] {
  return statements.map((s) =>
    s
      .split(/;\s*/)
      .flatMap((part) => part.match(/^(begin|commit)\b/)?.[1] ?? part.match(/(claim_keys?|record_step|start_step|complete_key)"?\(/)?.[1] ?? [])
      .join(' '),
  );
}

/**
 * Runs one job through a worker over the counting instance and counts its round trips, from the
 * add to the completion. `keyOptions` and `workerOptions` add to the keys' and the worker's.
 */
async function countJobWith(
  key: string,
  handler: JobHandler | DatabaseOnlyJobHandler,
  opts: { attempts?: number } = {},
  keyOptions: { groupCommit?: false } = {},
  workerOptions: { fastPath?: boolean } = {},
) {
  const connection = { url: env.redisUrl };
  const queue = new Queue('round-trips', { connection, prefix: env.redisPrefix });
  // A long lease: no heartbeat during the count.
  const workerKeys = new IdempotencyKeys({ db: counting.db, schema: env.schema, leaseMs: 120_000, ...keyOptions });
  const worker = createIdempotentWorker({
    queue: 'round-trips',
    connection,
    prefix: env.redisPrefix,
    keys: workerKeys,
    handler,
    logger: pino({ level: 'silent' }),
    ...workerOptions,
  });
  try {
    await worker.waitUntilReady();
    const counted = await counting.count(async () => {
      const job = await queue.add('job', { idempotencyKey: key, scope, payload: {} }, opts);
      await waitForJobState(queue, job.id!, ['completed']);
    });
    console.log(`worker job ${key}: ${counted.roundTrips} round trips: ${counted.statements.map((s) => s.split(/\s+/).slice(0, 4).join(' ')).join(' | ')}`);
    return counted;
  } finally {
    await worker.close();
    await queue.close();
  }
}

/** Counts one leased effect boundary (after its claim) and one fast-path execution, each with one effect statement. */
async function effectBoundaries(k: IdempotencyKeys, c: ReturnType<typeof createCountingDb>, leasedKey: string, fastKey: string) {
  const fp = k.fingerprint({ b: 1 });
  const claim = await k.claim(scope, leasedKey, fp);
  if (!isHeld(claim)) throw new Error(`expected to hold ${leasedKey}`);
  const leased = await c.count(() => k.runEffect(claim, (tx) => insertEffect(tx, env.schema, { scope, key: leasedKey, fence: claim.fence, worker: 't' }).then(() => 'ok')));
  const fast = await c.count(() =>
    k.executeOnce(scope, fastKey, fp, (tx, held) => insertEffect(tx, env.schema, { scope, key: fastKey, fence: held.fence, worker: 't' }).then(() => 'ok')),
  );
  const brief = (statements: string[]) => statements.map((s) => s.split(/\s+/).slice(0, 3).join(' ')).join(' | ');
  console.log(`leased effect boundary: ${leased.roundTrips} round trips: ${brief(leased.statements)}`);
  console.log(`fast path: ${fast.roundTrips} round trips: ${brief(fast.statements)}`);
  return { leased, fast };
}
