import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, LeaseLostError, PostgresKeyStore, ValidationError, createPostgresDb, isHeld, type ClaimOutcome, type HeldClaim, type KeyStore } from '../src/index.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';
import { createGate, expireLease } from './support/protocol-fixtures.js';

let env: TestEnv;
/** Group commit on; one group at a time, so that jobs submitted together share transactions. */
let grouped: IdempotencyKeys;
/** The same with careful groups only (a savepoint per job). */
let careful: IdempotencyKeys;
let plain: IdempotencyKeys;
const scope = 'group';

beforeAll(async () => {
  env = await createTestEnv('group_commit');
  grouped = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000, groupCommit: { maxJobs: 16, maxGroups: 1 } });
  careful = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000, groupCommit: { maxJobs: 16, maxGroups: 1, optimistic: false } });
  plain = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000 });
  // txid records which transaction committed each effect; `ref` is a foreign key checked only at COMMIT.
  await sql`create table ${sql.id(env.schema, 'group_refs')} (id int primary key)`.execute(env.db);
  await sql`create table ${sql.id(env.schema, 'group_effects')} (
    key text not null, txid bigint not null default txid_current(),
    ref int references ${sql.id(env.schema, 'group_refs')} (id) deferrable initially deferred)`.execute(env.db);
});
afterAll(async () => {
  await env?.teardown();
});

function held(outcome: ClaimOutcome): HeldClaim {
  if (!isHeld(outcome)) throw new Error(`expected a held claim, got ${outcome.kind}`);
  return outcome;
}

async function insertEffect(tx: Kysely<any>, key: string, bad = false): Promise<void> {
  await sql`insert into ${sql.id(env.schema, 'group_effects')} (key, ref) values (${key}, ${bad ? -1 : null})`.execute(tx);
}

async function effects(prefix: string): Promise<Array<{ key: string; txid: string }>> {
  const { rows } = await sql<{ key: string; txid: string }>`
    select key, txid from ${sql.id(env.schema, 'group_effects')} where key like ${`${prefix}%`} order by key`.execute(env.db);
  return rows;
}

const fp = (key: string) => grouped.fingerprint({ key });

/** Runs `body` and records every statement string any pg client sent meanwhile. */
async function recordStatements<T>(body: () => Promise<T>): Promise<{ value: T; statements: string[] }> {
  const statements: string[] = [];
  const original = pg.Client.prototype.query;
  pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
    statements.push(typeof args[0] === 'string' ? args[0] : String((args[0] as { text?: string })?.text));
    return (original as (...a: unknown[]) => unknown).apply(this, args);
  } as typeof original;
  try {
    return { value: await body(), statements };
  } finally {
    pg.Client.prototype.query = original;
  }
}

/**
 * What holds whatever kind of group a job ran in: optimistic groups (the default, which fall back
 * to careful ones on any failure) and careful groups alone.
 */
