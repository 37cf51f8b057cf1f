/**
 * Group commit blames only the guilty: a failure inside a shared transaction is attributed to
 * the job whose statement failed, and its group-mates commit.
 */
import { randomUUID } from 'node:crypto';
import { sql, type Kysely } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, LeaseLostError, PostgresKeyStore, isHeld, type ClaimOutcome, type HeldClaim } from '../src/index.js';
import { createGate, expireLease } from './support/protocol-fixtures.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
/** One group at a time, so that jobs queued behind a held first job share its transaction. */
let grouped: IdempotencyKeys;
let plain: IdempotencyKeys;
const scope = 'blame';

beforeAll(async () => {
  env = await createTestEnv('group_transaction');
  const store = new PostgresKeyStore(env.db, env.schema, { probeSettledKeys: false });
  grouped = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000, groupCommit: { maxJobs: 16, maxGroups: 1 } }, store);
  plain = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000 });
  await sql`create table ${sql.id(env.schema, 'blame_effects')} (key text not null, txid bigint not null default txid_current())`.execute(env.db);
});
afterAll(async () => {
  await env?.teardown();
});

const fp = (key: string) => grouped.fingerprint({ key });

function held(outcome: ClaimOutcome): HeldClaim {
  if (!isHeld(outcome)) throw new Error(`expected a held claim, got ${outcome.kind}`);
  return outcome;
}

async function insertEffect(tx: Kysely<any>, key: string): Promise<void> {
  await sql`insert into ${sql.id(env.schema, 'blame_effects')} (key) values (${key})`.execute(tx);
}

async function effects(prefix: string): Promise<Array<{ key: string; txid: string }>> {
  const { rows } = await sql<{ key: string; txid: string }>`
    select key, txid from ${sql.id(env.schema, 'blame_effects')} where key like ${`${prefix}%`} order by key`.execute(env.db);
  return rows;
}

/** A claim whose lease another worker took over: its fenced completion fails. */
async function zombieClaim(key: string): Promise<HeldClaim> {
  const zombie = held(await plain.claim(scope, key, fp(key)));
  await expireLease(env.db, env.schema, scope, key);
  held(await plain.claim(scope, key, fp(key)));
  return zombie;
}

/**
 * Runs `jobs` in ONE group: a first job holds the only group open until all of them are
 * queued, so they join its transaction. Returns how each settled (the first job's left out).
 */
async function inOneGroup(jobs: Array<() => Promise<unknown>>): Promise<PromiseSettledResult<unknown>[]> {
  const started = createGate();
  const gate = createGate();
  const first = held(await plain.claim(scope, `first-${randomUUID()}`, fp('first')));
  const firstRun = grouped.commitEffect(first, async () => (started.open(), await gate.wait, 'first'));
  await started.wait;
  const rest = jobs.map((job) => job());
  await new Promise((resolve) => setTimeout(resolve, 50));
  gate.open();
  const [firstSettled, ...settled] = await Promise.allSettled([firstRun, ...rest]);
  expect(firstSettled).toMatchObject({ status: 'fulfilled', value: 'first' });
  return settled;
}

