import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, KeyReusedError, LeaseLostError, ResultNotStorableError, ValidationError, isHeld, type HeldClaim, type ClaimOutcome } from '../src/index.js';
import { type KeyStore } from '../src/store/key-store.js';
import { PostgresKeyStore } from '../src/store/postgres-key-store.js';
import { UncertainClaims } from '../src/protocol/uncertain-claims.js';
import { StatementFaults } from './support/statement-faults.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';
import { createEffectsTable, createGate, effectsOf, expireLease, insertEffect } from './support/protocol-fixtures.js';

let env: TestEnv;
let keys: IdempotencyKeys;
const scope = 'payments';
const fp = (payload: unknown) => keys.fingerprint(payload);

beforeAll(async () => {
  env = await createTestEnv('claim');
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000 });
  await createEffectsTable(env.db, env.schema);
});
afterAll(async () => {
  await env?.teardown();
});

function held(outcome: ClaimOutcome): HeldClaim {
  if (!isHeld(outcome)) throw new Error(`expected a held claim, got ${outcome.kind}`);
  return outcome;
}

/** One IdempotencyKeys per separate single-connection pool, warmed up so each holds its own backend. */
async function separateConnections(count: number): Promise<IdempotencyKeys[]> {
  const instances = Array.from({ length: count }, () => new IdempotencyKeys({ db: env.openDb(1), schema: env.schema }));
  await Promise.all(instances.map((k) => sql`select 1`.execute(k.db)));
  return instances;
}