for (const mode of ['optimistic', 'careful'] as const) {
  describe(`group commit, ${mode} groups`, () => {
    const p = mode === 'optimistic' ? 'o-' : 'c-';
    const subject = () => (mode === 'optimistic' ? grouped : careful);

    it('1. concurrent fast-path jobs share transactions, and each key takes effect once', async () => {
      const keys = Array.from({ length: 12 }, (_, i) => `${p}share-${String(i).padStart(2, '0')}`);
      const outcomes = await Promise.all(keys.map((key) => subject().executeOnce(scope, key, fp(key), async (tx) => (await insertEffect(tx, key), { key }))));
      expect(outcomes.map((o) => o.kind)).toEqual(keys.map(() => 'executed'));
      const rows = await effects(`${p}share-`);
      expect(rows.map((r) => r.key)).toEqual(keys);
      // One group at a time: the first job goes alone, the other eleven wait and share one transaction.
      expect(new Set(rows.map((r) => r.txid)).size).toBeLessThan(keys.length);
      // Replays see the stored results.
      const again = await subject().executeOnce(scope, keys[3]!, fp(keys[3]!), async () => 'must not run');
      expect(again).toMatchObject({ kind: 'completed', result: { key: keys[3] } });
    });

    it('2. a job that throws in a group rolls back only itself (its effect and its claim); the others commit', async () => {
      const keys = Array.from({ length: 8 }, (_, i) => `${p}iso-${i}`);
      const settled = await Promise.allSettled(
        keys.map((key, i) =>
          subject().executeOnce(scope, key, fp(key), async (tx) => {
            await insertEffect(tx, key);
            if (i === 4) throw new Error('boom in the middle of the group');
            if (i === 6) await sql`select 1 / 0`.execute(tx); // an SQL error aborts only this job's savepoint
            return i;
          }),
        ),
      );
      expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled', 'fulfilled', 'rejected', 'fulfilled', 'rejected', 'fulfilled']);
      expect((await effects(`${p}iso-`)).map((r) => r.key)).toEqual([`${p}iso-0`, `${p}iso-1`, `${p}iso-2`, `${p}iso-3`, `${p}iso-5`, `${p}iso-7`]);
      // The failed keys are exactly as before: no row, so the next attempt runs them.
      expect(await plain.get(scope, `${p}iso-4`)).toBeUndefined();
      expect(await plain.get(scope, `${p}iso-6`)).toBeUndefined();
      const retried = await subject().executeOnce(scope, `${p}iso-4`, fp(`${p}iso-4`), async (tx) => (await insertEffect(tx, `${p}iso-4`), 'second try'));
      expect(retried.kind).toBe('executed');
      expect((await effects(`${p}iso-4`)).length).toBe(1);
    });

    it('3. a leased job whose lease was taken over is fenced inside its group; its group-mates commit', async () => {
      const zombie = held(await plain.claim(scope, `${p}fenced-zombie`, fp(`${p}fenced-zombie`)));
      await expireLease(env.db, env.schema, scope, `${p}fenced-zombie`);
      const successor = held(await plain.claim(scope, `${p}fenced-zombie`, fp(`${p}fenced-zombie`)));
      expect(successor.fence).toBe(2);
      const mates = await Promise.all([`${p}fenced-mate-1`, `${p}fenced-mate-2`].map(async (key) => held(await plain.claim(scope, key, fp(key)))));
      const results = await Promise.allSettled([
        subject().commitEffect(mates[0]!, async (tx) => (await insertEffect(tx, `${p}fenced-mate-1`), 1)),
        subject().commitEffect(zombie, async (tx) => (await insertEffect(tx, `${p}fenced-zombie`), 'zombie')),
        subject().commitEffect(mates[1]!, async (tx) => (await insertEffect(tx, `${p}fenced-mate-2`), 2)),
      ]);
      expect(results[0]).toMatchObject({ status: 'fulfilled', value: 1 });
      expect(results[1].status).toBe('rejected');
      expect((results[1] as PromiseRejectedResult).reason).toBeInstanceOf(LeaseLostError);
      expect(results[2]).toMatchObject({ status: 'fulfilled', value: 2 });
      expect((await effects(`${p}fenced-`)).map((r) => r.key)).toEqual([`${p}fenced-mate-1`, `${p}fenced-mate-2`]);
      expect(await plain.get(scope, `${p}fenced-zombie`)).toMatchObject({ status: 'processing', fence: 2 });
      // The successor still completes.
      await subject().commitEffect(successor, async (tx) => (await insertEffect(tx, `${p}fenced-zombie`), 'successor'));
      expect(await plain.get(scope, `${p}fenced-zombie`)).toMatchObject({ status: 'completed', result: 'successor' });
    });

    it('4. when the COMMIT itself fails, every job of the group fails and nothing of it is kept', async () => {
      const keys = [`${p}commit-fail-0`, `${p}commit-fail-1`, `${p}commit-fail-2`, `${p}commit-fail-3`];
      const settled = await Promise.allSettled(
        // The deferred constraint is checked only at COMMIT: job 2's row makes the whole COMMIT fail.
        keys.map((key, i) => subject().executeOnce(scope, key, fp(key), async (tx) => (await insertEffect(tx, key, i === 2), i))),
      );
      // The first job may have gone alone in its own group (and committed); every job grouped with job 2 failed.
      const failed = keys.filter((_, i) => settled[i]!.status === 'rejected');
      expect(failed).toContain(`${p}commit-fail-2`);
      for (const key of failed) {
        expect(await plain.get(scope, key)).toBeUndefined();
        expect(await effects(key)).toEqual([]);
      }
      const kept = keys.filter((key) => !failed.includes(key));
      for (const key of kept) expect((await effects(key)).length).toBe(1);
      expect(failed.length).toBeGreaterThan(1);
      // Retried without the bad row, each runs once.
      for (const key of failed) await subject().executeOnce(scope, key, fp(key), async (tx) => insertEffect(tx, key));
      for (const key of keys) expect((await effects(key)).length).toBe(1);
    });

    it('5. two jobs of one key in one group: one runs, the other replays its result, never a second effect', async () => {
      const runs = await Promise.all(
        [1, 2, 3].map(() => subject().executeOnce(scope, `${p}same-key`, fp(`${p}same-key`), async (tx) => (await insertEffect(tx, `${p}same-key`), 'only once'))),
      );
      expect(runs.filter((o) => o.kind === 'executed')).toHaveLength(1);
      for (const o of runs) if (o.kind !== 'executed') expect(o).toMatchObject({ kind: 'completed', result: 'only once' });
      expect((await effects(`${p}same-key`)).length).toBe(1);
    });
  });
}

