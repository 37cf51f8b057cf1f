// @module-tag redis
/** Multi-step jobs (`ctx.step`): replay, resumption, fencing of step records, the determinism guard. */
import { randomUUID } from 'node:crypto';
import { Queue, UnrecoverableError } from 'bullmq';
import { CompiledQuery, sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, JobSteps, LeaseLostError, ResultNotStorableError, StepMismatchError, StoreUnavailableError, createIdempotentWorker, isHeld, type HeldClaim, type IdempotentWorker, type IdempotentWorkerOptions, type JobContext, type WorkerEvent } from '../src/index.js';
import { stepKeyFor, type StepReport } from '../src/protocol/job-steps.js';
import { type KeyStore, type StepStore } from '../src/store/key-store.js';
import { type HeldRecord } from '../src/store/one-trip-commit.js';
import { Janitor } from '../src/process/index.js';
import { PostgresKeyStore } from '../src/store/postgres-key-store.js';
import { purgeKeys } from '../src/store/sql/purge-keys.js';
import { createEffectsTable, createGate, effectsOf, expireLease, insertEffect } from './support/protocol-fixtures.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let keys: IdempotencyKeys;
let queue: Queue;
const QUEUE = 'steps';
const silent = pino({ level: 'silent' });
const workers: IdempotentWorker<any, any>[] = [];
/** Calls of external steps, by `<key>/<step>`: a repeat shows as a count above 1. */
const calls = new Map<string, number>();

beforeAll(async () => {
  env = await createTestEnv('job_steps');
  await createEffectsTable(env.db, env.schema);
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 60_000 });
  queue = new Queue(QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.close({ force: true })));
});
afterAll(async () => {
  await queue?.close();
  await env?.teardown();
});

function startWorker(options: Partial<IdempotentWorkerOptions<any>> & Pick<IdempotentWorkerOptions<any>, 'handler'>, events?: WorkerEvent[]) {
  const worker = createIdempotentWorker<any>({
    queue: QUEUE,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    keys,
    concurrency: 2,
    logger: silent,
    ...options,
  });
  if (events) worker.on('event', (event) => events.push(event));
  workers.push(worker);
  return worker;
}

/** A job under the wire contract, with an id of its own (a duplicate of the key is another job). */
function add(key: string, opts: Record<string, unknown> = {}) {
  return queue.add('order', { idempotencyKey: key, scope: 'shop', payload: {} }, { jobId: `job-${randomUUID()}`, ...opts });
}

function bump(name: string): number {
  const n = (calls.get(name) ?? 0) + 1;
  calls.set(name, n);
  return n;
}

/** A database step's effect: one row in `effects` under `<key>/<step>` (no unique constraint: a repeat shows). */
const effect = (ctx: JobContext, step: string, tx: Parameters<typeof insertEffect>[0]) =>
  insertEffect(tx, env.schema, { scope: ctx.scope, key: `${ctx.key}/${step}`, fence: ctx.fence, worker: `fence-${ctx.fence}` });

const effectCount = async (key: string, step: string) => (await effectsOf(env.db, env.schema, 'shop', `${key}/${step}`)).length;

async function stepRows(scope: string, key: string) {
  const { rows } = await sql<{ name: string; position: number; fence: string; starts: number; result: unknown; recorded_at: Date | null }>`
    select name, position, fence, starts, result, recorded_at from ${sql.id(env.schema, 'job_steps')}
     where scope = ${scope} and key = ${key} order by position`.execute(env.db);
  return rows.map((r) => ({ name: r.name, position: r.position, fence: Number(r.fence), starts: r.starts, result: r.result, recorded: r.recorded_at !== null }));
}

/**
 * reserve (database) → charge (external) → ledger (database) → completion. `hold` stops the
 * key's first claim after the charge is recorded, until the gate opens.
 */
function paymentHandler(hold?: { reached: () => void; gate: Promise<void> }) {
  return async (ctx: JobContext) => {
    const reserved = await ctx.step('reserve', { transaction: async (tx) => (await effect(ctx, 'reserve', tx), { items: 2 }) });
    const charge = await ctx.step('charge', async (step) => ({ chargeId: step.stepKey, call: bump(`${ctx.key}/charge`), starts: step.starts }));
    if (hold && ctx.fence === 1) {
      hold.reached();
      await hold.gate;
    }
    const ledger = await ctx.step('ledger', { transaction: async (tx) => (await effect(ctx, 'ledger', tx), { entry: ctx.fence }) });
    return ctx.transaction(async (tx) => {
      await effect(ctx, 'complete', tx);
      return { reserved, charge, ledger, fence: ctx.fence };
    });
  };
}

/** Claims `key` and returns the claim, which must be held. */
async function hold(key: string, scope = 'proto'): Promise<HeldClaim> {
  const outcome = await keys.claim(scope, key, keys.fingerprint({ key }));
  if (!isHeld(outcome)) throw new Error(`expected to hold ${key}, got ${outcome.kind}`);
  return outcome;
}