describe('claim', () => {
  it('1. of 50 concurrent claims of one key on separate connections exactly one wins', async () => {
    const racers = await separateConnections(50);
    const outcomes = await Promise.all(racers.map((k) => k.claim(scope, 'race-50', fp({ n: 1 }))));
    const kinds = outcomes.map((o) => o.kind);
    expect(kinds.filter((k) => k === 'claimed')).toHaveLength(1);
    expect(kinds.filter((k) => k === 'in-progress')).toHaveLength(49);
    for (const o of outcomes) if (o.kind === 'in-progress') expect(o.retryAfterMs).toBeGreaterThan(0);
    for (const k of racers) await k.db.destroy();
  });

  it('2. of 20 concurrent takeovers of one expired lease exactly one wins and the fence rises by one', async () => {
    const first = held(await keys.claim(scope, 'takeover-20', fp({ n: 2 })));
    expect(first.fence).toBe(1);
    await expireLease(env.db, env.schema, scope, 'takeover-20');
    const racers = await separateConnections(20);
    const outcomes = await Promise.all(racers.map((k) => k.claim(scope, 'takeover-20', fp({ n: 2 }))));
    const winners = outcomes.filter((o) => o.kind === 'taken-over');
    expect(winners).toHaveLength(1);
    expect(outcomes.filter((o) => o.kind === 'in-progress')).toHaveLength(19);
    expect(held(winners[0]!).fence).toBe(2);
    expect((await keys.get(scope, 'takeover-20'))!.fence).toBe(2);
    for (const k of racers) await k.db.destroy();
  });

  it('3. a zombie whose lease was taken over rolls back its effect and completion; the new owner commits', async () => {
    const key = 'zombie';
    const a = held(await keys.claim(scope, key, fp({ n: 3 })));
    const gate = createGate();
    const zombie = keys.runEffect(a, async (tx) => {
      await insertEffect(tx, env.schema, { scope, key, fence: a.fence, worker: 'A' });
      await gate.wait; // A is paused mid-effect, past its lease
      return 'from A';
    });
    await expireLease(env.db, env.schema, scope, key);
    const b = held(await keys.claim(scope, key, fp({ n: 3 })));
    expect(b.kind).toBe('taken-over');
    expect(b.fence).toBe(a.fence + 1);
    gate.open();
    await expect(zombie).rejects.toBeInstanceOf(LeaseLostError);
    await keys.runEffect(b, async (tx) => {
      await insertEffect(tx, env.schema, { scope, key, fence: b.fence, worker: 'B' });
      return 'from B';
    });
    expect(await effectsOf(env.db, env.schema, scope, key)).toEqual([{ fence: 2, worker: 'B' }]);
    const row = await keys.get(scope, key);
    expect(row).toMatchObject({ status: 'completed', result: 'from B', fence: 2 });
  });

  it('3b. an expired lease that nobody took over still completes: fencing is by token, not clock', async () => {
    const key = 'expired-not-taken';
    const a = held(await keys.claim(scope, key, fp({ n: 31 })));
    await expireLease(env.db, env.schema, scope, key);
    await keys.runEffect(a, async (tx) => insertEffect(tx, env.schema, { scope, key, fence: a.fence, worker: 'A' }));
    expect(await effectsOf(env.db, env.schema, scope, key)).toHaveLength(1);
    expect((await keys.get(scope, key))!.status).toBe('completed');
  });

  it('4. an effect that throws commits nothing, releases the key, and the next claim succeeds', async () => {
    const key = 'throws';
    const a = held(await keys.claim(scope, key, fp({ n: 4 })));
    await expect(
      keys.runEffect(a, async (tx) => {
        await insertEffect(tx, env.schema, { scope, key, fence: a.fence, worker: 'A' });
        throw new Error('card declined, try again');
      }),
    ).rejects.toThrow('card declined');
    expect(await effectsOf(env.db, env.schema, scope, key)).toHaveLength(0);
    const released = await keys.get(scope, key);
    expect(released).toMatchObject({ status: 'processing', owner: null, attempts: 1 });
    expect(released!.error).toMatchObject({ message: 'card declined, try again' });
    const next = held(await keys.claim(scope, key, fp({ n: 4 })));
    expect(next).toMatchObject({ kind: 'taken-over', fence: 2, attempts: 2 });
  });

  it('5. a completion racing a takeover commits exactly one effect, 200 times over', async () => {
    const [aKeys, bKeys] = await separateConnections(2);
    const tally = { aWon: 0, bWon: 0 };
    for (let i = 0; i < 200; i++) {
      const key = `race-complete-${i}`;
      const a = held(await aKeys!.claim(scope, key, fp({ i })));
      await expireLease(env.db, env.schema, scope, key);
      const aCompletes = aKeys!
        .runEffect(a, (tx) => insertEffect(tx, env.schema, { scope, key, fence: a.fence, worker: 'A' }))
        .then(() => 'A' as const, (e) => (e instanceof LeaseLostError ? 'lost' : Promise.reject(e)));
      const bTakesOver = bKeys!.claim(scope, key, fp({ i })).then(async (outcome) => {
        if (!isHeld(outcome)) return outcome.kind;
        await bKeys!.runEffect(outcome, (tx) =>
          insertEffect(tx, env.schema, { scope, key, fence: outcome.fence, worker: 'B' }),
        );
        return 'B' as const;
      });
      const [aResult, bResult] = await Promise.all([aCompletes, bTakesOver]);
      const effects = await effectsOf(env.db, env.schema, scope, key);
      expect(effects, `iteration ${i}: A=${aResult} B=${bResult}`).toHaveLength(1);
      if (aResult === 'A') tally.aWon++;
      if (bResult === 'B') tally.bWon++;
      expect(tally.aWon + tally.bWon).toBe(i + 1);
    }
    console.log(`completion vs takeover, 200 races: zombie completed ${tally.aWon}, taker completed ${tally.bWon}`);
    await aKeys!.db.destroy();
    await bKeys!.db.destroy();
  });

  it('6. replays the stored result, and refuses the key with a different payload', async () => {
    const key = 'replay';
    const a = held(await keys.claim(scope, key, fp({ amount: 100 })));
    await keys.runEffect(a, async () => ({ chargeId: 'ch_1', amount: 100 }));
    expect(await keys.claim(scope, key, fp({ amount: 100 }))).toEqual({
      kind: 'completed',
      scope,
      key,
      result: { chargeId: 'ch_1', amount: 100 },
    });
    // Key order does not change the fingerprint (canonical JSON).
    expect(fp({ a: 1, b: { c: 2, d: 3 } })).toBe(fp({ b: { d: 3, c: 2 }, a: 1 }));
    expect(await keys.claim(scope, key, fp({ amount: 999 }))).toEqual({ kind: 'key-reused', scope, key });
    // A key reused while still processing is refused too, never executed.
    held(await keys.claim(scope, 'reuse-processing', fp({ amount: 1 })));
    expect((await keys.claim(scope, 'reuse-processing', fp({ amount: 2 }))).kind).toBe('key-reused');
    expect(new KeyReusedError(scope, key).code).toBe('KEY_REUSED');
  });

  it('6b. a permanently failed key replays its failure', async () => {
    const key = 'failed-key';
    const a = held(await keys.claim(scope, key, fp({ n: 6 })));
    expect(await keys.fail(a, new Error('account closed'))).toBe(true);
    const outcome = await keys.claim(scope, key, fp({ n: 6 }));
    expect(outcome).toMatchObject({ kind: 'failed', error: { name: 'Error', message: 'account closed' } });
  });

  it('extend reports a lost lease; release and fail are fenced', async () => {
    const key = 'extend';
    const a = held(await keys.claim(scope, key, fp({ n: 7 }), { leaseMs: 1_000 }));
    const extended = await keys.extend(a, 60_000);
    expect(extended).toBeInstanceOf(Date);
    expect((extended as Date).getTime()).toBeGreaterThan(a.lockedUntil!.getTime());
    await expireLease(env.db, env.schema, scope, key);
    const b = held(await keys.claim(scope, key, fp({ n: 7 })));
    expect(await keys.extend(a)).toBeNull();
    expect(await keys.release(a, new Error('zombie'))).toBe(false);
    expect(await keys.fail(a, new Error('zombie'))).toBe(false);
    expect((await keys.get(scope, key))!.owner).toBe(b.owner);
  });
});