describe('group commit', () => {
  it('6. a careful group of 8 leased jobs costs 9 round trips: each savepoint rides with its job\'s first statement, each completion with the next', async () => {
    const claims = await Promise.all(Array.from({ length: 8 }, async (_, i) => held(await plain.claim(scope, `trips-${i}`, fp(`trips-${i}`)))));
    await sql`select 1`.execute(env.db); // a warm pool connection
    const { statements: sent } = await recordStatements(() =>
      Promise.all(claims.map((claim, i) => careful.commitEffect(claim, async (tx) => (await insertEffect(tx, `trips-${i}`), i)))),
    );
    expect(sent).toHaveLength(9);
    expect(sent[0]).toMatch(/^begin isolation level read committed;\nsavepoint job_1;\ninsert into/);
    expect(sent[1]).toMatch(/complete_key.*;\nrelease savepoint job_1;\nsavepoint job_2;\ninsert into/s);
    expect(sent[8]).toMatch(/complete_key.*;\nrelease savepoint job_8;\ncommit$/s);
    expect((await effects('trips-')).map((r) => r.txid)).toEqual(Array(8).fill((await effects('trips-'))[0]!.txid));
    for (let i = 0; i < 8; i++) expect(await plain.get(scope, `trips-${i}`)).toMatchObject({ status: 'completed', result: i });
  });

  it('9. a careful group claims its jobs\' new keys in one statement; keys with a row, and a key repeated, are claimed by their jobs', async () => {
    // No settled-key probe, so that every job reaches the group and the statements are predictable.
    const store = new PostgresKeyStore(env.db, env.schema, { probeSettledKeys: false });
    const oneGroup = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000, groupCommit: { maxGroups: 1, optimistic: false } }, store);
    await plain.executeOnce(scope, 'ahead-done', fp('ahead-done'), async () => 'stored');
    await plain.executeOnce(scope, 'ahead-reused', grouped.fingerprint('something else'), async () => 'other');
    await plain.claim(scope, 'ahead-expired', fp('ahead-expired'));
    await expireLease(env.db, env.schema, scope, 'ahead-expired');
    await plain.claim(scope, 'ahead-live', fp('ahead-live'));
    const keys = ['ahead-new-1', 'ahead-done', 'ahead-new-2', 'ahead-reused', 'ahead-new-1', 'ahead-expired', 'ahead-live', 'ahead-new-3'];

    const started = createGate();
    const gate = createGate();
    const { value: outcomes, statements: sent } = await recordStatements(async () => {
      // A first job holds the only group open while the others queue up, so they form one batch.
      const first = oneGroup.executeOnce(scope, 'ahead-first', fp('ahead-first'), async (tx) => (started.open(), await gate.wait, await insertEffect(tx, 'ahead-first'), 'first'));
      await started.wait;
      const rest = keys.map((key, i) => oneGroup.executeOnce(scope, key, fp(key), async (tx) => (await insertEffect(tx, key), `${key}#${i}`)));
      await new Promise((resolve) => setTimeout(resolve, 50));
      gate.open();
      return [await first, ...(await Promise.all(rest))];
    });

    expect(outcomes.map((o) => o.kind)).toEqual(['executed', 'executed', 'completed', 'executed', 'key-reused', 'completed', 'executed', 'in-progress', 'executed']);
    expect(outcomes[5]).toMatchObject({ result: 'ahead-new-1#0' }); // the repeat replays its twin's result
    expect(outcomes[2]).toMatchObject({ result: 'stored' });
    expect(outcomes[6]).toMatchObject({ kind: 'executed', claim: { fence: 2, attempts: 2 } }); // taken over by its own claim
    expect(outcomes[1]).toMatchObject({ kind: 'executed', claim: { fence: 1, attempts: 1 } });
    // One statement claimed the three new keys; claim_key ran only for the first job (alone) and the five others.
    expect(sent.filter((text) => text.includes('claim_new_keys'))).toHaveLength(1);
    expect(sent.filter((text) => /\bclaim_key"?\(/.test(text))).toHaveLength(1 + 5);
    for (const key of ['ahead-first', 'ahead-new-1', 'ahead-new-2', 'ahead-expired', 'ahead-new-3']) expect((await effects(key)).length, key).toBe(1);
    for (const key of ['ahead-done', 'ahead-reused', 'ahead-live']) expect(await effects(key), key).toEqual([]);
    for (const key of ['ahead-new-1', 'ahead-new-2', 'ahead-new-3']) expect(await plain.get(scope, key), key).toMatchObject({ status: 'completed', fence: 1, attempts: 1 });
  });

  it('10. a job whose key its group claimed ahead and which then fails (throws, or returns a result jsonb refuses) leaves its key absent; its group-mates commit', async () => {
    const store = new PostgresKeyStore(env.db, env.schema, { probeSettledKeys: false });
    const oneGroup = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000, groupCommit: { maxGroups: 1, optimistic: false } }, store);
    const started = createGate();
    const gate = createGate();
    const { value: settled, statements } = await recordStatements(async () => {
      const first = oneGroup.executeOnce(scope, 'undo-first', fp('undo-first'), async () => (started.open(), await gate.wait, 'first'));
      await started.wait;
      const rest = ['undo-0', 'undo-1', 'undo-2', 'undo-3'].map((key, i) =>
        oneGroup.executeOnce(scope, key, fp(key), async (tx) => {
          await insertEffect(tx, key);
          if (i === 1) throw new Error('effect failed after its key was claimed ahead');
          return i === 2 ? { text: 'NUL \u0000 is refused' } : i;
        }),
      );
      await new Promise((resolve) => setTimeout(resolve, 50));
      gate.open();
      return Promise.allSettled([first, ...rest]);
    });
    expect(statements.filter((text) => text.includes('claim_new_keys'))).toHaveLength(1);
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'fulfilled', 'rejected', 'rejected', 'fulfilled']);
    expect((settled[3] as PromiseRejectedResult).reason).toMatchObject({ code: 'RESULT_NOT_STORABLE' });
    expect((await effects('undo-')).map((r) => r.key)).toEqual(['undo-0', 'undo-3']);
    expect(await plain.get(scope, 'undo-1')).toBeUndefined();
    expect(await plain.get(scope, 'undo-2')).toBeUndefined();
    expect(await plain.get(scope, 'undo-3')).toMatchObject({ status: 'completed', result: 3 });
    // The next attempt finds the key new, and runs once.
    expect((await oneGroup.executeOnce(scope, 'undo-1', fp('undo-1'), async (tx) => (await insertEffect(tx, 'undo-1'), 'again'))).kind).toBe('executed');
    expect((await effects('undo-1')).length).toBe(1);
  });

  it('11. when the batched claim waits too long on a key another transaction holds, it is rolled back and each job claims alone', async () => {
    const store = new PostgresKeyStore(env.db, env.schema, { probeSettledKeys: false });
    const quick = new IdempotencyKeys({ db: env.db, schema: env.schema, claimLockTimeoutMs: 200, groupCommit: { maxGroups: 1, optimistic: false } }, store);
    // Another transaction holds 'timeout-held' uncommitted (a fast path outside the group).
    const holding = createGate();
    const released = createGate();
    const holder = plain.executeOnce(scope, 'timeout-held', fp('timeout-held'), async () => (holding.open(), await released.wait, 'holder'));
    await holding.wait;
    const started = createGate();
    const gate = createGate();
    const { value: outcomes, statements } = await recordStatements(async () => {
      const first = quick.executeOnce(scope, 'timeout-first', fp('timeout-first'), async () => (started.open(), await gate.wait, 'first'));
      await started.wait;
      const rest = ['timeout-a', 'timeout-held', 'timeout-b'].map((key) => quick.executeOnce(scope, key, fp(key), async (tx) => (await insertEffect(tx, key), key)));
      await new Promise((resolve) => setTimeout(resolve, 50));
      gate.open();
      return Promise.all([first, ...rest]);
    });
    released.open();
    expect((await holder).kind).toBe('executed');
    expect(outcomes.map((o) => o.kind)).toEqual(['executed', 'executed', 'in-progress', 'executed']);
    expect(statements.some((text) => /rollback to savepoint shared_1/.test(text))).toBe(true);
    expect((await effects('timeout-')).map((r) => r.key)).toEqual(['timeout-a', 'timeout-b']);
    expect(await plain.get(scope, 'timeout-held')).toMatchObject({ status: 'completed', result: 'holder' });
  });

  it('12. a careful group opens at most 64 savepoints (Postgres caches 64 subtransaction ids), batched steps included', async () => {
    const store = new PostgresKeyStore(env.db, env.schema, { probeSettledKeys: false });
    const wide = new IdempotencyKeys({ db: env.db, schema: env.schema, groupCommit: { maxJobs: 63, maxGroups: 1, optimistic: false } }, store);
    const run = (key: string, before?: () => Promise<void>) =>
      wide.executeOnce(scope, key, fp(key), async (tx) => (await before?.(), await insertEffect(tx, key), key));
    const started = createGate();
    const gate = createGate();
    const later: Array<Promise<unknown>> = [];
    // Savepoints: the first job alone (1); a batch of 40 (1 shared + 40); then a batch that
    // arrives while the 40th runs: room for 64 - 42 - 1 = 21 of its 30 jobs, not 22.
    const first = run('subx-first', async () => (started.open(), await gate.wait));
    await started.wait;
    const batch = Array.from({ length: 40 }, (_, i) =>
      run(`subx-a-${String(i).padStart(2, '0')}`, async () => {
        if (i !== 39) return;
        for (let j = 0; j < 30; j++) later.push(run(`subx-b-${String(j).padStart(2, '0')}`));
        await new Promise((resolve) => setTimeout(resolve, 20));
      }),
    );
    await new Promise((resolve) => setTimeout(resolve, 50));
    gate.open();
    await Promise.all([first, ...batch]);
    await Promise.all(later);
    const rows = await effects('subx-');
    expect(rows).toHaveLength(71);
    const firstGroup = rows.filter((row) => row.txid === rows.find((r) => r.key === 'subx-first')!.txid);
    expect(firstGroup).toHaveLength(1 + 40 + 21);
  });

  it('7. group commit needs a store with group statements, and at most 63 jobs a group', () => {
    const store = { schema: env.schema } as unknown as KeyStore;
    expect(() => new IdempotencyKeys({ db: env.db, schema: env.schema, groupCommit: true }, store)).toThrow(ValidationError);
    expect(() => new IdempotencyKeys({ db: env.db, schema: env.schema, groupCommit: { maxJobs: 64 } })).toThrow(/maxJobs/);
  });
});