/** The key's lease made to look expired, and the key taken over by a new claim. */
async function takeOver(key: string, scope = 'proto'): Promise<HeldClaim> {
  await expireLease(env.db, env.schema, scope, key);
  const claim = await hold(key, scope);
  expect(claim.kind).toBe('taken-over');
  return claim;
}

const never = new AbortController().signal;

describe('multi-step jobs through the worker', () => {
  it('a worker that dies between steps: the next owner replays the recorded steps without running them and resumes at the next one', async () => {
    const reached = createGate();
    const gate = createGate();
    const eventsA: WorkerEvent[] = [];
    startWorker({ handler: paymentHandler({ reached: reached.open, gate: gate.wait }) }, eventsA);
    const first = await add('resume-1');
    await reached.wait;
    // The charge's record, held back, goes alone while the handler waits (nothing else carries it).
    await waitFor('the charge recorded', async () => eventsA.some((e) => e.kind === 'step-ran' && e.step === 'charge'));
    // The first worker hangs after the charge, as if dead; its lease runs out and a second
    // worker takes the key over through a duplicate job.
    expect((await stepRows('shop', 'resume-1')).map((s) => s.name)).toEqual(['reserve', 'charge']);
    await expireLease(env.db, env.schema, 'shop', 'resume-1');
    startWorker({ handler: paymentHandler() });
    const second = await add('resume-1');
    const done = await waitForJobState(queue, second.id!, ['completed']);
    const result = done.job.returnvalue as { reserved: unknown; charge: { chargeId: string; call: number; starts: number }; ledger: unknown; fence: number };
    expect(result.fence).toBe(2);
    // The charge's result is the one recorded by the first owner: its first and only call.
    expect(result.charge).toEqual({ chargeId: stepKeyFor('shop', 'resume-1', 'charge'), call: 1, starts: 1 });
    expect(result.ledger).toEqual({ entry: 2 });
    expect(calls.get('resume-1/charge')).toBe(1);
    expect(await effectCount('resume-1', 'reserve')).toBe(1);
    expect(await effectCount('resume-1', 'ledger')).toBe(1);
    expect(await effectCount('resume-1', 'complete')).toBe(1);
    expect(await stepRows('shop', 'resume-1')).toEqual([
      { name: 'reserve', position: 1, fence: 1, starts: 1, result: { items: 2 }, recorded: true },
      { name: 'charge', position: 2, fence: 1, starts: 1, result: result.charge, recorded: true },
      { name: 'ledger', position: 3, fence: 2, starts: 1, result: { entry: 2 }, recorded: true },
    ]);

    // The zombie wakes up: it cannot record its ledger step; its job replays the result.
    gate.open();
    const zombie = await waitForJobState(queue, first.id!, ['completed']);
    expect(zombie.job.returnvalue).toEqual(result);
    expect(eventsA.some((e) => e.kind === 'fenced' && e.key === 'resume-1')).toBe(true);
    expect(await effectCount('resume-1', 'ledger')).toBe(1);
  });

  it('a retryable failure in a step releases the key; the next attempt replays the steps before it and runs that step again', async () => {
    startWorker({
      handler: async (ctx: JobContext) => {
        const reserved = await ctx.step('reserve', { transaction: async (tx) => (await effect(ctx, 'reserve', tx), 'reserved') });
        const charged = await ctx.step('charge', async (step) => {
          if (bump(`${ctx.key}/charge`) === 1) throw new Error('provider timed out');
          return { starts: step.starts, fence: step.fence };
        });
        return { reserved, charged };
      },
    });
    const job = await add('retry-1', { attempts: 3 });
    const done = await waitForJobState(queue, job.id!, ['completed']);
    expect(done.job.attemptsMade).toBe(2);
    expect(done.job.returnvalue).toEqual({ reserved: 'reserved', charged: { starts: 2, fence: 2 } });
    expect(await effectCount('retry-1', 'reserve')).toBe(1);
    expect(calls.get('retry-1/charge')).toBe(2);
    expect(await stepRows('shop', 'retry-1')).toMatchObject([
      { name: 'reserve', fence: 1, starts: 1, recorded: true },
      { name: 'charge', fence: 2, starts: 2, recorded: true },
    ]);
  });

  it('a permanent failure in step 2 fails the key with a stored error naming the step; step 1 is not undone or repeated', async () => {
    startWorker({
      handler: async (ctx: JobContext) => {
        await ctx.step('reserve', { transaction: async (tx) => effect(ctx, 'reserve', tx) });
        await ctx.step('charge', async () => {
          throw new UnrecoverableError('card declined');
        });
        return ctx.transaction(async (tx) => effect(ctx, 'complete', tx));
      },
    });
    const job = await add('permanent-1', { attempts: 3 });
    const failed = await waitForJobState(queue, job.id!, ['failed']);
    expect(failed.job.attemptsMade).toBe(1);
    expect(failed.job.failedReason).toContain('at step "charge" (position 2)');
    const record = await keys.get('shop', 'permanent-1');
    expect(record?.status).toBe('failed');
    expect(record?.error).toEqual({ name: 'UnrecoverableError', message: 'Step "charge" (position 2) failed: card declined', step: 'charge' });
    expect(await effectCount('permanent-1', 'reserve')).toBe(1);
    expect(await effectCount('permanent-1', 'complete')).toBe(0);
    // A duplicate replays the failure and runs nothing.
    const duplicate = await add('permanent-1');
    await waitForJobState(queue, duplicate.id!, ['failed']);
    expect(await effectCount('permanent-1', 'reserve')).toBe(1);
  });

  it('a duplicate of a completed key replays its result and runs no step', async () => {
    startWorker({ handler: paymentHandler() });
    const first = await add('duplicate-1');
    const done = await waitForJobState(queue, first.id!, ['completed']);
    const stepsBefore = await stepRows('shop', 'duplicate-1');
    const duplicate = await add('duplicate-1');
    const replayed = await waitForJobState(queue, duplicate.id!, ['completed']);
    expect(replayed.job.returnvalue).toEqual(done.job.returnvalue);
    expect(calls.get('duplicate-1/charge')).toBe(1);
    expect(await effectCount('duplicate-1', 'reserve')).toBe(1);
    expect(await effectCount('duplicate-1', 'ledger')).toBe(1);
    expect(await stepRows('shop', 'duplicate-1')).toEqual(stepsBefore);
  });

  it('the determinism guard: a run whose step differs from the recorded one fails the job unrecoverably, naming the key, the position and both names', async () => {
    startWorker({
      errorDisposition: () => 'retry',
      handler: async (ctx: JobContext) => {
        await ctx.step('a', async () => 'a');
        if (ctx.fence === 1) {
          await ctx.step('b', async () => 'b');
          throw new Error('transient, after b');
        }
        await ctx.step('c', async () => 'c');
        return 'done';
      },
    });
    const job = await add('mismatch-1', { attempts: 5 });
    const failed = await waitForJobState(queue, job.id!, ['failed']);
    // Unrecoverable despite the disposition and the attempts left.
    expect(failed.job.attemptsMade).toBe(2);
    const record = await keys.get('shop', 'mismatch-1');
    expect(record?.status).toBe('failed');
    const stored = record?.error as { code: string; message: string };
    expect(stored.code).toBe('STEP_MISMATCH');
    expect(stored.message).toContain('"mismatch-1"');
    expect(stored.message).toContain('position 2');
    expect(stored.message).toContain('"b"');
    expect(stored.message).toContain('"c"');
    expect((await stepRows('shop', 'mismatch-1')).map((s) => s.name)).toEqual(['a', 'b']);
  });

  it('a transient store fault in a step defers the job without using an attempt; the next run resumes at that step', async () => {
    const events: WorkerEvent[] = [];
    startWorker(
      {
        storeRetryMinMs: 50,
        storeRetryMaxMs: 50,
        handler: async (ctx: JobContext) => {
          await ctx.step('reserve', { transaction: async (tx) => effect(ctx, 'reserve', tx) });
          return ctx.step('charge', async () => {
            if (bump(`${ctx.key}/charge`) === 1) throw new StoreUnavailableError(ctx.scope, ctx.key, 'test read', { cause: new Error('connection reset') });
            return 'charged';
          });
        },
      },
      events,
    );
    const job = await add('fault-1');
    const done = await waitForJobState(queue, job.id!, ['completed']);
    expect(done.job.returnvalue).toBe('charged');
    expect(done.job.attemptsMade).toBe(1);
    expect(events.some((e) => e.kind === 'store-unavailable' && e.key === 'fault-1')).toBe(true);
    expect(await effectCount('fault-1', 'reserve')).toBe(1);
    expect(calls.get('fault-1/charge')).toBe(2);
  });

  it('steps run under group commit: each step is a transaction of its own, the completion is grouped', async () => {
    const grouped = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 60_000, groupCommit: { maxJobs: 4, maxGroups: 1 } });
    startWorker({ keys: grouped, concurrency: 4, handler: paymentHandler() });
    const jobs = await Promise.all(Array.from({ length: 6 }, (_, i) => add(`grouped-${i}`)));
    for (const job of jobs) await waitForJobState(queue, job.id!, ['completed']);
    for (let i = 0; i < 6; i++) {
      for (const step of ['reserve', 'ledger', 'complete']) expect(await effectCount(`grouped-${i}`, step)).toBe(1);
      expect(calls.get(`grouped-${i}/charge`)).toBe(1);
    }
  });

  it('the fast path refuses ctx.step with STEPS_UNSUPPORTED, stored as the key failure', async () => {
    startWorker({
      fastPath: true,
      handler: async (ctx: JobContext) => ctx.step('reserve', async () => 'never'),
    });
    const job = await add('fast-1', { attempts: 3 });
    const failed = await waitForJobState(queue, job.id!, ['failed']);
    expect(failed.job.attemptsMade).toBe(1);
    expect(failed.job.failedReason).toContain('fast path');
    const record = await keys.get('shop', 'fast-1');
    expect(record?.status).toBe('failed');
    expect(record?.error).toMatchObject({ code: 'STEPS_UNSUPPORTED' });
  });
});