describe('fast path', () => {
  it('7a. executes once in one transaction; a later leased claim replays it', async () => {
    const key = 'fast-1';
    const outcome = await keys.executeOnce(scope, key, fp({ n: 1 }), async (tx, claim) => {
      await insertEffect(tx, env.schema, { scope, key, fence: claim.fence, worker: 'fast' });
      return { ok: true };
    });
    expect(outcome).toMatchObject({ kind: 'executed', result: { ok: true } });
    expect(await keys.claim(scope, key, fp({ n: 1 }))).toMatchObject({ kind: 'completed', result: { ok: true } });
    expect(await keys.executeOnce(scope, key, fp({ n: 1 }), async () => 'again')).toMatchObject({ kind: 'completed' });
    expect(await keys.executeOnce(scope, key, fp({ n: 2 }), async () => 'other')).toMatchObject({ kind: 'key-reused' });
    expect(await effectsOf(env.db, env.schema, scope, key)).toHaveLength(1);
  });

  it('7b. defers to a live leased claim, and takes over an expired one, fencing the zombie out', async () => {
    const key = 'fast-2';
    const a = held(await keys.claim(scope, key, fp({ n: 2 })));
    const deferred = await keys.executeOnce(scope, key, fp({ n: 2 }), async () => 'never');
    expect(deferred.kind).toBe('in-progress');
    await expireLease(env.db, env.schema, scope, key);
    const fast = await keys.executeOnce(scope, key, fp({ n: 2 }), async (tx, claim) => {
      await insertEffect(tx, env.schema, { scope, key, fence: claim.fence, worker: 'fast' });
      return 'fast';
    });
    expect(fast).toMatchObject({ kind: 'executed', claim: { fence: 2 } });
    await expect(
      keys.runEffect(a, (tx) => insertEffect(tx, env.schema, { scope, key, fence: a.fence, worker: 'A' })),
    ).rejects.toBeInstanceOf(LeaseLostError);
    expect(await effectsOf(env.db, env.schema, scope, key)).toEqual([{ fence: 2, worker: 'fast' }]);
  });

  it('7c. a leased claim concurrent with an open fast-path transaction waits, then replays', async () => {
    const key = 'fast-3';
    const gate = createGate();
    const [other] = await separateConnections(1);
    const fast = keys.executeOnce(scope, key, fp({ n: 3 }), async (tx, claim) => {
      await insertEffect(tx, env.schema, { scope, key, fence: claim.fence, worker: 'fast' });
      await gate.wait;
      return 'fast result';
    });
    await new Promise((r) => setTimeout(r, 100)); // the fast path has inserted, uncommitted
    const waiting = other!.claim(scope, key, fp({ n: 3 }));
    await new Promise((r) => setTimeout(r, 100));
    gate.open();
    await fast;
    expect(await waiting).toMatchObject({ kind: 'completed', result: 'fast result' });
    await other!.db.destroy();
  });

  it('7d. the wait on an open fast-path transaction is bounded by claimLockTimeoutMs: in-progress', async () => {
    const key = 'fast-4';
    const gate = createGate();
    const impatient = new IdempotencyKeys({ db: env.openDb(2), schema: env.schema, claimLockTimeoutMs: 200 });
    const fast = keys.executeOnce(scope, key, fp({ n: 4 }), async () => {
      await gate.wait;
      return 'slow';
    });
    await new Promise((r) => setTimeout(r, 100));
    const startedAt = Date.now();
    const outcome = await impatient.claim(scope, key, fp({ n: 4 }));
    expect(outcome).toMatchObject({ kind: 'in-progress', retryAfterMs: 200 });
    expect(Date.now() - startedAt).toBeLessThan(10_000);
    gate.open();
    await fast;
    // The bound was local to the claim: the pooled connection's lock_timeout is back to default.
    const { rows } = await sql<{ lock_timeout: string }>`show lock_timeout`.execute(impatient.db);
    expect(rows[0]!.lock_timeout).toBe('0');
  });

  it('7f. a fast-path claim that times out on another open fast-path transaction reports in-progress', async () => {
    const key = 'fast-6';
    const gate = createGate();
    const impatient = new IdempotencyKeys({ db: env.openDb(2), schema: env.schema, claimLockTimeoutMs: 200 });
    const first = keys.executeOnce(scope, key, fp({ n: 6 }), async () => {
      await gate.wait;
      return 'first';
    });
    await new Promise((r) => setTimeout(r, 100));
    let ran = false;
    const second = await impatient
      .executeOnce(scope, key, fp({ n: 6 }), async () => {
        ran = true;
        return 'second';
      })
      .finally(() => gate.open()); // never leave the first transaction holding the key
    expect(second).toMatchObject({ kind: 'in-progress', retryAfterMs: 200 });
    expect(ran).toBe(false);
    expect(await first).toMatchObject({ kind: 'executed', result: 'first' });
    expect(await impatient.executeOnce(scope, key, fp({ n: 6 }), async () => 'third')).toMatchObject({ kind: 'completed', result: 'first' });
  });

  it('7e. a fast-path effect that throws leaves the key as it was', async () => {
    const key = 'fast-5';
    await expect(
      keys.executeOnce(scope, key, fp({ n: 5 }), async (tx, claim) => {
        await insertEffect(tx, env.schema, { scope, key, fence: claim.fence, worker: 'fast' });
        throw new Error('boom');
      }),
    ).rejects.toThrow('boom');
    expect(await keys.get(scope, key)).toBeUndefined();
    expect((await keys.claim(scope, key, fp({ n: 5 }))).kind).toBe('claimed');
    expect(await effectsOf(env.db, env.schema, scope, key)).toHaveLength(0);
  });
});

