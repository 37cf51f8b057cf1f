// @module-tag redis
import { Queue } from 'bullmq';
import { sql, type Kysely } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, createIdempotentWorker, isHeld, jobIdFor, toWireJobData, type Claim, type ClaimOutcome, type HeldClaim, type IdempotentWorker, type WorkerEvent } from '../src/index.js';
import { type KeyStore } from '../src/store/key-store.js';
import { type LeaseExtension } from '../src/store/records.js';
import { PostgresKeyStore } from '../src/store/postgres-key-store.js';
import { createGate } from './support/protocol-fixtures.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let store: PostgresKeyStore;
let keys: IdempotencyKeys;
let queue: Queue;
const QUEUE = 'heartbeat';
const scope = 'beat';
const silent = pino({ level: 'silent' });
const workers: IdempotentWorker<any, any>[] = [];

beforeAll(async () => {
  env = await createTestEnv('heartbeat');
  store = new PostgresKeyStore(env.db, env.schema);
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000, claimLockTimeoutMs: 100 }, store);
  queue = new Queue(QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.close({ force: true })));
});
afterAll(async () => {
  await queue?.close();
  await env?.teardown();
});

function held(outcome: ClaimOutcome): HeldClaim {
  if (!isHeld(outcome)) throw new Error(`expected a held claim, got ${outcome.kind}`);
  return outcome;
}

/**
 * Runs `hold` in a transaction on its own connection, which keeps the key's row locked until
 * `release` resolves. `locked` resolves once `hold` has run; `done` when the transaction ended.
 */
function holdingRow(db: Kysely<any>, hold: (tx: Kysely<any>) => Promise<unknown>, release: Promise<void>) {
  const locked = createGate();
  const done = db.transaction().execute(async (tx) => {
    await hold(tx);
    locked.open();
    await release;
  });
  return { locked: locked.wait, done };
}

/** Resolves once some backend of this schema's test waits on a lock (the extension queued behind the holder). */
async function someoneWaitsOnALock(): Promise<void> {
  await waitFor('a backend waiting on a row lock', async () => {
    const { rows } = await sql<{ n: string }>`
      select count(*) as n from pg_stat_activity
       where application_name = 'test:heartbeat' and wait_event_type = 'Lock'`.execute(env.db);
    return Number(rows[0]!.n) > 0;
  });
}

describe('the lease extension', () => {
  it('waiting on a transaction that commits this claim\'s own completion, reports it completed, not lost', async () => {
    const claim = held(await keys.claim(scope, 'own-commit', 'fp'));
    const gate = createGate();
    const holder = holdingRow(
      env.openDb(1),
      (tx) => store.complete(tx, claim, '{"ok":true}', 60_000),
      gate.wait,
    );
    await holder.locked;
    // Let the extension wait longer than the holder takes: a generous lock timeout here.
    const extension = store.extend(claim, 30_000, 60_000);
    await someoneWaitsOnALock();
    gate.open();
    await holder.done;
    expect(await extension).toBe('completed');
    expect(await keys.extend(claim)).toBe('completed');
    expect(await keys.get(scope, 'own-commit')).toMatchObject({ status: 'completed', result: { ok: true } });
  });

  it('gives up a lock wait after the lock timeout without touching the key, and is not a loss', async () => {
    const claim = held(await keys.claim(scope, 'held-row', 'fp'));
    const before = (await keys.get(scope, 'held-row'))!;
    const gate = createGate();
    const holder = holdingRow(
      env.openDb(1),
      (tx) => sql`select 1 from ${sql.id(env.schema, 'idempotency_keys')} where key = 'held-row' for update`.execute(tx),
      gate.wait,
    );
    try {
      await holder.locked;
      // Bounded by claimLockTimeoutMs (100 ms here): the wait ends while the holder still holds the row.
      await expect(keys.extend(claim)).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE', cause: { code: '55P03' } });
      expect((await keys.get(scope, 'held-row'))!.lockedUntil).toEqual(before.lockedUntil);
    } finally {
      gate.open();
      await holder.done;
    }
    expect(await keys.extend(claim)).toBeInstanceOf(Date);
  });

  it('with group commit, an extension queued behind the group\'s transaction that then commits the job does not lose the lease', async () => {
    const grouped = new IdempotencyKeys(
      { db: env.db, schema: env.schema, leaseMs: 30_000, claimLockTimeoutMs: 100, groupCommit: { maxJobs: 4, maxGroups: 1 } },
      recordingExtensions(store),
    );
    const key = 'grouped-1';
    const events: WorkerEvent[] = [];
    let aborted = false;
    const worker = createIdempotentWorker<{ n: number }>({
      queue: QUEUE,
      connection: { url: env.redisUrl },
      prefix: env.redisPrefix,
      keys: grouped,
      logger: silent,
      leaseMs: 30_000,
      heartbeatMs: 20,
      handler: async (ctx) => {
        ctx.signal.addEventListener('abort', () => (aborted = true));
        return ctx.transaction(async (tx) => {
          // The group's transaction takes the key's row, as its completion will: the
          // heartbeat's next extension queues behind it.
          await sql`select 1 from ${sql.id(env.schema, 'idempotency_keys')} where scope = ${scope} and key = ${key} for update`.execute(tx);
          const calls = extensions.calls;
          await waitFor('an extension issued while the group holds the row', async () => extensions.calls > calls);
          return { n: ctx.data.n };
        });
      },
      // After the commit and before the job is finished: an extension now finds the key
      // completed. Hold the job until one has answered so: it cannot hide behind the job's
      // end. Only a commit can make that answer, and it may come before this hook runs (the
      // heartbeat then stops): waiting for an answer after the hook's start could wait forever.
      faultHook: async (point) => {
        if (point !== 'after-commit') return;
        await waitFor('an extension answered "completed" after the commit', async () => extensions.answers.includes('completed'));
      },
    });
    worker.on('event', (event) => events.push(event));
    workers.push(worker);
    await queue.add('job', toWireJobData(scope, key, { n: 1 }), { jobId: jobIdFor(scope, key) });
    const { job } = await waitForJobState(queue, jobIdFor(scope, key), ['completed']);
    expect(job.returnvalue).toEqual({ n: 1 });
    expect(events.map((e) => e.kind)).not.toContain('lease-lost');
    expect(aborted).toBe(false);
    expect(extensions.answers).not.toContain(null);
    expect(extensions.answers).toContain('completed');
    expect(await keys.get(scope, key)).toMatchObject({ status: 'completed', fence: 1 });
  });
});

/** What the heartbeat's extensions were asked and answered (throws are not answers). */
const extensions = { calls: 0, answers: [] as LeaseExtension[] };

/** `inner` with its extensions counted in {@link extensions}. */
function recordingExtensions(inner: PostgresKeyStore): KeyStore {
  return new Proxy(inner, {
    get(target, property, receiver) {
      if (property === 'extend') {
        return async (claim: Claim, leaseMs: number, lockTimeoutMs: number) => {
          extensions.calls++;
          const answer = await target.extend(claim, leaseMs, lockTimeoutMs);
          extensions.answers.push(answer);
          return answer;
        };
      }
      const value = Reflect.get(target, property, receiver);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
}