describe('optimistic groups', () => {
  /** Optimistic groups, one at a time, no settled-key probe: every job reaches the group. */
  function optimisticKeys(options: { claimLockTimeoutMs?: number } = {}) {
    const store = new PostgresKeyStore(env.db, env.schema, { probeSettledKeys: false });
    return new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000, ...options, groupCommit: { maxGroups: 1 } }, store);
  }

  it('13. a group of 8 fast-path jobs costs 2 round trips and no savepoint: BEGIN with the 8 effects, then the keys written completed with their results, with the COMMIT', async () => {
    const keys = optimisticKeys();
    await sql`select 1`.execute(env.db); // a warm pool connection
    const { value: outcomes, statements: sent } = await recordStatements(() =>
      Promise.all(Array.from({ length: 8 }, (_, i) => keys.executeOnce(scope, `lean-${i}`, fp(`lean-${i}`), async (tx) => (await insertEffect(tx, `lean-${i}`), i)))),
    );
    expect(outcomes.map((o) => o.kind)).toEqual(Array(8).fill('executed'));
    expect(outcomes[3]).toMatchObject({ result: 3, claim: { fence: 1, attempts: 1 } });
    expect(sent).toHaveLength(2);
    expect(sent[0]).toMatch(/^begin isolation level read committed;\ninsert into/);
    expect(sent[0]!.match(/insert into/g)).toHaveLength(8);
    expect(sent[1]).toMatch(/^set local lock_timeout = 2000;\ninsert into "[a-z_0-9]+"\.idempotency_keys .* values \(.*\);\ncommit$/s);
    expect(sent.some((text) => /savepoint|claim_/.test(text))).toBe(false);
    expect(new Set((await effects('lean-')).map((r) => r.txid)).size).toBe(1);
    for (const [i, outcome] of outcomes.entries()) {
      const owner = outcome.kind === 'executed' ? outcome.claim.owner : undefined;
      expect(await plain.get(scope, `lean-${i}`)).toMatchObject({ status: 'completed', result: i, fence: 1, attempts: 1, owner });
    }
  });

  it('14. a key that has a row fails the group at its end: it rolls back, and its jobs run again in a careful group; each effect commits once', async () => {
    const keys = optimisticKeys();
    await plain.executeOnce(scope, 'again-2', fp('again-2'), async () => 'stored before');
    const runs = new Map<string, number>();
    const { value: outcomes, statements: sent } = await recordStatements(() =>
      Promise.all(
        [0, 1, 2, 3].map((i) =>
          keys.executeOnce(scope, `again-${i}`, fp(`again-${i}`), async (tx) => {
            runs.set(`again-${i}`, (runs.get(`again-${i}`) ?? 0) + 1);
            await insertEffect(tx, `again-${i}`);
            return i;
          }),
        ),
      ),
    );
    expect(outcomes.map((o) => o.kind)).toEqual(['executed', 'executed', 'completed', 'executed']);
    expect(outcomes[2]).toMatchObject({ result: 'stored before' });
    expect((await effects('again-')).map((r) => r.key)).toEqual(['again-0', 'again-1', 'again-3']);
    // The optimistic run and the careful one: the effect code ran twice, its transaction committed once.
    expect(runs.get('again-0')).toBe(2);
    expect(runs.get('again-2')).toBe(1); // the careful claim found it completed: no second run
    expect(sent.some((text) => /^rollback$/.test(text))).toBe(true);
    expect(sent.some((text) => /savepoint job_1/.test(text))).toBe(true);
  });

  it('15. two workers run one key in optimistic groups at once: the first COMMIT wins, the other group rolls back and replays its result', async () => {
    const first = optimisticKeys();
    const second = optimisticKeys();
    const inEffect = createGate();
    const gate = createGate();
    const slow = first.executeOnce(scope, 'race', fp('race'), async (tx) => {
      await insertEffect(tx, 'race');
      inEffect.open();
      await gate.wait;
      return 'slow';
    });
    await inEffect.wait;
    const fast = await second.executeOnce(scope, 'race', fp('race'), async (tx) => (await insertEffect(tx, 'race'), 'fast'));
    expect(fast).toMatchObject({ kind: 'executed', result: 'fast' });
    gate.open();
    expect(await slow).toMatchObject({ kind: 'completed', result: 'fast' });
    expect((await effects('race')).length).toBe(1);
  });

  it('16. a lost lease fails its group at the end: the group runs again carefully, where the zombie alone fails with LeaseLostError', async () => {
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000, groupCommit: { maxGroups: 1 } });
    const zombie = held(await plain.claim(scope, 'lost-zombie', fp('lost-zombie')));
    await expireLease(env.db, env.schema, scope, 'lost-zombie');
    held(await plain.claim(scope, 'lost-zombie', fp('lost-zombie')));
    const mate = held(await plain.claim(scope, 'lost-mate', fp('lost-mate')));
    const [zombieRun, mateRun] = await Promise.allSettled([
      keys.commitEffect(zombie, async (tx) => (await insertEffect(tx, 'lost-zombie'), 'zombie')),
      keys.commitEffect(mate, async (tx) => (await insertEffect(tx, 'lost-mate'), 'mate')),
    ]);
    expect((zombieRun as PromiseRejectedResult).reason).toBeInstanceOf(LeaseLostError);
    expect(mateRun).toMatchObject({ status: 'fulfilled', value: 'mate' });
    expect((await effects('lost-')).map((r) => r.key)).toEqual(['lost-mate']);
  });

  it('17. a COMMIT applied whose reply was lost: each job reads its key, finds it completed under its own claim, and reports its result', async () => {
    const keys = optimisticKeys();
    await sql`select 1`.execute(env.db);
    const original = pg.Client.prototype.query;
    let cut = 0;
    pg.Client.prototype.query = async function (this: pg.Client, ...args: unknown[]) {
      const text = typeof args[0] === 'string' ? args[0] : '';
      const result = await (original as (...a: unknown[]) => Promise<unknown>).apply(this, args);
      if (/idempotency_keys .*;\ncommit$/s.test(text) && cut++ === 0) throw new Error('Connection terminated unexpectedly');
      return result;
    } as typeof original;
    let outcomes;
    try {
      outcomes = await Promise.all([0, 1, 2].map((i) => keys.executeOnce(scope, `cut-reply-${i}`, fp(`cut-reply-${i}`), async (tx) => (await insertEffect(tx, `cut-reply-${i}`), i))));
    } finally {
      pg.Client.prototype.query = original;
    }
    expect(cut).toBe(1);
    expect(outcomes.map((o) => o.kind === 'executed' && o.result)).toEqual([0, 1, 2]);
    expect((await effects('cut-reply-')).map((r) => r.key)).toEqual(['cut-reply-0', 'cut-reply-1', 'cut-reply-2']);
  });
});