describe('bad input', () => {
  it('9. keys and scopes: empty, too long, not a string, NUL', async () => {
    const cases: Array<[unknown, unknown, string, string]> = [
      [scope, '', 'INVALID_KEY', 'key'],
      [scope, 'k'.repeat(256), 'INVALID_KEY', 'key'],
      [scope, 42, 'INVALID_KEY', 'key'],
      [scope, undefined, 'INVALID_KEY', 'key'],
      [scope, 'a\u0000b', 'INVALID_KEY', 'key'],
      ['', 'k', 'INVALID_SCOPE', 'scope'],
      ['s'.repeat(256), 'k', 'INVALID_SCOPE', 'scope'],
    ];
    for (const [s, k, code, field] of cases) {
      const attempt = keys.claim(s as string, k as string, 'fp');
      await expect(attempt).rejects.toBeInstanceOf(ValidationError);
      await expect(attempt).rejects.toMatchObject({ code, field });
    }
    // 255 characters (even multi-byte ones) is fine.
    expect((await keys.claim(scope, 'é'.repeat(255), 'fp')).kind).toBe('claimed');
  });

  it('9. results that cannot be stored roll the effect back and fail the key', async () => {
    const small = new IdempotencyKeys({ db: env.db, schema: env.schema, maxResultBytes: 64 });
    const circular: Record<string, unknown> = {};
    circular.self = circular;
    const cases: Array<[string, unknown]> = [
      ['bigint', { amount: 10n }],
      ['circular', circular],
      ['too-large', { blob: 'x'.repeat(100) }],
      ['nul-char', { text: 'a\u0000b' }],
      ['lone-surrogate', { text: 'half an emoji \ud83d' }],
      ['nul-in-a-name', { ['a\u0000b']: 1 }],
      ['function', () => 1],
    ];
    for (const [key, result] of cases) {
      const claim = held(await small.claim(scope, `unstorable-${key}`, 'fp'));
      const run = small.runEffect(claim, async (tx) => {
        await insertEffect(tx, env.schema, { scope, key: `unstorable-${key}`, fence: claim.fence, worker: 'A' });
        return result;
      });
      await expect(run, key).rejects.toBeInstanceOf(ResultNotStorableError);
      await expect(run).rejects.toMatchObject({ code: 'RESULT_NOT_STORABLE' });
      expect(await effectsOf(env.db, env.schema, scope, `unstorable-${key}`), key).toHaveLength(0);
      expect((await small.get(scope, `unstorable-${key}`))!.status, key).toBe('failed');
    }
    // A backslash followed by the letters u0000 is ordinary text, and a surrogate pair a character.
    const claim = held(await small.claim(scope, 'storable-escapes', 'fp'));
    await small.runEffect(claim, async () => ['C:\\u0000', '\ud83d\ude00']);
    expect(await small.get(scope, 'storable-escapes')).toMatchObject({ status: 'completed', result: ['C:\\u0000', '\ud83d\ude00'] });
  });

  it('9. options are validated with the option named', () => {
    expect(() => new IdempotencyKeys({ db: env.db, leaseMs: -1 })).toThrow(/leaseMs/);
    expect(() => new IdempotencyKeys({ db: env.db, schema: 'Bad-Schema' })).toThrow(/schema/);
    expect(() => new IdempotencyKeys({ db: undefined as never })).toThrow(/db/);
  });
});

