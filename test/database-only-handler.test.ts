// @module-tag redis
/**
 * Database-only handlers (`{ transaction: async (tx, ctx) => result }`): the fast path and group
 * commit are their default, each turned off by `fastPath: false` / `groupCommit: false` (and
 * FAST_PATH=false / GROUP_COMMIT=false); function handlers keep theirs.
 *
 * What the tests observe, on the rows themselves: the fast path claims, runs and completes a key
 * in one transaction, so its row's `created_at` equals its `updated_at` (`now()` is the
 * transaction's start), where a leased claim commits before the effect and its completion
 * updates the row later; group commit puts
 * several jobs' effects in one transaction, so their rows share a `txid_current()`.
 */
import { Queue, UnrecoverableError } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, IdempotencyKeys, KeyedJobRunner, ValidationError, createIdempotentWorker, databaseOnly, type DatabaseOnlyContext, type IdempotencyOptions, type IdempotentWorker, type IdempotentWorkerOptions, type JobHandler } from '../src/index.js';
import { groupCommitFromEnv, loadEnvConfig, startWorkerProcess, type WorkerProcess } from '../src/process/index.js';
import { resolveWorkerTiming } from '../src/consumer/worker-timing.js';
import { type DatabaseOnlyJobContext, type DatabaseOnlyJobHandler } from '../src/bullmq/idempotent-worker.js';
import { waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

interface Payload {
  readonly n: number;
  /** Throw (for good) instead of writing. */
  readonly fail?: boolean;
}

let env: TestEnv;
const silent = pino({ level: 'silent' });
const workers: IdempotentWorker<any, any>[] = [];
const processes: WorkerProcess<any, any>[] = [];
const queues: Queue[] = [];
let queueCount = 0;
/** Jobs per run: enough for several to wait for a group while one runs. */
const JOBS = 16;

beforeAll(async () => {
  env = await createTestEnv('database_only');
  // txid: the transaction that committed the row; no unique key: a second effect is a second row.
  await sql`create table ${sql.id(env.schema, 'ledger')} (
    key text not null, n int not null, txid bigint not null default txid_current())`.execute(env.db);
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((worker) => worker.close({ force: true })));
  await Promise.all(processes.splice(0).map((process) => process.stop()));
  await Promise.all(queues.splice(0).map((queue) => queue.close()));
});
afterAll(async () => {
  await env?.teardown();
});

/** The database-only handler of the tests: one ledger row, its `n` as the result. */
const ledger: DatabaseOnlyJobHandler<Payload, { booked: number }> = {
  transaction: async (tx, ctx) => {
    if (ctx.data.fail) throw new UnrecoverableError(`refused ${ctx.key}`);
    await sql`insert into ${sql.id(env.schema, 'ledger')} (key, n) values (${ctx.key}, ${ctx.data.n})`.execute(tx);
    return { booked: ctx.data.n };
  },
};

/** The same effect as a function handler, in `ctx.transaction`. */
const ledgerFunction: JobHandler<Payload, { booked: number }> = (ctx) =>
  ctx.transaction(async (tx) => {
    await sql`insert into ${sql.id(env.schema, 'ledger')} (key, n) values (${ctx.key}, ${ctx.data.n})`.execute(tx);
    return { booked: ctx.data.n };
  });

