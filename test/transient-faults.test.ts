// @module-tag redis
/**
 * Transient store faults (a terminated connection, a COMMIT whose reply is lost, a server whose
 * default isolation is serializable) delay a job; they never use up its attempts, fail it, or
 * store a failure on its key. The faults are real: the worker's own Postgres backends are
 * terminated (`pg_terminate_backend`, selected by this file's application_name) at precise
 * points of the protocol, against the shared Postgres and Redis. The jobs are added by a plain
 * BullMQ queue with its default options: ONE attempt, as a foreign producer gives them.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { Queue, UnrecoverableError, type Job } from 'bullmq';
import { sql, type Kysely, type Transaction } from 'kysely';
import pg from 'pg';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ClaimContendedError, IdempotencyKeys, StoreUnavailableError, createIdempotentWorker, createPostgresDb, isHeld, type IdempotencyOptions, type IdempotentWorker, type IdempotentWorkerOptions, type JobContext, type WorkerEvent } from '../src/index.js';
import { type KeyStore } from '../src/store/key-store.js';
import { PostgresKeyStore } from '../src/store/postgres-key-store.js';
import { type FaultHook } from '../src/process/index.js';
import { resolveWorkerTiming, storeRetryDelayMs } from '../src/consumer/worker-timing.js';
import { StoreFaultStreaks } from '../src/consumer/store-fault-streaks.js';
import { kyselyOverPool } from '../src/store/pipelining-pool.js';
import { transientStoreFault } from '../src/store/pg-errors.js';
import { createEffectsTable, effectsOf } from './support/protocol-fixtures.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
/** The worker's pool: its backends carry `appName`, so the tests terminate only them. */
let workerDb: Kysely<any>;
const appName = `ij-transient-${randomBytes(4).toString('hex')}`;
let queue: Queue;
const QUEUE = 'transient';
const scope = 'transient';
const silent = pino({ level: 'silent' });
const workers: IdempotentWorker<any, any>[] = [];
const extraDbs: Kysely<any>[] = [];

beforeAll(async () => {
  env = await createTestEnv('transient');
  await createEffectsTable(env.db, env.schema);
  workerDb = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 10, applicationName: appName }, () => {});
  queue = new Queue(QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.close({ force: true })));
});
afterAll(async () => {
  await queue?.close();
  await workerDb?.destroy();
  for (const db of extraDbs) await db.destroy();
  await env?.teardown();
});

/** Terminates this file's worker backends (those in `state`, if given) and waits until they are gone. */
async function terminateWorkerBackends(state?: 'idle in transaction'): Promise<number> {
  const { rows } = await sql<{ pid: number }>`
    select pid from pg_stat_activity
     where application_name = ${appName} and pid <> pg_backend_pid()
       and (${state ?? null}::text is null or state = ${state ?? null})`.execute(env.db);
  const pids = rows.map((r) => r.pid);
  if (pids.length === 0) return 0;
  await sql`select pg_terminate_backend(pid) from unnest(${pids}::int[]) as pid`.execute(env.db);
  await waitFor('terminated backends to exit', async () => {
    const { rows: left } = await sql`select 1 from pg_stat_activity where pid = any(${pids}::int[])`.execute(env.db);
    return left.length === 0;
  });
  return pids.length;
}

/** A fault hook that terminates the worker's open transactions the first time it reaches `point`. */
function terminateOnceAt(point: 'before-commit' | 'after-claim', counter = { terminated: 0 }): FaultHook {
  let done = false;
  return async (reached) => {
    if (reached !== point || done) return;
    done = true;
    counter.terminated += await terminateWorkerBackends(point === 'before-commit' ? 'idle in transaction' : undefined);
  };
}

type Handler = (ctx: JobContext<{ n: number }>) => Promise<unknown>;