describe('a custom KeyStore with only the required methods', () => {
  it('gets the same effect boundary, fencing and fast path (two-round-trip commits)', async () => {
    const full = new PostgresKeyStore(env.db, env.schema, { batchClaims: false, probeSettledKeys: false });
    const minimal: KeyStore = {
      schema: env.schema,
      claim: (executor, input) => full.claim(executor, input),
      complete: (tx, claim, json, retentionMs) => full.complete(tx, claim, json, retentionMs),
      storeFastPathResult: (tx, claim, json, windowLate) => full.storeFastPathResult(tx, claim, json, windowLate),
      extend: (claim, leaseMs, lockTimeoutMs) => full.extend(claim, leaseMs, lockTimeoutMs),
      release: (claim, json, expiresInMs) => full.release(claim, json, expiresInMs),
      fail: (claim, json, retentionMs) => full.fail(claim, json, retentionMs),
      get: (s, k) => full.get(s, k),
    };
    const custom = new IdempotencyKeys({ db: env.db, schema: env.schema, claimLockTimeoutMs: 200 }, minimal);
    const a = held(await custom.claim(scope, 'custom-1', 'fp'));
    await custom.runEffect(a, (tx) => insertEffect(tx, env.schema, { scope, key: 'custom-1', fence: a.fence, worker: 'A' }).then(() => 'ok'));
    expect(await custom.claim(scope, 'custom-1', 'fp')).toMatchObject({ kind: 'completed', result: 'ok' });

    const zombie = held(await custom.claim(scope, 'custom-2', 'fp'));
    await expireLease(env.db, env.schema, scope, 'custom-2');
    held(await custom.claim(scope, 'custom-2', 'fp'));
    await expect(
      custom.runEffect(zombie, (tx) => insertEffect(tx, env.schema, { scope, key: 'custom-2', fence: zombie.fence, worker: 'Z' })),
    ).rejects.toBeInstanceOf(LeaseLostError);
    expect(await effectsOf(env.db, env.schema, scope, 'custom-2')).toHaveLength(0);

    expect(await custom.executeOnce(scope, 'custom-3', 'fp', async () => ({ fast: true }))).toMatchObject({ kind: 'executed' });
    expect(await custom.claim(scope, 'custom-3', 'fp')).toMatchObject({ kind: 'completed', result: { fast: true } });
    const gate = createGate();
    const first = keys.executeOnce(scope, 'custom-4', 'fp', async () => {
      await gate.wait;
      return 'first';
    });
    await new Promise((r) => setTimeout(r, 100));
    const second = await custom.executeOnce(scope, 'custom-4', 'fp', async () => 'second').finally(() => gate.open());
    expect(second).toMatchObject({ kind: 'in-progress' });
    await first;
  });
});