describe('group commit attributes each failure to its own job', () => {
  it('1. SQL-less jobs in a row, two of which lost their lease: only those two fail; every group-mate commits', async () => {
    const mates = await Promise.all(['sqlless-m1', 'sqlless-m2', 'sqlless-m3', 'sqlless-m4'].map(async (key) => held(await plain.claim(scope, key, fp(key)))));
    const zombies = [await zombieClaim('sqlless-zombie-1'), await zombieClaim('sqlless-zombie-2')];
    // Only m3 sends a statement of its own: the two lost leases' completions ride with it, and
    // the others' with the COMMIT.
    const settled = await inOneGroup([
      () => grouped.commitEffect(mates[0]!, async () => 'm1'),
      () => grouped.commitEffect(zombies[0]!, async () => 'zombie 1'),
      () => grouped.commitEffect(mates[1]!, async () => 'm2'),
      () => grouped.commitEffect(zombies[1]!, async () => 'zombie 2'),
      () => grouped.commitEffect(mates[2]!, async (tx) => (await insertEffect(tx, 'sqlless-m3'), 'm3')),
      () => grouped.commitEffect(mates[3]!, async () => 'm4'),
    ]);
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'rejected', 'fulfilled', 'rejected', 'fulfilled', 'fulfilled']);
    expect((settled[1] as PromiseRejectedResult).reason).toBeInstanceOf(LeaseLostError);
    expect((settled[1] as PromiseRejectedResult).reason).toMatchObject({ key: 'sqlless-zombie-1' });
    expect((settled[3] as PromiseRejectedResult).reason).toMatchObject({ key: 'sqlless-zombie-2' });
    for (const [i, key] of ['sqlless-m1', 'sqlless-m2', 'sqlless-m3', 'sqlless-m4'].entries()) {
      expect(await plain.get(scope, key), key).toMatchObject({ status: 'completed', result: `m${i + 1}` });
    }
    for (const key of ['sqlless-zombie-1', 'sqlless-zombie-2']) expect(await plain.get(scope, key), key).toMatchObject({ status: 'processing', fence: 2 });
    expect((await effects('sqlless-')).map((r) => r.key)).toEqual(['sqlless-m3']);
  });

  it('2. SQL-less jobs only, the lost lease neither first nor last: every completion rides with the COMMIT; that job fails alone and the COMMIT goes through', async () => {
    const mates = await Promise.all(['commit-m1', 'commit-m2', 'commit-m3'].map(async (key) => held(await plain.claim(scope, key, fp(key)))));
    const zombie = await zombieClaim('commit-zombie');
    const settled = await inOneGroup([
      () => grouped.commitEffect(mates[0]!, async () => 1),
      () => grouped.commitEffect(zombie, async () => 'zombie'),
      () => grouped.commitEffect(mates[1]!, async () => 2),
      () => grouped.commitEffect(mates[2]!, async () => 3),
    ]);
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'rejected', 'fulfilled', 'fulfilled']);
    expect((settled[1] as PromiseRejectedResult).reason).toBeInstanceOf(LeaseLostError);
    for (const [i, key] of ['commit-m1', 'commit-m2', 'commit-m3'].entries()) expect(await plain.get(scope, key), key).toMatchObject({ status: 'completed', result: i + 1 });
    expect(await plain.get(scope, 'commit-zombie')).toMatchObject({ status: 'processing', fence: 2 });
  });

  it('3. a job that catches an SQL error inside its transaction is rolled back alone and fails with that error; its group-mates commit', async () => {
    const keys = ['swallow-m1', 'swallow-guilty', 'swallow-m2', 'swallow-m3'];
    const claims = await Promise.all(keys.map(async (key) => held(await plain.claim(scope, key, fp(key)))));
    let afterFailure: unknown;
    const settled = await inOneGroup([
      () => grouped.commitEffect(claims[0]!, async (tx) => (await insertEffect(tx, 'swallow-m1'), 'm1')),
      () =>
        grouped.commitEffect(claims[1]!, async (tx) => {
          await insertEffect(tx, 'swallow-guilty');
          await sql`select 1 / 0`.execute(tx).catch(() => {}); // swallowed
          // The savepoint is aborted: a later statement fails as Postgres would fail it.
          await insertEffect(tx, 'swallow-guilty-later').catch((error: unknown) => (afterFailure = error));
          return 'guilty';
        }),
      () => grouped.commitEffect(claims[2]!, async () => 'm2'),
      () => grouped.commitEffect(claims[3]!, async (tx) => (await insertEffect(tx, 'swallow-m3'), 'm3')),
    ]);
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'rejected', 'fulfilled', 'fulfilled']);
    expect((settled[1] as PromiseRejectedResult).reason).toMatchObject({ code: '22012', message: 'division by zero' });
    expect(afterFailure).toMatchObject({ code: '25P02' });
    expect((await effects('swallow-')).map((r) => r.key)).toEqual(['swallow-m1', 'swallow-m3']);
    expect(await plain.get(scope, 'swallow-guilty')).toMatchObject({ status: 'processing', fence: 1 });
    for (const [key, result] of [['swallow-m1', 'm1'], ['swallow-m2', 'm2'], ['swallow-m3', 'm3']]) {
      expect(await plain.get(scope, key!), key).toMatchObject({ status: 'completed', result });
    }
  });

  it('4. on the fast path too: a job that swallows an SQL error leaves its key absent; its group-mates commit', async () => {
    const store = new PostgresKeyStore(env.db, env.schema, { probeSettledKeys: false });
    const oneGroup = new IdempotencyKeys({ db: env.db, schema: env.schema, groupCommit: { maxGroups: 1 } }, store);
    const started = createGate();
    const gate = createGate();
    const first = oneGroup.executeOnce(scope, 'fast-first', fp('fast-first'), async () => (started.open(), await gate.wait, 'first'));
    await started.wait;
    const rest = ['fast-m1', 'fast-guilty', 'fast-m2', 'fast-m3'].map((key) =>
      oneGroup.executeOnce(scope, key, fp(key), async (tx) => {
        if (key === 'fast-m2') return 'no statement of its own';
        await insertEffect(tx, key);
        if (key === 'fast-guilty') await sql`select 1 / 0`.execute(tx).catch(() => {});
        return key;
      }),
    );
    await new Promise((resolve) => setTimeout(resolve, 50));
    gate.open();
    const settled = await Promise.allSettled([first, ...rest]);
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'fulfilled', 'rejected', 'fulfilled', 'fulfilled']);
    expect((settled[2] as PromiseRejectedResult).reason).toMatchObject({ code: '22012' });
    expect((await effects('fast-')).map((r) => r.key)).toEqual(['fast-m1', 'fast-m3']);
    expect(await plain.get(scope, 'fast-guilty')).toBeUndefined();
    for (const key of ['fast-m1', 'fast-m2', 'fast-m3']) expect(await plain.get(scope, key), key).toMatchObject({ status: 'completed' });
  });
  it('5. a closing statement that fails with another SQL error (a lock timeout) in front of a group-mate\'s statement fails its own job, not the group-mate', async () => {
    const keys = ['timeout-m1', 'timeout-guilty', 'timeout-m2', 'timeout-m3'];
    const claims = await Promise.all(keys.map(async (key) => held(await plain.claim(scope, key, fp(key)))));
    // Another transaction holds the guilty key's row, so its completion waits, up to the
    // lock_timeout the job set for the rest of the transaction.
    const locked = createGate();
    const release = createGate();
    const holder = env.db.transaction().execute(async (trx) => {
      await sql`select 1 from ${sql.id(env.schema, 'idempotency_keys')} where scope = ${scope} and key = 'timeout-guilty' for update`.execute(trx);
      locked.open();
      await release.wait;
    });
    await locked.wait;
    try {
      const settled = await inOneGroup([
        () => grouped.commitEffect(claims[0]!, async (tx) => (await insertEffect(tx, 'timeout-m1'), 'm1')),
        () => grouped.commitEffect(claims[1]!, async (tx) => (await sql`set local lock_timeout = 100`.execute(tx), 'guilty')),
        () => grouped.commitEffect(claims[2]!, async (tx) => (await insertEffect(tx, 'timeout-m2'), 'm2')),
        () => grouped.commitEffect(claims[3]!, async () => 'm3'),
      ]);
      expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'rejected', 'fulfilled', 'fulfilled']);
      // A lock timeout of the key's own statement is a transient store fault: its job is deferred, not failed.
      expect((settled[1] as PromiseRejectedResult).reason).toMatchObject({ code: 'STORE_UNAVAILABLE', cause: { code: '55P03' } });
    } finally {
      release.open();
      await holder;
    }
    expect((await effects('timeout-')).map((r) => r.key)).toEqual(['timeout-m1', 'timeout-m2']);
    expect(await plain.get(scope, 'timeout-guilty')).toMatchObject({ status: 'processing', fence: 1 });
    for (const [key, result] of [['timeout-m1', 'm1'], ['timeout-m2', 'm2'], ['timeout-m3', 'm3']]) {
      expect(await plain.get(scope, key!), key).toMatchObject({ status: 'completed', result });
    }
  });
});