describe('step records', () => {
  it("a zombie's records are refused: its database step rolls back, its external step is not started, and a record after a takeover fails", async () => {
    const zombie = await hold('zombie-1');
    const zombieSteps = new JobSteps(keys, zombie, never);
    expect(await zombieSteps.run('first', async () => 'one')).toBe('one');
    const owner = await takeOver('zombie-1');

    let effectRan = false;
    await expect(
      zombieSteps.run('second', {
        transaction: async (tx) => {
          effectRan = true;
          await insertEffect(tx, env.schema, { scope: 'proto', key: 'zombie-1/second', fence: zombie.fence, worker: 'zombie' });
          return 'two';
        },
      }),
    ).rejects.toBeInstanceOf(LeaseLostError);
    expect(effectRan).toBe(true);
    expect(await effectsOf(env.db, env.schema, 'proto', 'zombie-1/second')).toEqual([]);

    let called = false;
    await expect(zombieSteps.run('third', async () => (called = true))).rejects.toBeInstanceOf(LeaseLostError);
    expect(called).toBe(false);

    // The owner replays the zombie's recorded step and runs the rest.
    const ownerSteps = new JobSteps(keys, owner, never);
    expect(await ownerSteps.run('first', async () => 'again')).toBe('one');
    expect(await ownerSteps.run('second', { transaction: async () => 'two' })).toBe('two');
    expect(await stepRows('proto', 'zombie-1')).toMatchObject([
      { name: 'first', fence: 1, recorded: true },
      { name: 'second', fence: 2, recorded: true },
    ]);
  });

  it('an external step whose worker lost the key while it ran is not recorded; the new owner runs it again, and its start count shows the repeat', async () => {
    const zombie = await hold('repeat-1');
    let owner: HeldClaim | undefined;
    const run = new JobSteps(keys, zombie, never).run('email', async (step) => {
      expect(step.starts).toBe(1);
      owner = await takeOver('repeat-1'); // the worker stalls mid-call; its key is taken over
      return 'sent by the zombie';
    });
    await expect(run).rejects.toBeInstanceOf(LeaseLostError);
    expect(await stepRows('proto', 'repeat-1')).toMatchObject([{ name: 'email', fence: 1, starts: 1, recorded: false }]);
    const again = await new JobSteps(keys, owner!, never).run('email', async (step) => `sent, start ${step.starts}, key ${step.stepKey}`);
    expect(again).toBe(`sent, start 2, key ${stepKeyFor('proto', 'repeat-1', 'email')}`);
    expect(await stepRows('proto', 'repeat-1')).toMatchObject([{ name: 'email', fence: 2, starts: 2, recorded: true, result: again }]);
  });

  it('two workers never both record one step: a database step held open while its key is taken over rolls back', async () => {
    const zombie = await hold('race-gate');
    const inside = createGate();
    const release = createGate();
    const zombieRun = new JobSteps(keys, zombie, never).run('pay', {
      transaction: async (tx) => {
        await insertEffect(tx, env.schema, { scope: 'proto', key: 'race-gate/pay', fence: zombie.fence, worker: 'zombie' });
        inside.open();
        await release.wait;
        return 'zombie';
      },
    });
    await inside.wait;
    const owner = await takeOver('race-gate');
    const ownerResult = await new JobSteps(keys, owner, never).run('pay', {
      transaction: async (tx) => (await insertEffect(tx, env.schema, { scope: 'proto', key: 'race-gate/pay', fence: owner.fence, worker: 'owner' }), 'owner'),
    });
    expect(ownerResult).toBe('owner');
    release.open();
    await expect(zombieRun).rejects.toBeInstanceOf(LeaseLostError);
    expect(await effectsOf(env.db, env.schema, 'proto', 'race-gate/pay')).toEqual([{ fence: 2, worker: 'owner' }]);
  });

  it('two workers never both record one step: racing a database step against a takeover, each key has one effect, recorded under its fence', async () => {
    // Five races at a time: each holds up to two of the pool's connections, and a taker left
    // waiting for a connection would always lose.
    const race = async (i: number) => {
      const key = `race-${i}`;
      const zombie = await hold(key);
      const pay = (claim: HeldClaim, who: string) => ({
        transaction: async (tx: Parameters<typeof insertEffect>[0]) => {
          await insertEffect(tx, env.schema, { scope: 'proto', key: `${key}/pay`, fence: claim.fence, worker: who });
          await new Promise((resolve) => setTimeout(resolve, Math.random() * 10));
          return who;
        },
      });
      const [zombieResult, ownerResult] = await Promise.allSettled([
        new JobSteps(keys, zombie, never).run('pay', pay(zombie, 'zombie')),
        (async () => {
          await new Promise((resolve) => setTimeout(resolve, Math.random() * 10));
          const owner = await takeOver(key);
          return new JobSteps(keys, owner, never).run('pay', pay(owner, 'owner'));
        })(),
      ]);
      const effects = await effectsOf(env.db, env.schema, 'proto', `${key}/pay`);
      const [step] = await stepRows('proto', key);
      expect(effects).toHaveLength(1);
      expect(step).toMatchObject({ fence: effects[0]!.fence, result: effects[0]!.worker, recorded: true });
      // The owner always finishes: it ran the step, or replayed the zombie's record.
      expect(ownerResult).toEqual({ status: 'fulfilled', value: effects[0]!.worker });
      if (zombieResult.status === 'rejected') expect(zombieResult.reason).toBeInstanceOf(LeaseLostError);
      return effects[0]!.worker;
    };
    const outcomes: string[] = [];
    for (let batch = 0; batch < 8; batch++) outcomes.push(...(await Promise.all(Array.from({ length: 5 }, (_, i) => race(batch * 5 + i)))));
    console.log(`${outcomes.length} races: ${outcomes.filter((w) => w === 'zombie').length} recorded by the first owner, ${outcomes.filter((w) => w === 'owner').length} by the taker`);
  });

  it('the determinism guard: a different name at a recorded position, a recorded step left out, a name called twice; invalid steps are refused', async () => {
    const first = await hold('guard-1');
    const firstRun = new JobSteps(keys, first, never);
    await firstRun.run('a', async () => 1);
    await firstRun.run('b', async () => 2);

    const other = new JobSteps(keys, await takeOver('guard-1'), never);
    expect(await other.run('a', async () => 0)).toBe(1);
    const mismatch = await other.run('c', async () => 3).catch((error: unknown) => error);
    expect(mismatch).toBeInstanceOf(StepMismatchError);
    expect(mismatch).toMatchObject({ code: 'STEP_MISMATCH', key: 'guard-1', position: 2, recordedName: 'b', calledName: 'c' });
    expect((mismatch as Error).message).toMatch(/"guard-1".*position 2.*"b".*"c"/s);
    // The run stays broken: the recorded step cannot be reached by another path, nor the key completed.
    await expect(other.run('b', async () => 2)).rejects.toBe(mismatch);
    await expect(other.assertComplete()).rejects.toBe(mismatch);

    const skipping = new JobSteps(keys, await takeOver('guard-1'), never);
    await skipping.run('a', async () => 0);
    await expect(skipping.assertComplete()).rejects.toMatchObject({ position: 2, recordedName: 'b', calledName: null });

    const invalid = new JobSteps(keys, await hold('guard-3'), never);
    await expect(invalid.run('', async () => 1)).rejects.toMatchObject({ code: 'INVALID_STEP' });
    await expect(invalid.run('s', { transaction: 'no' } as never)).rejects.toMatchObject({ code: 'INVALID_STEP' });
    await expect(invalid.run('a\u0000b', async () => 1)).rejects.toMatchObject({ code: 'INVALID_STEP' });

    const twice = new JobSteps(keys, await hold('guard-2'), never);
    await twice.run('x', async () => 1);
    await expect(twice.run('x', async () => 1)).rejects.toMatchObject({ code: 'STEP_MISMATCH', position: 2, calledName: 'x' });
  });

  it('a step result goes through the job-result checks: too large or not JSON is refused, and a database step rolls back', async () => {
    const small = new IdempotencyKeys({ db: env.db, schema: env.schema, maxResultBytes: 64 });
    const claim = await hold('limits-1');
    const steps = new JobSteps(small, claim, never);
    await expect(
      steps.run('big', { transaction: async (tx) => (await insertEffect(tx, env.schema, { scope: 'proto', key: 'limits-1/big', fence: 1, worker: 'w' }), 'x'.repeat(100)) }),
    ).rejects.toBeInstanceOf(ResultNotStorableError);
    expect(await effectsOf(env.db, env.schema, 'proto', 'limits-1/big')).toEqual([]);
    await expect(steps.run('bigint', async () => 1n)).rejects.toBeInstanceOf(ResultNotStorableError);
    await expect(steps.run('nul', async () => 'a\u0000b')).rejects.toBeInstanceOf(ResultNotStorableError);
    // The result as stored, on the first run as on replays: a Date comes back as its JSON string.
    expect(await steps.run('dates', async () => ({ at: new Date(0) }))).toEqual({ at: '1970-01-01T00:00:00.000Z' });
    expect(await stepRows('proto', 'limits-1')).toMatchObject([
      { name: 'bigint', recorded: false },
      { name: 'nul', recorded: false },
      { name: 'dates', recorded: true, result: { at: '1970-01-01T00:00:00.000Z' } },
    ]);
  });

  it("a database step's COMMIT whose reply is lost is resolved from the step's record: committed, its result is returned and nothing runs again", async () => {
    const db = env.openDb(2);
    const real = new PostgresKeyStore(db, env.schema);
    let cut = 0;
    const steps: StepStore = {
      ...real.steps,
      recordAndCommit: async (tx, ...rest) => {
        const recorded = await real.steps.recordAndCommit(tx, ...rest);
        // The COMMIT went through; the connection dies before the reply is read.
        if (cut++ === 0) throw await sql`select pg_terminate_backend(pg_backend_pid())`.execute(tx).catch((e: unknown) => e);
        return recorded;
      },
    };
    const store: KeyStore = Object.assign(Object.create(real) as PostgresKeyStore, { steps });
    const faulty = new IdempotencyKeys({ db, schema: env.schema }, store);
    const claim = await hold('lost-reply-1');
    let runs = 0;
    const result = await new JobSteps(faulty, claim, never).run('pay', {
      transaction: async (tx) => {
        runs++;
        await insertEffect(tx, env.schema, { scope: 'proto', key: 'lost-reply-1/pay', fence: claim.fence, worker: 'w' });
        return { paid: true };
      },
    });
    expect(cut).toBe(1);
    expect(result).toEqual({ paid: true });
    expect(runs).toBe(1);
    expect(await effectsOf(env.db, env.schema, 'proto', 'lost-reply-1/pay')).toHaveLength(1);
    expect(await stepRows('proto', 'lost-reply-1')).toMatchObject([{ name: 'pay', fence: 1, recorded: true, result: { paid: true } }]);
  });

  it('steps are deleted with their key, by the janitor and by keys purge', async () => {
    for (const key of ['gone-janitor', 'gone-purge', 'kept']) {
      const claim = await hold(key);
      await new JobSteps(keys, claim, never).run('s', async () => key);
      await keys.runEffect(claim, async () => 'done');
    }
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set expires_at = now() - interval '1 second' where key = 'gone-janitor'`.execute(env.db);
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set completed_at = now() - interval '2 days' where key = 'gone-purge'`.execute(env.db);
    await new Janitor({ db: env.db, schema: env.schema, logger: silent }).runOnce();
    expect(await purgeKeys(env.db, env.schema, 86_400_000, 100)).toBe(1);
    expect(await stepRows('proto', 'gone-janitor')).toEqual([]);
    expect(await stepRows('proto', 'gone-purge')).toEqual([]);
    expect(await stepRows('proto', 'kept')).toHaveLength(1);
    expect(await keys.get('proto', 'gone-janitor')).toBeUndefined();
    expect(await keys.get('proto', 'gone-purge')).toBeUndefined();
  });
});