function newQueue(): Queue {
  const queue = new Queue(`dbonly-${++queueCount}`, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  queues.push(queue);
  return queue;
}

function startWorker(
  queue: Queue,
  handler: IdempotentWorkerOptions<Payload>['handler'],
  options: { keys?: Partial<IdempotencyOptions>; worker?: Partial<IdempotentWorkerOptions<Payload>> } = {},
) {
  const worker = createIdempotentWorker<Payload>({
    queue: queue.name,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    keys: new IdempotencyKeys({ db: env.db, schema: env.schema, ...options.keys }),
    handler,
    concurrency: 8,
    logger: silent,
    ...options.worker,
  });
  workers.push(worker);
  return worker;
}

/** Adds `count` jobs of new keys (prefix `tag`) and waits until each has finished. */
async function runJobs(queue: Queue, tag: string, count = JOBS, fail: (i: number) => boolean = () => false) {
  const jobs = await queue.addBulk(
    Array.from({ length: count }, (_, i) => ({
      name: 'book',
      data: { idempotencyKey: `${tag}-${i}`, scope: 'dbonly', payload: { n: i, ...(fail(i) && { fail: true }) } },
      opts: { jobId: `${tag}-${i}` },
    })),
  );
  return Promise.all(jobs.map((job) => waitForJobState(queue, job.id!, ['completed', 'failed'])));
}

/**
 * How the keys of `tag` were run: one row per key and effect, with its transaction and whether
 * the key was claimed in it (a fast-path key is written in its effect's transaction alone, so its
 * `updated_at` is its `created_at`; a leased key's completion updates it later).
 */
async function observe(tag: string) {
  const { rows: effects } = await sql<{ key: string; txid: string }>`
    select key, txid from ${sql.id(env.schema, 'ledger')} where key like ${`${tag}-%`} order by key`.execute(env.db);
  const { rows: keys } = await sql<{ key: string; status: string; result: unknown; claimed_in_effect_transaction: boolean }>`
    select key, status, result, created_at = updated_at as claimed_in_effect_transaction
      from ${sql.id(env.schema, 'idempotency_keys')} where scope = 'dbonly' and key like ${`${tag}-%`} order by key`.execute(env.db);
  return {
    effectsPerKey: countBy(effects.map((row) => row.key)),
    transactions: new Set(effects.map((row) => row.txid)).size,
    keys,
    /** Every key claimed in its effect's transaction: the fast path. None: leases. */
    fastPath: keys.every((key) => key.claimed_in_effect_transaction),
    leased: keys.every((key) => !key.claimed_in_effect_transaction),
  };
}

function countBy(values: string[]): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const value of values) counts[value] = (counts[value] ?? 0) + 1;
  return counts;
}

const once = (tag: string, count = JOBS) => Object.fromEntries(Array.from({ length: count }, (_, i) => [`${tag}-${i}`, 1]));