describe('a claim whose reply is lost', () => {
  it('is asked again with its owner token and returns the claim that committed: the key is not left held by a claim nobody knows', async () => {
    const faults = StatementFaults.open({ connectionString: env.databaseUrl, maxConnections: 2, preparedStatements: env.preparedStatements });
    try {
      const cut = new IdempotencyKeys({ db: faults.db, schema: env.schema, leaseMs: 600_000 }, new PostgresKeyStore(faults.db, env.schema, { batchClaims: false }));
      faults.arm({ nth: 1, match: /claim_key/, fault: { kind: 'cut', when: 'after' } });
      const outcome = held(await cut.claim(scope, 'lost-reply', 'fp'));
      expect(faults.fired).toHaveLength(1);
      expect(outcome).toMatchObject({ kind: 'claimed', fence: 1, attempts: 1 });
      // The claim that committed is this one: it completes.
      expect(await keys.get(scope, 'lost-reply')).toMatchObject({ owner: outcome.owner, fence: 1 });
      await cut.runEffect(outcome, async () => ({ ok: true }));
      expect(await keys.get(scope, 'lost-reply')).toMatchObject({ status: 'completed', result: { ok: true } });

      // A claim that did not commit is simply made on the second ask.
      faults.arm({ nth: 1, match: /claim_key/, fault: { kind: 'cut', when: 'before' } });
      expect(await cut.claim(scope, 'lost-before', 'fp')).toMatchObject({ kind: 'claimed', fence: 1 });
      // Asked once more only: a fault that lasts is the caller's store fault.
      faults.arm({ nth: 1, match: /claim_key/, fault: { kind: 'cut', when: 'before' }, times: 2 });
      await expect(cut.claim(scope, 'lost-twice', 'fp')).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' });

      // Both asks committed, both replies lost: the key's next claim (the job's redelivery) is
      // made under the same token and gets the key at once, not after the lease.
      faults.arm({ nth: 1, match: /claim_key/, fault: { kind: 'cut', when: 'after' }, times: 2 });
      await expect(cut.claim(scope, 'lost-for-a-while', 'fp')).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' });
      const orphan = await keys.get(scope, 'lost-for-a-while');
      expect(orphan).toMatchObject({ status: 'processing', fence: 1 });
      const redelivered = held(await cut.claim(scope, 'lost-for-a-while', 'fp'));
      expect(redelivered).toMatchObject({ kind: 'claimed', fence: 1, owner: orphan!.owner });
      // Forgotten once answered: the claim after it is an ordinary duplicate.
      expect(await cut.claim(scope, 'lost-for-a-while', 'fp')).toMatchObject({ kind: 'in-progress' });

      // Two deliveries of such a key claimed at once (a job and its duplicate, in one worker):
      // only one carries the remembered token and gets the key; the other finds it held.
      faults.arm({ nth: 1, match: /claim_key/, fault: { kind: 'cut', when: 'after' }, times: 2 });
      await expect(cut.claim(scope, 'lost-then-twice', 'fp')).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' });
      const both = await Promise.all([cut.claim(scope, 'lost-then-twice', 'fp'), cut.claim(scope, 'lost-then-twice', 'fp')]);
      expect(both.map((claim) => claim.kind).sort()).toEqual(['claimed', 'in-progress']);
    } finally {
      await faults.close();
    }
  });
});

describe('UncertainClaims', () => {
  it('gives a token to one claim only, keeps it for one lease at most, and the most recent keys when there are too many', () => {
    let now = 0;
    const uncertain = new UncertainClaims({ maxTracked: 2, now: () => now });
    uncertain.remember('a', 'token-a', 1_000);
    expect(uncertain.take('a')).toBe('token-a');
    // Taken once: a second claim of the key does not carry it.
    expect(uncertain.take('a')).toBeUndefined();
    uncertain.remember('a', 'token-a2', 1_000);
    now = 1_000;
    expect(uncertain.take('a')).toBeUndefined();
    expect(uncertain.size).toBe(0);
    for (const k of ['b', 'c', 'd']) uncertain.remember(k, `token-${k}`, 1_000);
    expect([uncertain.take('b'), uncertain.take('c'), uncertain.take('d')]).toEqual([undefined, 'token-c', 'token-d']);
    expect(uncertain.size).toBe(0);
  });
});
