/**
 * Claim batching (group commit of leased claims): concurrent claims through one store go out
 * as `claim_keys` statements, each claim keeps its own outcome, and a batch that fails as a whole
 * falls back to single claims. And the fast path's settled-key probe: a duplicate replays from
 * one read, without a transaction; and its claim of a new key (`claim_new_key`), with
 * `claim_key` in the same transaction for a key that has a row.
 */
import { Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomUUID } from 'node:crypto';
import { IdempotencyKeys, isHeld } from '../src/index.js';
import { PostgresKeyStore } from '../src/store/postgres-key-store.js';
import { claimKeysBatch } from '../src/store/sql/claim-batch.js';
import { classifyClaimRow } from '../src/store/sql/claim.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';
import type { ClaimStatementInput } from '../src/store/records.js';

let env: TestEnv;
let db: Kysely<any>;
const statements: string[] = [];
const scope = 'batch';

beforeAll(async () => {
  env = await createTestEnv('claim-batcher');
  // A pool of our own whose queries we can see, to tell batches from single claims.
  db = new Kysely<any>({
    dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: env.databaseUrl, max: 4 }) }),
    log: (event) => {
      statements.push(event.query.sql); // 'query' and 'error' (a batch that failed as a whole)
    },
  });
});
afterAll(async () => {
  await db?.destroy();
  await env?.teardown();
});

const batches = () => statements.filter((s) => s.includes('claim_keys')).length;