describe('a database-only handler', () => {
  it('runs on the fast path with group commit by default: jobs share transactions, each effect once, results stored and replayed', async () => {
    const queue = newQueue();
    startWorker(queue, ledger);
    const finished = await runJobs(queue, 'default');
    expect(finished.map(({ state }) => state)).toEqual(Array(JOBS).fill('completed'));
    expect(finished.map(({ job }) => job.returnvalue)).toEqual(Array.from({ length: JOBS }, (_, n) => ({ booked: n })));
    const seen = await observe('default');
    expect(seen.effectsPerKey).toEqual(once('default'));
    expect(seen.fastPath).toBe(true);
    expect(seen.transactions).toBeLessThan(JOBS);
    expect(seen.keys.map((key) => [key.status, key.result])).toEqual(
      seen.keys.map((key) => ['completed', { booked: Number(key.key.split('-')[1]) }]),
    );
    // A duplicate (another job of a completed key) replays the stored result; nothing runs.
    const duplicate = await queue.add('book', { idempotencyKey: 'default-3', scope: 'dbonly', payload: { n: 3 } }, { jobId: 'default-3-again' });
    const { job } = await waitForJobState(queue, duplicate.id!, ['completed']);
    expect(job.returnvalue).toEqual({ booked: 3 });
    expect((await observe('default')).effectsPerKey).toEqual(once('default'));
  });

  it('a job that throws in a group fails alone: nothing of it commits, its error is stored; its group-mates commit once', async () => {
    const queue = newQueue();
    startWorker(queue, ledger);
    const finished = await runJobs(queue, 'failing', JOBS, (i) => i === 5);
    expect(finished.map(({ state }) => state)).toEqual(Array.from({ length: JOBS }, (_, i) => (i === 5 ? 'failed' : 'completed')));
    const seen = await observe('failing');
    const { ['failing-5']: failed, ...others } = once('failing');
    expect(failed).toBe(1);
    expect(seen.effectsPerKey).toEqual(others);
    expect(seen.keys.find((key) => key.key === 'failing-5')).toMatchObject({ status: 'failed' });
  });

  it('a job whose statement has a syntax error, with BullMQ\'s single attempt: only its key is failed (with the syntax error); every group-mate completes once', async () => {
    const queue = newQueue();
    const syntax: DatabaseOnlyJobHandler<Payload, { booked: number }> = {
      transaction: async (tx, ctx) => {
        // Kysely compiles an empty `in` list to `in ()`: a syntax error, for job 2 only.
        const keys = ctx.data.n === 2 ? [] : [ctx.key];
        await tx
          .insertInto(`${env.schema}.ledger`)
          .columns(['key', 'n'])
          .expression(tx.selectNoFrom([sql.lit(ctx.key).as('key'), sql.lit(ctx.data.n).as('n')]).where(sql.lit(ctx.key), 'in', keys))
          .execute();
        return { booked: ctx.data.n };
      },
    };
    startWorker(queue, syntax);
    const finished = await runJobs(queue, 'syntax', 5);
    expect(finished.map(({ state }) => state)).toEqual(['completed', 'completed', 'failed', 'completed', 'completed']);
    expect(finished[2]!.job.failedReason).toMatch(/syntax error/);
    const seen = await observe('syntax');
    expect(seen.effectsPerKey).toEqual({ 'syntax-0': 1, 'syntax-1': 1, 'syntax-3': 1, 'syntax-4': 1 });
    expect(seen.keys.map((key) => [key.key, key.status])).toEqual([
      ['syntax-0', 'completed'],
      ['syntax-1', 'completed'],
      ['syntax-2', 'failed'],
      ['syntax-3', 'completed'],
      ['syntax-4', 'completed'],
    ]);
  });

  it('fastPath: false runs it under leases, still grouped', async () => {
    const queue = newQueue();
    startWorker(queue, ledger, { worker: { fastPath: false } });
    await runJobs(queue, 'leased');
    const seen = await observe('leased');
    expect(seen.effectsPerKey).toEqual(once('leased'));
    expect(seen.leased).toBe(true);
    expect(seen.transactions).toBeLessThan(JOBS);
  });

  it('groupCommit: false runs it on the fast path, a transaction per job', async () => {
    const queue = newQueue();
    startWorker(queue, ledger, { keys: { groupCommit: false } });
    await runJobs(queue, 'alone');
    const seen = await observe('alone');
    expect(seen.effectsPerKey).toEqual(once('alone'));
    expect(seen.fastPath).toBe(true);
    expect(seen.transactions).toBe(JOBS);
  });

  it('both off: leases, a transaction per job', async () => {
    const queue = newQueue();
    startWorker(queue, ledger, { keys: { groupCommit: false }, worker: { fastPath: false } });
    await runJobs(queue, 'plain');
    const seen = await observe('plain');
    expect(seen.effectsPerKey).toEqual(once('plain'));
    expect(seen.leased).toBe(true);
    expect(seen.transactions).toBe(JOBS);
  });

  it('sees the job without ctx.transaction and ctx.step, in its type and at run time', async () => {
    const queue = newQueue();
    const contexts: string[][] = [];
    startWorker(
      queue,
      databaseOnly(async (_tx, ctx) => {
        contexts.push(Object.keys(ctx).sort());
        return ctx.job.id;
      }),
    );
    const [finished] = await runJobs(queue, 'ctx', 1);
    expect(finished!.job.returnvalue).toBe('ctx-0');
    expect(contexts).toEqual([['attempt', 'data', 'fence', 'job', 'key', 'message', 'scope', 'signal']]);
    // Type-level: typecheck fails if either ever appears on the database-only contexts.
    const typeOnly = (jobContext: DatabaseOnlyJobContext<Payload>, anyContext: DatabaseOnlyContext<Payload, unknown>) => {
      // @ts-expect-error a database-only job is one transaction already: no ctx.transaction
      void jobContext.transaction;
      // @ts-expect-error nor steps: nothing can be recorded apart from the completion
      void jobContext.step;
      // @ts-expect-error the broker-agnostic context has neither
      void anyContext.transaction;
      // @ts-expect-error the broker-agnostic context has neither
      void anyContext.step;
    };
    expect(typeof typeOnly).toBe('function');
  });

  it('a handler that is neither a function nor { transaction } is refused when the worker is built', () => {
    const queue = newQueue();
    const build = (handler: unknown) => () => startWorker(queue, handler as IdempotentWorkerOptions<Payload>['handler']);
    expect(build({ run: async () => 'no' })).toThrow(ValidationError);
    expect(build({ transaction: 'no' })).toThrow(/handler must be a function \(async \(ctx\) => result\) or a database-only handler/);
    expect(build(undefined)).toThrow(/got undefined/);
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
    const timing = resolveWorkerTiming({}, keys.options.leaseMs);
    expect(() => new KeyedJobRunner({ keys, timing, handler: null as never, identityOf: () => ({}) as never, logger: silent })).toThrow(ValidationError);
  });
});

/** The same, asking `ctx.transaction` to run alone. */
const ledgerFunctionAlone: JobHandler<Payload, { booked: number }> = (ctx) =>
  ctx.transaction(
    async (tx) => {
      await sql`insert into ${sql.id(env.schema, 'ledger')} (key, n) values (${ctx.key}, ${ctx.data.n})`.execute(tx);
      return { booked: ctx.data.n };
    },
    { runsAlone: true },
  );