describe('gathered groups (the jobs of an optimistic group run at once, their statements sent together)', () => {
  function gatheredKeys() {
    const store = new PostgresKeyStore(env.db, env.schema, { probeSettledKeys: false });
    return new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000, groupCommit: { maxGroups: 1 } }, store);
  }
  const runEight = <T>(keys: IdempotencyKeys, prefix: string, effect: (tx: Kysely<any>, i: number) => Promise<T>) =>
    Promise.all(Array.from({ length: 8 }, (_, i) => keys.executeOnce(scope, `${prefix}${i}`, fp(`${prefix}${i}`), (tx) => effect(tx, i))));

  it('18. each job receives its own statement\'s result, whatever its position in the string', async () => {
    const keys = gatheredKeys();
    const { value: outcomes, statements: sent } = await recordStatements(() =>
      runEight(keys, 'own-', async (tx, i) => {
        const { rows } = await sql<{ key: string; n: number }>`
          insert into ${sql.id(env.schema, 'group_effects')} (key) values (${`own-${i}`}) returning key, ${i}::int as n`.execute(tx);
        return rows;
      }),
    );
    expect(sent.filter((text) => /group_effects/.test(text))).toHaveLength(1);
    expect(outcomes.map((o) => o.kind === 'executed' && o.result)).toEqual(Array.from({ length: 8 }, (_, i) => [{ key: `own-${i}`, n: i }]));
  });

  it('19. jobs of several statements each (read for update, then write what was read) lose no update: the group runs again one job after another', async () => {
    const keys = gatheredKeys();
    await sql`create table ${sql.id(env.schema, 'group_counter')} (id int primary key, n int not null)`.execute(env.db);
    await sql`insert into ${sql.id(env.schema, 'group_counter')} values (1, 0)`.execute(env.db);
    const counter = sql.id(env.schema, 'group_counter');
    const runs = new Map<number, number>();
    const increment = async (tx: Kysely<any>, i: number) => {
      runs.set(i, (runs.get(i) ?? 0) + 1);
      const { rows } = await sql<{ n: number }>`select n from ${counter} where id = 1 for update`.execute(tx);
      await sql`update ${counter} set n = ${rows[0]!.n + 1} where id = 1`.execute(tx);
      return rows[0]!.n + 1;
    };
    const first = await runEight(keys, 'counted-', increment);
    expect(first.map((o) => o.kind)).toEqual(Array(8).fill('executed'));
    expect((await sql<{ n: number }>`select n from ${counter}`.execute(env.db)).rows[0]!.n).toBe(8);
    // Each job saw every earlier one's write, as one after another.
    expect(first.map((o) => (o.kind === 'executed' ? o.result : 0)).sort((a, b) => a - b)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect([...runs.values()].some((n) => n === 2)).toBe(true); // the gathered try, rolled back
    // Later groups of this instance run one job after another from the start: no try lost.
    runs.clear();
    const { statements: sent } = await recordStatements(() => runEight(keys, 'counted-again-', increment));
    expect([...runs.values()]).toEqual(Array(8).fill(1));
    expect(sent.some((text) => /^rollback$/.test(text))).toBe(false);
    expect((await sql<{ n: number }>`select n from ${counter}`.execute(env.db)).rows[0]!.n).toBe(16);
  });

  it('20. a statement Postgres refuses fails the gathered group; its jobs run again carefully, and only the failing one fails', async () => {
    const keys = gatheredKeys();
    const outcomes = await Promise.allSettled(
      Array.from({ length: 4 }, (_, i) =>
        keys.executeOnce(scope, `refused-${i}`, fp(`refused-${i}`), async (tx) => {
          // Job 2's one statement breaks a not-null constraint: refused in the gathered string.
          await sql`insert into ${sql.id(env.schema, 'group_effects')} (key) values (${i === 2 ? null : `refused-${i}`})`.execute(tx);
          return i;
        }),
      ),
    );
    expect(outcomes.map((o) => o.status)).toEqual(['fulfilled', 'fulfilled', 'rejected', 'fulfilled']);
    expect((await effects('refused-')).map((r) => r.key)).toEqual(['refused-0', 'refused-1', 'refused-3']);
    expect(await plain.get(scope, 'refused-2')).toBeUndefined();
  });

  it('21. a statement with binary values goes alone, and a text of two statements fails the group rather than mix up results', async () => {
    const keys = gatheredKeys();
    const { value: outcomes, statements: sent } = await recordStatements(() =>
      Promise.all([
        keys.executeOnce(scope, 'binary-0', fp('binary-0'), async (tx) => (await sql<{ b: string }>`select encode(${Buffer.from('hi')}::bytea, 'hex') as b`.execute(tx)).rows[0]!.b),
        keys.executeOnce(scope, 'binary-1', fp('binary-1'), async (tx) => (await insertEffect(tx, 'binary-1'), 1)),
      ]),
    );
    expect(outcomes.map((o) => o.kind === 'executed' && o.result)).toEqual(['6869', 1]);
    expect(sent.some((text) => /^select encode\(\$1::bytea/.test(text))).toBe(true);
    const two = await Promise.all(
      [0, 1].map((i) => keys.executeOnce(scope, `two-${i}`, fp(`two-${i}`), async (tx) => (await sql.raw<{ n: number }>(`select ${i} as n; select ${i + 10} as n`).execute(tx)).rows[0]!.n)),
    );
    // The careful run sends each text alone; Kysely reads the last statement's rows.
    expect(two.map((o) => o.kind === 'executed' && o.result)).toEqual([10, 11]);
  });
});

describe('group commit without Postgres', () => {
  it('8. jobs waiting for a group fail (for their callers to retry) when no connection can be had, instead of looping', async () => {
    const unreachable = createPostgresDb({ connectionString: 'postgres://postgres@127.0.0.1:1/postgres', maxConnections: 1 });
    const keys = new IdempotencyKeys({ db: unreachable, schema: 'nowhere', groupCommit: { maxGroups: 1 } }, new PostgresKeyStore(unreachable, 'nowhere', { probeSettledKeys: false }));
    const claim = { scope, key: 'k', owner: '00000000-0000-4000-8000-000000000000', fence: 1, attempts: 1, lockedUntil: null } as const;
    const settled = await Promise.allSettled([1, 2, 3].map(() => keys.commitEffect(claim as never, async () => 'never')));
    expect(settled.map((s) => s.status)).toEqual(['rejected', 'rejected', 'rejected']);
    await unreachable.destroy();
  });
});