describe('claim batching', () => {
  it('40 concurrent claims of 20 keys (two each) through one store: one claim per key, in batches', async () => {
    const keys = new IdempotencyKeys({ db, schema: env.schema });
    const before = batches();
    const names = Array.from({ length: 20 }, (_, i) => `k${i}`);
    const outcomes = await Promise.all([...names, ...names].map((key) => keys.claim(scope, key, keys.fingerprint({ key }))));
    for (const key of names) {
      const mine = outcomes.filter((o) => o.key === key);
      expect(mine.map((o) => o.kind).sort()).toEqual(['claimed', 'in-progress']);
    }
    expect(batches()).toBeGreaterThan(before);
    // Each winner really holds its key: fenced completion succeeds.
    for (const outcome of outcomes.filter(isHeld)) await keys.runEffect(outcome, async () => ({ ok: outcome.key }));
    const replay = await keys.claim(scope, 'k7', keys.fingerprint({ key: 'k7' }));
    expect(replay).toMatchObject({ kind: 'completed', result: { ok: 'k7' } });
  });

  it('a batch outcome per input: replayed, reused, failed and new keys in one go', async () => {
    const keys = new IdempotencyKeys({ db, schema: env.schema });
    const done = await keys.claim(scope, 'done', keys.fingerprint('a'));
    if (!isHeld(done)) throw new Error(`expected a claim, got ${done.kind}`);
    await keys.runEffect(done, async () => 'result-a');
    const broken = await keys.claim(scope, 'broken', keys.fingerprint('b'));
    if (!isHeld(broken)) throw new Error(`expected a claim, got ${broken.kind}`);
    await keys.fail(broken, new Error('card declined'));
    const before = batches();
    const [replayed, reused, failed, fresh, fresh2] = await Promise.all([
      keys.claim(scope, 'done', keys.fingerprint('a')),
      keys.claim(scope, 'done', keys.fingerprint('other payload')),
      keys.claim(scope, 'broken', keys.fingerprint('b')),
      keys.claim(scope, 'fresh', keys.fingerprint('c')),
      keys.claim(scope, 'fresh-2', keys.fingerprint('d')),
    ]);
    expect(batches()).toBeGreaterThan(before);
    expect(replayed).toMatchObject({ kind: 'completed', result: 'result-a' });
    expect(reused.kind).toBe('key-reused');
    expect(failed).toMatchObject({ kind: 'failed', error: { message: 'card declined' } });
    expect(fresh).toMatchObject({ kind: 'claimed', fence: 1 });
    expect(fresh2).toMatchObject({ kind: 'claimed', fence: 1 });
  });

  it('a batch that fails as a whole (one key held by an open fast-path transaction) falls back to single claims', async () => {
    const keys = new IdempotencyKeys({ db, schema: env.schema, claimLockTimeoutMs: 200 });
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    const started = new Promise<void>((resolve) => {
      void keys.executeOnce(scope, 'locked', keys.fingerprint('l'), async () => {
        resolve();
        await held;
        return 'fast';
      });
    });
    await started;
    const before = batches();
    // The four claims of one turn go out as one batch, which the lock timeout on 'locked'
    // aborts; then each is claimed alone.
    const outcomes = await Promise.all(
      ['free-1', 'free-2', 'locked', 'free-3'].map((key) => keys.claim(scope, key, keys.fingerprint(key === 'locked' ? 'l' : key))),
    );
    release();
    expect(batches()).toBeGreaterThan(before);
    expect(outcomes[2]).toMatchObject({ kind: 'in-progress', retryAfterMs: 200 });
    expect([outcomes[0], outcomes[1], outcomes[3]].map((o) => o?.kind)).toEqual(['claimed', 'claimed', 'claimed']);
    // Nothing of the aborted batch committed twice: free-3 has one claim, fence 1.
    expect(outcomes[3]).toMatchObject({ fence: 1, attempts: 1 });
  });

  it('one claim_keys statement answers each input as claim_key would: new keys inserted together, every other key on its own', async () => {
    const keys = new IdempotencyKeys({ db, schema: env.schema });
    const settle = async (key: string, fingerprint: string, how: 'complete' | 'fail' | 'hold') => {
      const claim = await keys.claim(scope, key, keys.fingerprint(fingerprint));
      if (!isHeld(claim)) throw new Error(`expected a claim of ${key}, got ${claim.kind}`);
      if (how === 'complete') await keys.runEffect(claim, async () => `result-${key}`);
      if (how === 'fail') await keys.fail(claim, new Error('declined'));
    };
    await settle('set-done', 'a', 'complete');
    await settle('set-broken', 'b', 'fail');
    await settle('set-live', 'c', 'hold');
    await settle('set-expired', 'd', 'hold');
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 second'
               where scope = ${scope} and key = 'set-expired'`.execute(db);

    const input = (key: string, fingerprint: string): ClaimStatementInput => ({
      schema: env.schema, scope, key, fingerprint: keys.fingerprint(fingerprint), owner: randomUUID(), mode: 'lease',
      leaseMs: 30_000, lockTimeoutMs: 2_000, retentionMs: 60_000, jobId: `job-${key}`, queue: 'q', jobName: 'n',
      payloadJson: JSON.stringify({ key }),
    });
    const inputs = [
      input('set-new-1', 'n1'),
      input('set-done', 'a'),
      input('set-new-1', 'n1'), // the same key again in the batch: sees the first one's lease
      input('set-expired', 'd'),
      input('set-done', 'other payload'),
      input('set-broken', 'b'),
      input('set-live', 'c'),
      input('set-new-2', 'n2'),
    ];
    const startedAt = Date.now();
    const rows = await claimKeysBatch(db, env.schema, inputs);
    expect(rows.map((row) => row.idx)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    const outcomes = rows.map((row, i) => classifyClaimRow(inputs[i]!, row));
    expect(outcomes.map((o) => (o === 'again' ? o : o.kind))).toEqual([
      'claimed', 'completed', 'in-progress', 'taken-over', 'key-reused', 'failed', 'in-progress', 'claimed',
    ]);
    expect(outcomes[0]).toMatchObject({ fence: 1, attempts: 1, owner: inputs[0]!.owner });
    expect(outcomes[7]).toMatchObject({ fence: 1, attempts: 1, owner: inputs[7]!.owner });
    expect(outcomes[1]).toMatchObject({ result: 'result-set-done' });
    expect(outcomes[3]).toMatchObject({ fence: 2, attempts: 2, owner: inputs[3]!.owner });
    // Each new key's row is what claim_key inserts: processing under the claim's owner and lease.
    for (const i of [0, 7]) {
      const claimed = outcomes[i] as { lockedUntil: Date };
      expect(claimed.lockedUntil.getTime()).toBeGreaterThanOrEqual(startedAt + 30_000 - 2_000);
      const stored = await keys.get(scope, inputs[i]!.key);
      expect(stored).toMatchObject({
        status: 'processing', owner: inputs[i]!.owner, fence: 1, attempts: 1, jobId: inputs[i]!.jobId, queue: 'q', jobName: 'n',
        payload: { key: inputs[i]!.key }, fingerprint: inputs[i]!.fingerprint,
      });
      expect(stored!.lockedUntil!.getTime()).toBe(claimed.lockedUntil.getTime());
    }
  });

  it('a committed claim whose reply was lost, claimed again with the same input (same owner token), holds the key with the same fence', async () => {
    const keys = new IdempotencyKeys({ db, schema: env.schema });
    const input = (key: string, owner = randomUUID()): ClaimStatementInput => ({
      schema: env.schema, scope, key, fingerprint: keys.fingerprint({ key }), owner, mode: 'lease',
      leaseMs: 30_000, lockTimeoutMs: 2_000, retentionMs: 60_000, jobId: `job-${key}`, queue: 'q', jobName: 'n',
    });
    for (const batchClaims of [true, false]) {
      // The claim batcher re-claims a batch's inputs alone, with their owner tokens, after a batch error.
      const store = new PostgresKeyStore(db, env.schema, { batchClaims });
      const lost = input(`lost-reply-${batchClaims}`);
      const first = await store.claim(db, lost);
      expect(first).toMatchObject({ kind: 'claimed', fence: 1, owner: lost.owner });
      const again = await store.claim(db, lost);
      expect(again).toMatchObject({ kind: 'claimed', fence: 1, attempts: 1, owner: lost.owner });
      // Anyone else still finds the key in progress; the owner completes it.
      expect((await store.claim(db, input(lost.key))).kind).toBe('in-progress');
      if (!isHeld(again)) throw new Error('expected a held claim');
      await keys.runEffect(again, async () => 'done');
      expect(await keys.get(scope, lost.key)).toMatchObject({ status: 'completed', fence: 1, result: 'done' });
    }

    // A takeover whose reply was lost: taken over again by the same token, same fence.
    const store = new PostgresKeyStore(db, env.schema, { batchClaims: false });
    const expiring = input('lost-takeover');
    await store.claim(db, expiring);
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 second' where key = 'lost-takeover'`.execute(db);
    const taker = input('lost-takeover');
    expect(await store.claim(db, taker)).toMatchObject({ kind: 'taken-over', fence: 2 });
    expect(await store.claim(db, taker)).toMatchObject({ kind: 'taken-over', fence: 2, attempts: 2, owner: taker.owner });

    // The same in claim_keys, for a batch that was sent again as a whole.
    const batched = input('lost-batch');
    const other = input('lost-batch-other');
    await claimKeysBatch(db, env.schema, [batched, other]);
    const rows = await claimKeysBatch(db, env.schema, [batched, other]);
    expect(rows.map((row, i) => classifyClaimRow([batched, other][i]!, row))).toMatchObject([
      { kind: 'claimed', fence: 1, owner: batched.owner },
      { kind: 'claimed', fence: 1, owner: other.owner },
    ]);
  });

  it('batchClaims: false sends every claim alone', async () => {
    const keys = new IdempotencyKeys({ db, schema: env.schema }, new PostgresKeyStore(db, env.schema, { batchClaims: false }));
    const before = batches();
    const outcomes = await Promise.all(['s1', 's2', 's3', 's4'].map((key) => keys.claim(scope, key, keys.fingerprint(key))));
    expect(outcomes.map((o) => o.kind)).toEqual(['claimed', 'claimed', 'claimed', 'claimed']);
    expect(batches()).toBe(before);
  });

  it('the batch function is installed by the migrations', async () => {
    const { rows } = await sql<{ n: number }>`
      select count(*)::int as n from pg_proc p join pg_namespace n on n.oid = p.pronamespace
       where n.nspname = ${env.schema} and p.proname in ('claim_key', 'claim_keys')`.execute(db);
    expect(rows[0]!.n).toBe(2);
  });

  it('fast path: once duplicates show up, a settled key replays from one read without a transaction', async () => {
    const keys = new IdempotencyKeys({ db, schema: env.schema });
    let runs = 0;
    const effect = async () => ({ run: ++runs });
    const first = await keys.executeOnce(scope, 'probe-1', keys.fingerprint('p'), effect);
    expect(first).toMatchObject({ kind: 'executed', result: { run: 1 } });
    // The probe starts rare (every 16th call) and becomes constant once it keeps finding
    // settled keys; every call replays either way, and the effect never runs again.
    const perCall: string[][] = [];
    for (let i = 0; i < 64; i++) {
      const before = statements.length;
      const again = await keys.executeOnce(scope, 'probe-1', keys.fingerprint('p'), effect);
      expect(again).toMatchObject({ kind: 'completed', result: { run: 1 } });
      perCall.push(statements.slice(before));
    }
    const probeOnly = perCall.filter((sent) => sent.length === 1 && sent[0]!.includes('unnest'));
    expect(probeOnly.length).toBeGreaterThan(0);
    // The last calls all replay from the read alone: no BEGIN.
    for (const sent of perCall.slice(-8)) expect(sent).toHaveLength(1);
    expect(await keys.executeOnce(scope, 'probe-1', keys.fingerprint('other'), effect)).toMatchObject({ kind: 'key-reused' });
    expect(runs).toBe(1);
  });

  it('fast path with probeSettledKeys: false claims inside the transaction (BEGIN, the new-key claim, claim_key, ROLLBACK) and still replays', async () => {
    const keys = new IdempotencyKeys({ db, schema: env.schema }, new PostgresKeyStore(db, env.schema, { probeSettledKeys: false }));
    let before = statements.length;
    await keys.executeOnce(scope, 'probe-2', keys.fingerprint('q'), async () => 'once');
    // A new key: claimed by claim_new_key alone (this pool sends BEGIN on its own).
    expect(statements.slice(before, before + 2)).toEqual(['begin isolation level read committed', expect.stringMatching(/claim_new_key"\(/)]);
    expect(statements.slice(before).some((q) => q.includes('claim_key"('))).toBe(false);
    before = statements.length;
    const again = await keys.executeOnce(scope, 'probe-2', keys.fingerprint('q'), async () => 'twice');
    expect(again).toMatchObject({ kind: 'completed', result: 'once' });
    // A key with a row: claim_new_key says so, and claim_key (same transaction) replays it.
    const sent = statements.slice(before);
    expect(sent.map((q) => q.trim().split(/\s+/)[0]!.toLowerCase())).toEqual(['begin', 'select', 'select', 'rollback']);
    expect(sent[1]).toMatch(/claim_new_key"\(/);
    expect(sent[2]).toMatch(/claim_key"\(/);
  });

  it('fast path without group commit: a key with a row falls back to claim_key in the same transaction, whatever its state', async () => {
    const keys = new IdempotencyKeys({ db, schema: env.schema }, new PostgresKeyStore(db, env.schema, { probeSettledKeys: false }));
    const runs: string[] = [];
    const effect = (label: string) => async (tx: Kysely<any>) => {
      runs.push(label);
      await sql`select 1`.execute(tx);
      return label;
    };
    // An expired lease: taken over (fence 2) and run once.
    const held = await keys.claim(scope, 'fp-expired', keys.fingerprint('e'));
    if (!isHeld(held)) throw new Error(`expected a claim, got ${held.kind}`);
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 second'
               where scope = ${scope} and key = 'fp-expired'`.execute(db);
    expect(await keys.executeOnce(scope, 'fp-expired', keys.fingerprint('e'), effect('takeover'))).toMatchObject({
      kind: 'executed',
      claim: { kind: 'taken-over', fence: 2 },
    });
    // A live lease: in progress, nothing run. A reused key: refused, nothing run.
    const live = await keys.claim(scope, 'fp-live', keys.fingerprint('l'));
    if (!isHeld(live)) throw new Error(`expected a claim, got ${live.kind}`);
    expect(await keys.executeOnce(scope, 'fp-live', keys.fingerprint('l'), effect('live'))).toMatchObject({ kind: 'in-progress' });
    expect(await keys.executeOnce(scope, 'fp-expired', keys.fingerprint('other'), effect('reused'))).toMatchObject({ kind: 'key-reused' });
    expect(runs).toEqual(['takeover']);
    expect(await keys.get(scope, 'fp-expired')).toMatchObject({ status: 'completed', fence: 2, attempts: 2, result: 'takeover' });
  });
});