describe('a function handler', () => {
  it('keeps its leases by default, and its ctx.transaction callbacks share group transactions', async () => {
    const queue = newQueue();
    startWorker(queue, ledgerFunction);
    await runJobs(queue, 'function');
    const seen = await observe('function');
    expect(seen.effectsPerKey).toEqual(once('function'));
    expect(seen.leased).toBe(true);
    expect(seen.transactions).toBeLessThan(JOBS);
  });

  it('ctx.transaction(fn, { runsAlone: true }): a transaction per job', async () => {
    const queue = newQueue();
    startWorker(queue, ledgerFunctionAlone);
    await runJobs(queue, 'function-runs-alone');
    const seen = await observe('function-runs-alone');
    expect(seen.effectsPerKey).toEqual(once('function-runs-alone'));
    expect(seen.leased).toBe(true);
    expect(seen.transactions).toBe(JOBS);
  });

  it('groupCommit: false: a transaction per job', async () => {
    const queue = newQueue();
    startWorker(queue, ledgerFunction, { keys: { groupCommit: false } });
    await runJobs(queue, 'function-ungrouped');
    const seen = await observe('function-ungrouped');
    expect(seen.effectsPerKey).toEqual(once('function-ungrouped'));
    expect(seen.transactions).toBe(JOBS);
  });

  it('ctx.transaction with options it does not take: a TypeError naming them, which the error disposition sees (retried by default); nothing committed', async () => {
    const queue = newQueue();
    const errors: unknown[] = [];
    startWorker(queue, (ctx) => ctx.transaction(async () => 'never', { runAlone: true } as never), { worker: { errorDisposition: (error) => (errors.push(error), 'retry') } });
    const [finished] = await runJobs(queue, 'function-bad-options', 1);
    expect(finished!.state).toBe('failed');
    expect(errors[0]).toBeInstanceOf(TypeError);
    expect(String(errors[0])).toMatch(/unknown option runAlone \(it takes runsAlone\)/);
    const seen = await observe('function-bad-options');
    expect(seen.keys.map((key) => key.status)).not.toContain('completed');
    expect(seen.effectsPerKey).toEqual({});
  });

  it('fastPath: true and groupCommit: true still mean the fast path in groups', async () => {
    const queue = newQueue();
    startWorker(queue, ledgerFunction, { keys: { groupCommit: true }, worker: { fastPath: true } });
    await runJobs(queue, 'function-grouped');
    const seen = await observe('function-grouped');
    expect(seen.effectsPerKey).toEqual(once('function-grouped'));
    expect(seen.fastPath).toBe(true);
    expect(seen.transactions).toBeLessThan(JOBS);
  });

  it('groupCommit: { effects: "database-only" } leaves it alone', async () => {
    const queue = newQueue();
    startWorker(queue, ledgerFunction, { keys: { groupCommit: { effects: 'database-only', maxJobs: 4 } }, worker: { fastPath: true } });
    await runJobs(queue, 'function-alone');
    const seen = await observe('function-alone');
    expect(seen.fastPath).toBe(true);
    expect(seen.transactions).toBe(JOBS);
  });
});