describe('held step records (holdRecords: the worker holds an external step\'s record for the run\'s next round trip)', () => {
  /** A run that holds records; `flushSoon` never fires unless the test fires it (`flushNow`). */
  function heldRun(claim: HeldClaim, reports: StepReport[] = []) {
    let pending: (() => void) | undefined;
    const steps = new JobSteps(keys, claim, never, (r) => reports.push(r), { holdRecords: true, flushSoon: (flush) => (pending = flush) });
    return { steps, flushNow: () => pending?.() };
  }
  const complete = (claim: HeldClaim, result: unknown) => (record: HeldRecord | undefined) => keys.commitEffect(claim, async () => result, { heldRecord: record });

  it('the record is held until the next round trip, which carries it: the next start, then the completion', async () => {
    const claim = await hold('held-1');
    const reports: StepReport[] = [];
    const { steps } = heldRun(claim, reports);
    expect(await steps.run('a', async () => ({ n: 1, at: new Date(0) }))).toEqual({ n: 1, at: '1970-01-01T00:00:00.000Z' });
    expect(await stepRows('proto', 'held-1')).toMatchObject([{ name: 'a', recorded: false }]);
    expect(reports).toEqual([]);
    await steps.run('b', async () => 2);
    expect(await stepRows('proto', 'held-1')).toMatchObject([
      { name: 'a', recorded: true, result: { n: 1, at: '1970-01-01T00:00:00.000Z' } },
      { name: 'b', recorded: false },
    ]);
    expect(reports).toEqual([{ name: 'a', position: 1, outcome: 'ran', durationMs: expect.any(Number) }]);
    expect(await steps.complete(complete(claim, 'done'))).toBe('done');
    expect(await stepRows('proto', 'held-1')).toMatchObject([
      { name: 'a', recorded: true },
      { name: 'b', recorded: true, result: 2 },
    ]);
    expect(reports.map((r) => `${r.name}:${r.outcome}`)).toEqual(['a:ran', 'b:ran']);
    expect((await keys.get('proto', 'held-1'))?.status).toBe('completed');
  });

  it('a record no round trip picks up goes alone soon after (setImmediate): slow work between steps leaves nothing pending', async () => {
    const claim = await hold('held-soon');
    const reports: StepReport[] = [];
    const steps = new JobSteps(keys, claim, never, (r) => reports.push(r), { holdRecords: true });
    await steps.run('a', async () => 'one');
    await waitFor('the record sent alone', async () => (await stepRows('proto', 'held-soon'))[0]?.recorded);
    expect(reports).toEqual([{ name: 'a', position: 1, outcome: 'ran', durationMs: expect.any(Number) }]);
    // The next start has nothing to carry.
    await steps.run('b', async () => 'two');
    await steps.complete(complete(claim, 'done'));
    expect(await stepRows('proto', 'held-soon')).toMatchObject([
      { name: 'a', recorded: true, starts: 1 },
      { name: 'b', recorded: true, starts: 1 },
    ]);
  });

  it('a crash with a record held: the step started and was never recorded, so the next owner runs it again under its fence (starts 2)', async () => {
    const zombie = await hold('held-crash');
    let charges = 0;
    const charge = async (step: { starts: number; fence: number }) => ({ charge: ++charges, starts: step.starts, fence: step.fence });
    const { steps: dead } = heldRun(zombie);
    expect(await dead.run('charge', charge)).toEqual({ charge: 1, starts: 1, fence: 1 });
    // The process dies here: its flush never fires, no later round trip carries the record.
    expect(await stepRows('proto', 'held-crash')).toMatchObject([{ name: 'charge', fence: 1, starts: 1, recorded: false }]);

    const owner = await takeOver('held-crash');
    const { steps } = heldRun(owner);
    expect(await steps.run('charge', charge)).toEqual({ charge: 2, starts: 2, fence: 2 });
    await steps.complete(complete(owner, 'done'));
    expect(await stepRows('proto', 'held-crash')).toMatchObject([{ name: 'charge', fence: 2, starts: 2, recorded: true, result: { charge: 2, starts: 2, fence: 2 } }]);
  });

  it("a lease lost with a record held: the zombie's record is refused in front of its next step, whose function never runs; a database step's statements never run", async () => {
    const zombie = await hold('held-lost');
    const reports: StepReport[] = [];
    const { steps } = heldRun(zombie, reports);
    await steps.run('charge', async () => 'zombie charge');
    const owner = await takeOver('held-lost');

    let called = false;
    await expect(steps.run('email', async () => (called = true))).rejects.toBeInstanceOf(LeaseLostError);
    expect(called).toBe(false);
    // The run stays halted: later steps and the completion throw the same, before running.
    await expect(steps.run('ledger', { transaction: async (tx) => (await insertEffect(tx, env.schema, { scope: 'proto', key: 'held-lost/ledger', fence: 1, worker: 'z' }), 1) })).rejects.toBeInstanceOf(LeaseLostError);
    await expect(steps.complete(complete(zombie, 'zombie'))).rejects.toBeInstanceOf(LeaseLostError);
    expect(reports.map((r) => `${r.name}:${r.outcome}`)).toEqual(['charge:lease-lost', 'email:lease-lost', 'ledger:lease-lost']);
    expect(await stepRows('proto', 'held-lost')).toMatchObject([{ name: 'charge', fence: 1, starts: 1, recorded: false }]);

    // Refused in front of a database step's transaction: the statements after it never run.
    const zombie2 = await hold('held-lost-db');
    const second = heldRun(zombie2);
    await second.steps.run('charge', async () => 'zombie charge');
    await takeOver('held-lost-db');
    await expect(
      second.steps.run('ledger', { transaction: async (tx) => (await insertEffect(tx, env.schema, { scope: 'proto', key: 'held-lost-db/ledger', fence: 1, worker: 'z' }), 1) }),
    ).rejects.toBeInstanceOf(LeaseLostError);
    expect(await effectsOf(env.db, env.schema, 'proto', 'held-lost-db/ledger')).toEqual([]);
    expect(await stepRows('proto', 'held-lost-db')).toMatchObject([{ name: 'charge', recorded: false }]);

    // Refused when it went alone (the flush): the next call throws before its function runs.
    const zombie3 = await hold('held-lost-flush');
    const third = heldRun(zombie3);
    await third.steps.run('charge', async () => 'zombie charge');
    await takeOver('held-lost-flush');
    third.flushNow();
    await third.steps.flush();
    await expect(third.steps.run('email', async () => (called = true))).rejects.toBeInstanceOf(LeaseLostError);
    expect(called).toBe(false);

    // The new owner runs the charge again under its fence; the start count shows the repeat.
    const ownerSteps = heldRun(owner).steps;
    expect(await ownerSteps.run('charge', async (step) => `owner charge, start ${step.starts}`)).toBe('owner charge, start 2');
    await ownerSteps.complete(complete(owner, 'done'));
    expect(await stepRows('proto', 'held-lost')).toMatchObject([{ name: 'charge', fence: 2, starts: 2, recorded: true }]);
  });

  it('a held record whose round trip a store fault cut off: perhaps recorded, so the run stops with StoreUnavailableError before its next step runs; the next run reads the truth', async () => {
    const db = env.openDb(2);
    const real = new PostgresKeyStore(db, env.schema);
    // The connection dies in the round trip that carries the record, after the record ran and
    // before anything committed (its implicit transaction dies with the backend).
    const steps: StepStore = {
      ...real.steps,
      recordStatement: (...args) => {
        const record = real.steps.recordStatement!(...args);
        return CompiledQuery.raw(`${record.sql}, pg_terminate_backend(pg_backend_pid())`, [...record.parameters]);
      },
    };
    const store: KeyStore = Object.assign(Object.create(real) as PostgresKeyStore, { steps });
    const faulty = new IdempotencyKeys({ db, schema: env.schema }, store);
    const claim = await hold('held-fault');
    const run = new JobSteps(faulty, claim, never, undefined, { holdRecords: true, flushSoon: () => {} });
    await run.run('a', async () => 'one');
    let called = false;
    const fault = await run.run('b', async () => (called = true)).catch((error: unknown) => error);
    expect(fault).toBeInstanceOf(StoreUnavailableError);
    expect(called).toBe(false);
    await run.flush();
    // Every later call throws the halt, which names the step whose record is in doubt.
    await expect(run.run('c', async () => (called = true))).rejects.toMatchObject({ code: (fault as StoreUnavailableError).code, operation: 'record of step "a"' });
    await expect(run.complete(async () => 'done')).rejects.toMatchObject({ operation: 'record of step "a"' });
    expect(called).toBe(false);
    expect(await stepRows('proto', 'held-fault')).toMatchObject([{ name: 'a', starts: 1, recorded: false }]);
    const next = heldRun(await takeOver('held-fault')).steps;
    expect(await next.run('a', async (step) => `again, start ${step.starts}`)).toBe('again, start 2');
    await db.destroy();
  });

  it('a handler that throws with a record held: the worker records the step before releasing the key, and the next attempt replays it', async () => {
    startWorker({
      handler: async (ctx) => {
        const charge = await ctx.step('charge', async () => ({ call: bump(`${ctx.key}/charge`) }));
        if (ctx.key === 'held-throw-1' && ctx.attempt === 1) throw new Error('the handler failed after the charge');
        return ctx.transaction(async (tx) => {
          // Throws before the transaction's first statement: the record it carried never went out.
          if (ctx.key === 'held-throw-2' && ctx.attempt === 1) throw new Error('the completion failed');
          await effect(ctx, 'complete', tx);
          return charge;
        });
      },
    });
    for (const key of ['held-throw-1', 'held-throw-2']) {
      const job = await add(key, { attempts: 2 });
      const done = await waitForJobState(queue, job.id!, ['completed']);
      expect(done.job.attemptsMade).toBe(2);
      expect(done.job.returnvalue).toEqual({ call: 1 });
      expect(calls.get(`${key}/charge`)).toBe(1);
      expect(await stepRows('shop', key)).toMatchObject([{ name: 'charge', fence: 1, starts: 1, recorded: true }]);
      expect(await effectCount(key, 'complete')).toBe(1);
    }
  });
  it('a held record ahead of a database step whose statement has a syntax error: the record commits first (Postgres confirms it), so the next attempt replays the charge instead of charging again', async () => {
    startWorker({
      handler: async (ctx) => {
        const charge = await ctx.step('charge', async () => ({ call: bump(`${ctx.key}/charge`) }));
        await ctx.step('ledger', {
          transaction: async (tx) => {
            // Kysely compiles an empty `in` list to `in ()`: a syntax error, on the first attempt only.
            const keys = ctx.attempt === 1 ? [] : [ctx.key];
            await tx.selectFrom(`${env.schema}.job_steps`).select('name').where('key', 'in', keys).execute();
            return 'written';
          },
        });
        return ctx.transaction(async (tx) => (await effect(ctx, 'complete', tx), charge));
      },
    });
    const job = await add('held-syntax', { attempts: 2 });
    const done = await waitForJobState(queue, job.id!, ['completed']);
    expect(done.job.attemptsMade).toBe(2);
    expect(calls.get('held-syntax/charge')).toBe(1);
    expect(await stepRows('shop', 'held-syntax')).toMatchObject([
      { name: 'charge', fence: 1, starts: 1, recorded: true },
      { name: 'ledger', recorded: true },
    ]);
  });
});