/** The effect: one row in `effects` per commit (no unique index: a duplicate would show). */
const effectHandler: Handler = (ctx) =>
  ctx.transaction(async (tx) => {
    await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, 'w')`.execute(tx);
    return { n: ctx.data.n, fence: ctx.fence };
  });

function keysOn(db: Kysely<any>, options: Partial<IdempotencyOptions> = {}, store?: KeyStore): IdempotencyKeys {
  return new IdempotencyKeys({ db, schema: env.schema, leaseMs: 30_000, ...options }, store);
}

function startWorker(keys: IdempotencyKeys, options: Partial<IdempotentWorkerOptions<{ n: number }>> = {}) {
  const events: WorkerEvent[] = [];
  const worker = createIdempotentWorker<{ n: number }>({
    queue: QUEUE,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    keys,
    handler: effectHandler,
    concurrency: 4,
    logger: silent,
    storeRetryMinMs: 20,
    storeRetryMaxMs: 200,
    ...options,
  });
  worker.on('event', (event) => events.push(event));
  workers.push(worker);
  return { worker, events };
}

/** Adds jobs as a foreign producer does: plain BullMQ, default options (one attempt). */
async function addJobs(prefix: string, count: number): Promise<Array<{ job: Job; key: string }>> {
  return Promise.all(
    Array.from({ length: count }, async (_, n) => {
      const key = `${prefix}-${n}-${randomUUID()}`;
      const job = await queue.add('pay', { idempotencyKey: key, scope, payload: { n } });
      return { job, key };
    }),
  );
}

/** Waits for each job to finish and checks it completed once, with no attempt used and nothing failed. */
async function expectCompletedOnce(added: Array<{ job: Job; key: string }>, events: WorkerEvent[]) {
  for (const { job, key } of added) {
    const { job: finished, state } = await waitForJobState(queue, job.id!, ['completed', 'failed'], 30_000);
    expect({ state, failedReason: finished.failedReason }).toEqual({ state: 'completed', failedReason: undefined });
    // BullMQ counts the completion as the attempt made: one, the only one the job had.
    expect(finished.attemptsMade).toBe(1);
    expect(finished.returnvalue).toMatchObject({ n: (job.data as { payload: { n: number } }).payload.n });
    expect(await effectsOf(env.db, env.schema, scope, key)).toHaveLength(1);
    const row = await keysOn(env.db).get(scope, key);
    expect(row).toMatchObject({ status: 'completed', result: finished.returnvalue });
  }
  expect(events.filter((e) => e.kind === 'failed')).toEqual([]);
}

/**
 * A store whose end-of-transaction statement commits and then loses its connection: the COMMIT
 * went through, the reply did not. The connection error is real (the backend terminates itself
 * after the COMMIT, and the next statement on that connection fails).
 */
function commitThenDisconnect(db: Kysely<any>, options: { failReadsAfterCut?: number } = {}) {
  const real = new PostgresKeyStore(db, env.schema);
  const state = { cut: 0, failedReads: 0, error: undefined as unknown };
  const disconnectAfter = async (tx: Kysely<any>) => {
    if (state.cut++ > 0) return;
    state.error = await sql`select pg_terminate_backend(pg_backend_pid())`.execute(tx).catch((e: unknown) => e);
    throw state.error;
  };
  const store: KeyStore = new Proxy(real, {
    get(target, property) {
      if (property === 'completeAndCommit') {
        return async (tx: Transaction<any>, ...rest: [any, string, number]) => {
          const completed = await target.completeAndCommit(tx, ...rest);
          await disconnectAfter(tx);
          return completed;
        };
      }
      if (property === 'storeFastPathResultAndCommit') {
        return async (tx: Transaction<any>, ...rest: [any, string]) => {
          await target.storeFastPathResultAndCommit(tx, ...rest);
          await disconnectAfter(tx);
        };
      }
      if (property === 'get') {
        // The read that resolves the COMMIT may fail too (Postgres still down): the same real error.
        return async (...args: [string, string]) => {
          if (state.error !== undefined && state.failedReads < (options.failReadsAfterCut ?? 0)) {
            state.failedReads++;
            throw state.error;
          }
          return target.get(...args);
        };
      }
      const value = Reflect.get(target, property, target) as unknown;
      return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value;
    },
  });
  return { store, state };
}

/** A real driver error of a terminated connection (a backend that terminated itself). */
async function realConnectionError(): Promise<unknown> {
  const db = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 1, applicationName: appName }, () => {});
  extraDbs.push(db);
  const error = await sql`select pg_terminate_backend(pg_backend_pid())`.execute(db).catch((e: unknown) => e);
  expect(transientStoreFault(error)).toBe('connection');
  return error;
}

/** A store whose recording of a failure first meets a terminated connection (`times` times). */
async function failingFailures(db: Kysely<any>, times = 1) {
  const real = new PostgresKeyStore(db, env.schema);
  const error = await realConnectionError();
  const state = { refused: 0 };
  const store: KeyStore = new Proxy(real, {
    get(target, property) {
      if (property === 'fail') {
        return async (...args: Parameters<PostgresKeyStore['fail']>) => {
          if (state.refused < times) {
            state.refused++;
            throw error;
          }
          return target.fail(...args);
        };
      }
      const value = Reflect.get(target, property, target) as unknown;
      return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value;
    },
  });
  return { store, state };
}

describe('classification of store errors', () => {
  it('names connection, conflict and timeout faults, and nothing else', () => {
    const pgError = (code: string) => Object.assign(new Error(`sqlstate ${code}`), { code });
    for (const code of ['57P01', '57P02', '57P03', '08006', '08001', '53000', '53100', '53200', '53300', '25006']) {
      expect(transientStoreFault(pgError(code)), code).toBe('connection');
    }
    // A protocol violation is the connection's fault only when the server ended the session for it.
    const protocolViolation = (severity: string) => Object.assign(pgError('08P01'), { severity });
    expect(transientStoreFault(protocolViolation('FATAL'))).toBe('connection');
    expect(transientStoreFault(protocolViolation('ERROR'))).toBeUndefined();
    expect(transientStoreFault(pgError('53400'))).toBeUndefined();
    for (const code of ['40001', '40P01']) expect(transientStoreFault(pgError(code))).toBe('conflict');
    for (const code of ['55P03', '57014']) expect(transientStoreFault(pgError(code))).toBe('timeout');
    for (const code of ['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT']) expect(transientStoreFault(pgError(code))).toBe('connection');
    for (const message of [
      'Connection terminated unexpectedly',
      'Connection terminated',
      'timeout exceeded when trying to connect',
      'Client has encountered a connection error and is not queryable',
    ]) {
      expect(transientStoreFault(new Error(message))).toBe('connection');
    }
    for (const code of ['23505', '22P02', '42P01', 'IJ001', '3B001']) expect(transientStoreFault(pgError(code))).toBeUndefined();
    expect(transientStoreFault(new Error('provider timed out'))).toBeUndefined();
    expect(transientStoreFault('Connection terminated')).toBeUndefined();
  });

  it('classifies a real terminated connection and a real refused connection', async () => {
    await realConnectionError();
    const refusedDb = createPostgresDb({ connectionString: 'postgres://postgres@127.0.0.1:1/postgres', maxConnections: 1 }, () => {});
    extraDbs.push(refusedDb);
    const refused = await sql`select 1`.execute(refusedDb).catch((e: unknown) => e);
    expect(transientStoreFault(refused)).toBe('connection');
  });

  it('a NUL in a simple-protocol string (08P01, the connection intact) is not transient; a protocol violation that ends the session is', async () => {
    const client = new pg.Client({ connectionString: env.databaseUrl });
    client.on('error', () => {});
    await client.connect();
    try {
      const nul = await client.query("select 'a\u0000b'").catch((e: unknown) => e);
      expect(nul).toMatchObject({ code: '08P01', severity: 'ERROR' });
      expect(transientStoreFault(nul)).toBeUndefined();
      // The same connection still answers: nothing broke.
      expect((await client.query('select 1 as one')).rows).toEqual([{ one: 1 }]);
      // A message type the server does not know: it answers FATAL 08P01 and closes the session.
      client.connection.stream.write(Buffer.from([0x5a, 0, 0, 0, 4]));
      const fatal = await client.query('select 1').catch((e: unknown) => e);
      expect(fatal).toMatchObject({ code: '08P01', severity: 'FATAL' });
      expect(transientStoreFault(fatal)).toBe('connection');
    } finally {
      await client.end().catch(() => {});
    }
  });

  it('real 53xxx and 25006 answers: resource faults and a read-only server are transient, a configuration limit is not', async () => {
    const raised = (code: string) => sql.raw(`do $$ begin raise exception 'simulated' using errcode = '${code}'; end $$`).execute(env.db).catch((e: unknown) => e);
    for (const code of ['53000', '53100', '53200', '53300']) expect(transientStoreFault(await raised(code)), code).toBe('connection');
    expect(transientStoreFault(await raised('53400'))).toBeUndefined();
    const readOnly = await env.db
      .transaction()
      .execute(async (tx) => {
        await sql`set transaction read only`.execute(tx);
        await sql`create temporary table never_made (x int)`.execute(tx);
      })
      .catch((e: unknown) => e);
    expect(readOnly).toMatchObject({ code: '25006' });
    expect(transientStoreFault(readOnly)).toBe('connection');
  });

  it('a pooled connection that answered 25006 (a server taking no writes) is destroyed, not lent out again', async () => {
    const db = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 1, applicationName: appName }, () => {});
    extraDbs.push(db);
    // The session turns read-only, as every session of a primary demoted by a failover is.
    const { rows } = await sql<{ pid: number }>`select pg_backend_pid() as pid, set_config('default_transaction_read_only', 'on', false)`.execute(db);
    const readOnlyPid = rows[0]!.pid;
    const refused = await sql`create temporary table never_made (x int)`.execute(db).catch((e: unknown) => e);
    expect(refused).toMatchObject({ code: '25006' });
    const { rows: next } = await sql<{ pid: number }>`select pg_backend_pid() as pid`.execute(db);
    expect(next[0]!.pid).not.toBe(readOnlyPid);
    await waitFor('the read-only backend to exit', async () => {
      const { rows: left } = await sql`select 1 from pg_stat_activity where pid = ${readOnlyPid}`.execute(env.db);
      return left.length === 0;
    });
  });

  it('backs off exponentially from storeRetryMinMs, capped at storeRetryMaxMs, jitter on top', () => {
    const timing = resolveWorkerTiming({ storeRetryMinMs: 100, storeRetryMaxMs: 1_000, deferJitterRatio: 0.5 }, 30_000);
    expect([0, 1, 2, 3, 4, 10].map((n) => storeRetryDelayMs(timing, n, () => 0))).toEqual([100, 200, 400, 800, 1_000, 1_000]);
    expect(storeRetryDelayMs(timing, 0, () => 1)).toBe(150);
    expect(storeRetryDelayMs(timing, -1, () => 0)).toBe(100);
    expect(storeRetryDelayMs(timing, Number.NaN, () => 0)).toBe(100);
    expect(() => resolveWorkerTiming({ storeRetryMinMs: 2_000, storeRetryMaxMs: 1_000 }, 30_000)).toThrow(/storeRetryMinMs/);
  });
});

describe('the leased path', () => {
  it('a claim cut off by a terminated connection does not use the only attempt; the job completes once', async () => {
    const keys = keysOn(workerDb, { claimLockTimeoutMs: 20_000 });
    const { events } = startWorker(keys);
    const key = `claim-${randomUUID()}`;
    // Hold the key's index entry in an open transaction, so the worker's claim waits on it; then
    // terminate the waiting claim's backend, then let the key go.
    const blocker = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 1, applicationName: `${appName}-blocker` }, () => {});
    extraDbs.push(blocker);
    let job!: Job;
    await blocker
      .transaction()
      .execute(async (tx) => {
        await sql`insert into ${sql.id(env.schema, 'idempotency_keys')} (scope, key, fingerprint, status)
                  values (${scope}, ${key}, 'blocker', 'processing')`.execute(tx);
        job = await queue.add('pay', { idempotencyKey: key, scope, payload: { n: 7 } });
        await waitFor('the claim to wait on the key', async () => {
          const { rows } = await sql`select 1 from pg_stat_activity where application_name = ${appName} and wait_event_type = 'Lock'`.execute(env.db);
          return rows.length > 0;
        });
        expect(await terminateWorkerBackends()).toBeGreaterThan(0);
        throw new Error('roll the blocker back');
      })
      .catch((error: Error) => {
        if (error.message !== 'roll the blocker back') throw error;
      });
    // The claim's outcome was unknown (its session ended): it was asked again, with its owner
    // token, on another connection, and the job ran there at once.
    await expectCompletedOnce([{ job, key }], events);
    expect(events.filter((e) => e.key === key).map((e) => e.kind)).toEqual(['claimed', 'completed']);
  });

  it('a completion and COMMIT cut off by a terminated connection: deferred, key released, completes once', async () => {
    const counter = { terminated: 0 };
    const { events } = startWorker(keysOn(workerDb), { faultHook: terminateOnceAt('before-commit', counter) });
    const added = await addJobs('commit', 1);
    await expectCompletedOnce(added, events);
    expect(counter.terminated).toBe(1);
    expect(events.map((e) => e.kind)).toEqual(expect.arrayContaining(['store-unavailable', 'released', 'taken-over', 'completed']));
    // The key was never failed, not even for a moment: its stored error is the released one's.
    expect(events.filter((e) => e.kind === 'failed')).toHaveLength(0);
  });

  /** An effect that terminates its own backend on its key's first run. */
  function terminatingOnce(): Handler {
    const terminated = new Set<string>();
    return (ctx) =>
      ctx.transaction(async (tx) => {
        if (!terminated.has(ctx.key)) {
          terminated.add(ctx.key);
          await sql`select pg_terminate_backend(pg_backend_pid())`.execute(tx);
        }
        await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, 'w')`.execute(tx);
        return { n: ctx.data.n };
      });
  }

  it("an effect statement that meets a terminated connection is the store's fault, not the handler's (alone: groupCommit false)", async () => {
    const { events } = startWorker(keysOn(workerDb, { groupCommit: false }), { handler: terminatingOnce() });
    const added = await addJobs('effect', 2);
    await expectCompletedOnce(added, events);
    expect(events.filter((e) => e.kind === 'store-unavailable')).toHaveLength(2);
  });

  it('an effect statement that meets a terminated connection in a group (the default): the group rolls back, its jobs run again alone, each completes once, none fails', async () => {
    const { events } = startWorker(keysOn(workerDb), { handler: terminatingOnce() });
    const added = await addJobs('effect-grouped', 2);
    await expectCompletedOnce(added, events);
    expect(events.filter((e) => e.kind === 'failed')).toHaveLength(0);
  });

  // The ambiguous COMMIT of a transaction alone (a group's is test/group-commit.test.ts's).
  it('an ambiguous COMMIT that did commit finishes the job with the stored result, without running it again', async () => {
    const { store, state } = commitThenDisconnect(workerDb);
    let runs = 0;
    const handler: Handler = async (ctx) => {
      runs++;
      return effectHandler(ctx);
    };
    const { events } = startWorker(keysOn(workerDb, { groupCommit: false }, store), { handler });
    const added = await addJobs('ambiguous', 1);
    await expectCompletedOnce(added, events);
    expect(state.cut).toBeGreaterThan(0);
    expect(runs).toBe(1);
    expect(events.filter((e) => e.kind === 'store-unavailable')).toHaveLength(0);
  });

  it('an ambiguous COMMIT whose resolving read fails too is deferred, then replays the committed result', async () => {
    const { store, state } = commitThenDisconnect(workerDb, { failReadsAfterCut: 1 });
    let runs = 0;
    const handler: Handler = async (ctx) => {
      runs++;
      return effectHandler(ctx);
    };
    const { events } = startWorker(keysOn(workerDb, { groupCommit: false }, store), { handler });
    const added = await addJobs('ambiguous-unread', 1);
    await expectCompletedOnce(added, events);
    expect(state).toMatchObject({ cut: 1, failedReads: 1 });
    expect(runs).toBe(1);
    expect(events.map((e) => e.kind)).toEqual(expect.arrayContaining(['store-unavailable', 'replayed']));
  });

  it('IdempotencyKeys.commitEffect throws StoreUnavailableError, and runEffect releases the key, whatever onError says', async () => {
    const keys = keysOn(workerDb);
    const key = `run-effect-${randomUUID()}`;
    const claim = await keys.claim(scope, key, keys.fingerprint({ key }));
    if (!isHeld(claim)) throw new Error(`expected a claim, got ${claim.kind}`);
    const error = await keys
      .runEffect(claim, (tx) => sql`select pg_terminate_backend(pg_backend_pid())`.execute(tx), { onError: () => 'fail' })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(StoreUnavailableError);
    expect(error).toMatchObject({ code: 'STORE_UNAVAILABLE', scope, key });
    expect(await keys.get(scope, key)).toMatchObject({ status: 'processing', owner: null });
  });
});