describe('the environment: FAST_PATH and GROUP_COMMIT unset, true or false', () => {
  it('reads them as tri-state and still names a bad value', () => {
    const unset = loadEnvConfig({});
    expect(unset.FAST_PATH).toBeUndefined();
    expect(unset.GROUP_COMMIT).toBeUndefined();
    expect(groupCommitFromEnv(unset)).toEqual({ maxJobs: 32, maxGroups: 2, watchSettings: [], slowJobMs: 1_000, effects: 'database-only' });
    const off = loadEnvConfig({ FAST_PATH: 'false', GROUP_COMMIT: 'false' });
    expect([off.FAST_PATH, off.GROUP_COMMIT]).toEqual([false, false]);
    expect(groupCommitFromEnv(off)).toBe(false);
    const on = loadEnvConfig({ FAST_PATH: 'true', GROUP_COMMIT: 'yes', GROUP_COMMIT_MAX_JOBS: '8', GROUP_COMMIT_WATCH_SETTINGS: 'app.tenant, app.user_id', GROUP_COMMIT_SLOW_JOB_MS: '250' });
    expect([on.FAST_PATH, on.GROUP_COMMIT]).toEqual([true, true]);
    expect(groupCommitFromEnv(on)).toEqual({ maxJobs: 8, maxGroups: 2, watchSettings: ['app.tenant', 'app.user_id'], slowJobMs: 250, effects: 'all' });
    expect(() => loadEnvConfig({ GROUP_COMMIT_SLOW_JOB_MS: '0' })).toThrow(/GROUP_COMMIT_SLOW_JOB_MS/);
    expect(() => loadEnvConfig({ GROUP_COMMIT_WATCH_SETTINGS: 'tenant' })).toThrow(/GROUP_COMMIT_WATCH_SETTINGS: must be custom setting names/);
    // A setting that no longer exists is refused, saying what to do, rather than ignored.
    expect(() => loadEnvConfig({ GROUP_COMMIT_OPTIMISTIC: 'false' })).toThrow(/GROUP_COMMIT_OPTIMISTIC: no longer used.*remove it/);
    expect(groupCommitFromEnv(loadEnvConfig({ GROUP_COMMIT_GROUPS: '1' }))).toMatchObject({ maxGroups: 1, effects: 'database-only' });
    expect(() => loadEnvConfig({ GROUP_COMMIT: 'maybe' })).toThrow(ConfigError);
    expect(() => loadEnvConfig({ GROUP_COMMIT: 'maybe' })).toThrow(/GROUP_COMMIT: .*"maybe"/);
    expect(() => loadEnvConfig({ FAST_PATH: 'on' })).toThrow(/FAST_PATH: .*"on"/);
  });

  /** A worker process (startWorkerProcess, as the CLI worker starts it) from this environment. */
  async function startProcess(queue: Queue, handler: JobHandler<Payload> | DatabaseOnlyJobHandler<Payload>, extra: Record<string, string> = {}) {
    const config = loadEnvConfig({
      DATABASE_URL: env.databaseUrl,
      DATABASE_DIRECT_URL: env.databaseDirectUrl,
      REDIS_URL: env.redisUrl,
      REDIS_PREFIX: env.redisPrefix,
      SCHEMA: env.schema,
      QUEUE: queue.name,
      CONCURRENCY: '8',
      MIGRATE: 'false',
      JANITOR_ENABLED: 'false',
      SWEEPER_ENABLED: 'false',
      ...extra,
    });
    const started = await startWorkerProcess({ config, handler, logger: silent, handleSignals: false });
    processes.push(started);
    return started;
  }

  it('unset: a database-only handler runs on the fast path, grouped', async () => {
    const queue = newQueue();
    await startProcess(queue, ledger);
    await runJobs(queue, 'env-default');
    const seen = await observe('env-default');
    expect(seen.effectsPerKey).toEqual(once('env-default'));
    expect(seen.fastPath).toBe(true);
    expect(seen.transactions).toBeLessThan(JOBS);
  });

  it('FAST_PATH=false and GROUP_COMMIT=false: leases, a transaction per job', async () => {
    const queue = newQueue();
    await startProcess(queue, ledger, { FAST_PATH: 'false', GROUP_COMMIT: 'false' });
    await runJobs(queue, 'env-off');
    const seen = await observe('env-off');
    expect(seen.effectsPerKey).toEqual(once('env-off'));
    expect(seen.leased).toBe(true);
    expect(seen.transactions).toBe(JOBS);
  });

  it('GROUP_COMMIT=false alone: the fast path, a transaction per job', async () => {
    const queue = newQueue();
    await startProcess(queue, ledger, { GROUP_COMMIT: 'false' });
    await runJobs(queue, 'env-alone');
    const seen = await observe('env-alone');
    expect(seen.fastPath).toBe(true);
    expect(seen.transactions).toBe(JOBS);
  });

  it.each<{ setting: string; env: Record<string, string>; tag: string; grouped: boolean }>([
    { setting: 'unset', env: {}, tag: 'env-function', grouped: true },
    { setting: 'GROUP_COMMIT=false', env: { GROUP_COMMIT: 'false' }, tag: 'env-function-ungrouped', grouped: false },
  ])('$setting: a function handler keeps leases; its ctx.transaction callbacks grouped: $grouped', async ({ env: extra, tag, grouped }) => {
    const queue = newQueue();
    await startProcess(queue, ledgerFunction, extra);
    await runJobs(queue, tag);
    const seen = await observe(tag);
    expect(seen.effectsPerKey).toEqual(once(tag));
    expect(seen.leased).toBe(true);
    if (grouped) expect(seen.transactions).toBeLessThan(JOBS);
    else expect(seen.transactions).toBe(JOBS);
  });
});