describe('the fast path', () => {
  it('a COMMIT cut off by a terminated connection is deferred and never stored as the key failure', async () => {
    const counter = { terminated: 0 };
    const { events } = startWorker(keysOn(workerDb), { fastPath: true, faultHook: terminateOnceAt('before-commit', counter) });
    const added = await addJobs('fast', 1);
    await expectCompletedOnce(added, events);
    expect(counter.terminated).toBe(1);
    expect(events.some((e) => e.kind === 'store-unavailable')).toBe(true);
  });

  it('an ambiguous COMMIT that did commit is recognised by the claim owner token', async () => {
    const { store, state } = commitThenDisconnect(workerDb);
    let runs = 0;
    const handler: Handler = async (ctx) => {
      runs++;
      return effectHandler(ctx);
    };
    const { events } = startWorker(keysOn(workerDb, {}, store), { fastPath: true, handler });
    const added = await addJobs('fast-ambiguous', 1);
    await expectCompletedOnce(added, events);
    expect(state.cut).toBeGreaterThan(0);
    expect(runs).toBe(1);
  });
});

describe('recording a permanent failure', () => {
  const permanent: Handler = async () => {
    throw new UnrecoverableError('account closed (permanent)');
  };

  for (const fastPath of [false, true]) {
    it(`when storing the failure meets a terminated connection, the job is deferred and the failure recorded later (${fastPath ? 'fast path' : 'leased'})`, async () => {
      const { store, state } = await failingFailures(workerDb);
      const { events } = startWorker(keysOn(workerDb, {}, store), { fastPath, handler: permanent });
      const { job, key } = (await addJobs(fastPath ? 'fail-fast' : 'fail-leased', 1))[0]!;
      const { job: finished, state: jobState } = await waitForJobState(queue, job.id!, ['completed', 'failed'], 30_000);
      expect(jobState).toBe('failed');
      expect(finished.failedReason).toMatch(/account closed/);
      expect(state.refused).toBe(1);
      // Recorded for good with the handler's error, not left processing (nor failed with the connection error).
      const row = await keysOn(env.db).get(scope, key);
      expect(row).toMatchObject({ status: 'failed', error: expect.objectContaining({ message: 'account closed (permanent)' }) });
      expect(events.map((e) => e.kind)).toEqual(expect.arrayContaining(['store-unavailable', 'failed']));
    });
  }
});

describe('group commit', () => {
  for (const fastPath of [false, true]) {
    const path = fastPath ? 'fast path' : 'leased';
    // The break shows at the next statement: a later job's effect (nothing was sent to commit:
    // each job runs again alone, on a new connection) or the group's end (whether the COMMIT
    // was applied is not known: each job is deferred, or finds its key completed).
    it(`a group whose connection is terminated before its COMMIT: no job fails, each completes once (${path})`, async () => {
      const counter = { terminated: 0 };
      const keys = keysOn(workerDb, { groupCommit: { maxJobs: 8, maxGroups: 1 } });
      const { events } = startWorker(keys, { fastPath, concurrency: 6, faultHook: terminateOnceAt('before-commit', counter) });
      const added = await addJobs(fastPath ? 'group-fast' : 'group', 6);
      await expectCompletedOnce(added, events);
      expect(counter.terminated).toBe(1);
    });
  }
});

describe('claim contention', () => {
  /** A store whose first claim keeps losing races to other writers, as five in a row would. */
  class ContendedOnce extends PostgresKeyStore {
    #contended = false;
    #contend(input: { scope: string; key: string }): void {
      if (this.#contended) return;
      this.#contended = true;
      throw new ClaimContendedError(input.scope, input.key, 5);
    }
    override async claim(...args: Parameters<PostgresKeyStore['claim']>) {
      this.#contend(args[1]);
      return super.claim(...args);
    }
    override async claimNewKey(...args: Parameters<PostgresKeyStore['claimNewKey']>) {
      this.#contend(args[1]);
      return super.claimNewKey(...args);
    }
  }

  for (const fastPath of [false, true]) {
    it(`a claim that kept racing other writers defers its job like an in-progress duplicate, using no attempt (${fastPath ? 'fast path' : 'leased'})`, async () => {
      const keys = keysOn(workerDb, {}, new ContendedOnce(workerDb, env.schema));
      const { events } = startWorker(keys, { fastPath, deferMinMs: 20 });
      const added = await addJobs(`contended-${fastPath}`, 1);
      await expectCompletedOnce(added, events);
      expect(events.filter((e) => e.kind === 'deferred')).toHaveLength(1);
    });
  }
});

describe('read committed, whatever the server default', () => {
  /**
   * A pool whose connections default to serializable, as a server or role configured so would.
   * The application's own pool (not createPostgresDb's, whose sessions start at read committed):
   * what is left to prove is that the store's transactions pin read committed themselves.
   */
  async function serializablePool(): Promise<Kysely<any>> {
    const url = new URL(env.databaseUrl);
    url.searchParams.set('options', '-c default_transaction_isolation=serializable');
    const pool = new pg.Pool({ connectionString: url.toString(), max: 16, application_name: `${appName}-serializable` });
    pool.on('error', () => {});
    pool.on('connect', (client) => client.on('error', () => {}));
    const db = kyselyOverPool(pool);
    extraDbs.push(db);
    const { rows } = await sql<{ level: string }>`select current_setting('default_transaction_isolation') as level`.execute(db);
    expect(rows[0]!.level).toBe('serializable');
    return db;
  }

  it('concurrent duplicates in fast-path transactions meet no serialization failure', async () => {
    const serializable = await serializablePool();
    const keys = keysOn(serializable, { claimLockTimeoutMs: 10_000 });
    for (let round = 0; round < 5; round++) {
      const key = `serializable-${round}-${randomUUID()}`;
      const fingerprint = keys.fingerprint({ key });
      const outcomes = await Promise.allSettled(
        Array.from({ length: 8 }, () =>
          keys.executeOnce(scope, key, fingerprint, async (tx, claim) => {
            await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${scope}, ${key}, ${claim.fence}, 's')`.execute(tx);
            await sql`select pg_sleep(0.05)`.execute(tx);
            return 'done';
          }),
        ),
      );
      const rejected = outcomes.filter((o) => o.status === 'rejected').map((o) => String((o as PromiseRejectedResult).reason));
      expect(rejected).toEqual([]);
      const kinds = outcomes.map((o) => (o as PromiseFulfilledResult<{ kind: string }>).value.kind);
      expect(kinds.filter((k) => k === 'executed')).toHaveLength(1);
      expect(new Set(kinds)).toEqual(new Set(['executed', 'completed']));
      expect(await effectsOf(env.db, env.schema, scope, key)).toHaveLength(1);
    }
  });

  for (const fastPath of [false, true]) {
    it(`duplicate jobs with one attempt each all finish, none failed (${fastPath ? 'fast path' : 'leased'})`, async () => {
      const keys = keysOn(await serializablePool(), { claimLockTimeoutMs: 10_000 });
      const { events } = startWorker(keys, { fastPath, concurrency: 8 });
      const jobs: Job[] = [];
      const keyNames = Array.from({ length: 3 }, (_, i) => `serializable-jobs-${i}-${randomUUID()}`);
      for (const key of keyNames) {
        for (let copy = 0; copy < 6; copy++) jobs.push(await queue.add('pay', { idempotencyKey: key, scope, payload: { n: 1 } }));
      }
      for (const job of jobs) {
        const { job: finished, state } = await waitForJobState(queue, job.id!, ['completed', 'failed'], 30_000);
        expect({ state, failedReason: finished.failedReason }).toEqual({ state: 'completed', failedReason: undefined });
      }
      for (const key of keyNames) expect(await effectsOf(env.db, env.schema, scope, key)).toHaveLength(1);
      expect(events.filter((e) => e.kind === 'failed')).toEqual([]);
    });
  }
});

describe('errors that are not the store being away', () => {
  it("a NUL sent in a simple-protocol string (08P01, the connection intact) is the handler's error: stored on the last attempt, never deferred", async () => {
    const handler: Handler = (ctx) =>
      ctx.transaction(async (tx) => {
        await sql.raw("select 'a\u0000b'").execute(tx);
      });
    const { events } = startWorker(keysOn(workerDb), { handler });
    const { job, key } = (await addJobs('nul', 1))[0]!;
    const { state } = await waitForJobState(queue, job.id!, ['completed', 'failed'], 30_000);
    expect(state).toBe('failed');
    expect(await keysOn(env.db).get(scope, key)).toMatchObject({ status: 'failed', error: expect.objectContaining({ code: '08P01' }) });
    expect(events.filter((e) => e.kind === 'store-unavailable')).toEqual([]);
  });

  it('a write refused by a read-only server (25006, a failover in progress) is deferred without an attempt; its connection is replaced and the job completes once', async () => {
    const db = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 2, applicationName: appName }, () => {});
    extraDbs.push(db);
    // The pool's one open connection turns read-only, as a primary demoted under it would.
    const { rows } = await sql<{ pid: number }>`select pg_backend_pid() as pid, set_config('default_transaction_read_only', 'on', false)`.execute(db);
    const { events } = startWorker(keysOn(db), { concurrency: 1 });
    const added = await addJobs('read-only', 1);
    await expectCompletedOnce(added, events);
    expect(events.some((e) => e.kind === 'store-unavailable')).toBe(true);
    const { rows: left } = await sql`select 1 from pg_stat_activity where pid = ${rows[0]!.pid}`.execute(env.db);
    expect(left).toEqual([]);
  });
});

describe('store faults that do not pass', () => {
  /** A fault that is deterministic but classified as transient: the effect's statement raises out_of_memory every time. */
  const outOfMemory: Handler = (ctx) =>
    ctx.transaction(async (tx) => {
      await sql.raw(`do $$ begin raise exception 'simulated out of memory' using errcode = '53200'; end $$`).execute(tx);
    });

  it('count as attempts once they have lasted storeRetryWindowMs; the last attempt stores the fault and fails the job', async () => {
    const runs: Array<{ attemptsMade: number; at: number }> = [];
    const handler: Handler = async (ctx) => {
      runs.push({ attemptsMade: ctx.job.attemptsMade, at: Date.now() });
      return outOfMemory(ctx);
    };
    const { events } = startWorker(keysOn(workerDb), { handler, storeRetryWindowMs: 600, storeRetryMaxMs: 100 });
    const key = `persistent-${randomUUID()}`;
    const job = await queue.add('pay', { idempotencyKey: key, scope, payload: { n: 1 } }, { attempts: 2 });
    const { job: finished, state } = await waitForJobState(queue, job.id!, ['completed', 'failed'], 30_000);
    expect(state).toBe('failed');
    expect(finished.attemptsMade).toBe(2);
    expect(finished.failedReason).toMatch(/kept failing/);
    const row = await keysOn(env.db).get(scope, key);
    expect(row).toMatchObject({ status: 'failed', error: expect.objectContaining({ code: 'STORE_FAULT_PERSISTED' }) });
    expect(String((row!.error as { message: string }).message)).toContain('simulated out of memory');
    // Deferred, no attempt used, for the whole window; then each fault is an attempt.
    const firstAttempt = runs.filter((r) => r.attemptsMade === 0);
    // How many deferrals fit in the window depends on the machine's speed; at least the first.
    expect(firstAttempt.length).toBeGreaterThanOrEqual(2);
    expect(runs.find((r) => r.attemptsMade === 1)!.at - runs[0]!.at).toBeGreaterThanOrEqual(600);
    expect(runs.filter((r) => r.attemptsMade === 1)).toHaveLength(1);
    expect(events.filter((e) => e.key === key && e.kind === 'store-unavailable')).toHaveLength(firstAttempt.length - 1);
    expect(events.filter((e) => e.key === key).map((e) => e.kind).at(-1)).toBe('failed');
  });

  it('a job past the window whose failure cannot be recorded (Postgres unreachable) stays deferred, never failed', async () => {
    const deadDb = createPostgresDb({ connectionString: 'postgres://postgres@127.0.0.1:1/postgres', maxConnections: 1 }, () => {});
    extraDbs.push(deadDb);
    const { worker, events } = startWorker(keysOn(deadDb), { storeRetryWindowMs: 100, storeRetryMinMs: 20, storeRetryMaxMs: 50 });
    const { job } = (await addJobs('outage', 1))[0]!;
    const startedAt = Date.now();
    await waitFor('store faults well past the window', async () => Date.now() - startedAt > 1_000 && events.filter((e) => e.kind === 'store-unavailable').length >= 10);
    await worker.close();
    expect(events.filter((e) => e.kind === 'failed')).toEqual([]);
    expect(await (await queue.getJob(job.id!))!.getState()).not.toBe('failed');
  });

  it('StoreFaultStreaks: a key outlasts the window counted from its first fault in a row; a run past the store ends the streak', () => {
    let now = 0;
    const streaks = new StoreFaultStreaks({ windowMs: 1_000, maxTracked: 2, now: () => now });
    expect(streaks.outlasted('a')).toBe(false);
    now = 1_000;
    expect(streaks.outlasted('a')).toBe(false);
    now = 1_001;
    expect(streaks.outlasted('a')).toBe(true);
    streaks.end('a');
    expect(streaks.outlasted('a')).toBe(false);
    expect(streaks.size).toBe(1);
  });

  it('StoreFaultStreaks: a key unseen for a whole window is forgotten; past maxTracked, the key seen longest ago goes', () => {
    let now = 0;
    const streaks = new StoreFaultStreaks({ windowMs: 1_000, maxTracked: 2, now: () => now });
    streaks.outlasted('a');
    streaks.outlasted('b');
    now = 500;
    streaks.outlasted('c'); // over maxTracked: a goes
    expect(streaks.size).toBe(2);
    now = 900;
    expect(streaks.outlasted('b')).toBe(false);
    now = 1_001;
    expect(streaks.outlasted('b')).toBe(true);
    expect(streaks.outlasted('a')).toBe(false); // a new streak
    const unseen = new StoreFaultStreaks({ windowMs: 1_000, now: () => now });
    now = 0;
    unseen.outlasted('x');
    unseen.outlasted('y');
    now = 900;
    unseen.outlasted('x');
    unseen.outlasted('y');
    now = 1_800;
    expect(unseen.outlasted('y')).toBe(true);
    now = 1_901;
    // x was last seen 1,001 ms ago: its faults went to other consumers, or passed.
    expect(unseen.outlasted('x')).toBe(false);
  });

  it('storeRetryWindowMs defaults to an hour and is a positive integer', () => {
    expect(resolveWorkerTiming({}, 30_000).storeRetryWindowMs).toBe(3_600_000);
    expect(() => resolveWorkerTiming({ storeRetryWindowMs: 0 }, 30_000)).toThrow(/storeRetryWindowMs/);
  });
});
