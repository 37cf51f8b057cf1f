/**
 * Giving a key back when the store refuses: the release on a full disk writes less (the owner
 * token cleared, nothing indexed or growing), and a release a store fault refused is tried again
 * in the background until it goes through, the claim no longer owns the key, or the lease ended.
 * The faults are real Postgres errors raised in place of the release's statement
 * (test/support/statement-faults.ts); the disk itself fills in test/full-disk.test.ts.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, StoreUnavailableError, isHeld, resolveWorkerTiming, type Claim } from '../src/index.js';
import { ReleaseRetries } from '../src/consumer/release-retries.js';
import { StatementFaults } from './support/statement-faults.js';
import { waitFor } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let faults: StatementFaults;
let keys: IdempotencyKeys;
const scope = 'release';
const LEASE_MS = 600_000;
/** The release's own UPDATE (it ends the lease); the full-disk release does not. */
const FULL_RELEASE = /locked_until = now\(\),\s+error =/;
/** Either release statement. */
const ANY_RELEASE = /set owner = null/;

beforeAll(async () => {
  env = await createTestEnv('key_release');
  faults = StatementFaults.open({ connectionString: env.databaseUrl, maxConnections: 4, preparedStatements: env.preparedStatements });
  keys = new IdempotencyKeys({ db: faults.db, schema: env.schema, leaseMs: LEASE_MS });
});
afterAll(async () => {
  await faults?.close();
  await env?.teardown();
});

let n = 0;
async function claimed(): Promise<Claim> {
  const outcome = await keys.claim(scope, `key-${++n}`, 'f');
  if (!isHeld(outcome)) throw new Error(`not claimed: ${outcome.kind}`);
  return outcome;
}
async function rowOf(claim: Claim) {
  const { rows } = await sql<{ owner: string | null; live: boolean; error: unknown }>`
    select owner, locked_until > now() as live, error from ${sql.id(env.schema, 'idempotency_keys')}
     where scope = ${claim.scope} and key = ${claim.key}`.execute(env.db);
  return rows[0]!;
}

describe('the release on a full disk', () => {
  it('clears the owner token when the full release meets 53100: the key is taken over at once, its lease end and error left as they were', async () => {
    const claim = await claimed();
    faults.arm({ nth: 1, match: FULL_RELEASE, fault: { kind: 'error', sqlState: '53100', message: 'could not extend file "base/5/16398_fsm": No space left on device' } });
    expect(await keys.release(claim, new Error('disk full'))).toBe(true);
    expect(faults.armed).toBe(false);
    expect(await rowOf(claim)).toEqual({ owner: null, live: true, error: null });
    const next = await keys.claim(scope, claim.key, 'f');
    expect(next).toMatchObject({ kind: 'taken-over', fence: claim.fence + 1 });
  });

  it('is fenced like the release: a claim that lost the key changes nothing', async () => {
    const claim = await claimed();
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 second' where scope = ${scope} and key = ${claim.key}`.execute(env.db);
    const successor = await keys.claim(scope, claim.key, 'f');
    expect(successor.kind).toBe('taken-over');
    faults.arm({ nth: 1, match: FULL_RELEASE, fault: { kind: 'error', sqlState: '53100' } });
    expect(await keys.release(claim)).toBe(false);
    expect((await rowOf(claim)).owner).toBe((successor as Claim).owner);
  });

  it('is sent only for a full disk: another fault of the release is thrown as a store fault', async () => {
    const claim = await claimed();
    faults.arm({ nth: 1, match: ANY_RELEASE, fault: { kind: 'error', sqlState: '40001' }, times: Infinity });
    await expect(keys.release(claim)).rejects.toBeInstanceOf(StoreUnavailableError);
    expect(faults.fired.at(-1)!.statement.text).toMatch(/locked_until = now\(\)/);
    faults.disarm();
    expect((await rowOf(claim)).owner).toBe(claim.owner);
  });
});

describe('ReleaseRetries', () => {
  const timing = resolveWorkerTiming({ storeRetryMinMs: 5, storeRetryMaxMs: 20, deferJitterRatio: 0 }, LEASE_MS);

  it('releases at once when the store takes it', async () => {
    const claim = await claimed();
    expect(await new ReleaseRetries({ keys, timing }).release(claim, { error: new Error('retry me') })).toBe('released');
    expect(await rowOf(claim)).toMatchObject({ owner: null, live: false, error: { message: 'retry me' } });
  });

  it('tries a refused release again in the background until it goes through, and says so', async () => {
    const claim = await claimed();
    const retries = new ReleaseRetries({ keys, timing });
    let later = 0;
    // Both releases refused three times: a disk that stays full a while, then has room.
    faults.arm({ nth: 1, match: ANY_RELEASE, fault: { kind: 'error', sqlState: '53100' }, times: 6 });
    expect(await retries.release(claim, { onReleasedLater: () => later++ })).toBe('retrying');
    expect(retries.pending).toBe(1);
    await waitFor('the release to go through', async () => later === 1);
    expect(retries.pending).toBe(0);
    expect((await rowOf(claim)).owner).toBeNull();
  });

  it('stops when the claim no longer owns the key: a late release never gives back a successor', async () => {
    const claim = await claimed();
    const timers: Array<() => void> = [];
    const retries = new ReleaseRetries({ keys, timing, setTimer: (run) => void timers.push(run) });
    faults.arm({ nth: 1, match: ANY_RELEASE, fault: { kind: 'cut', when: 'before' } });
    expect(await retries.release(claim)).toBe('retrying');
    faults.disarm();
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 second' where scope = ${scope} and key = ${claim.key}`.execute(env.db);
    const successor = await keys.claim(scope, claim.key, 'f');
    expect(successor.kind).toBe('taken-over');
    timers.shift()!();
    await waitFor('the retry to end', async () => retries.pending === 0);
    expect(timers).toEqual([]);
    expect((await rowOf(claim)).owner).toBe((successor as Claim).owner);
  });

  it('gives up once the lease has ended (anyone may take the key over then), and on an error that is no store fault', async () => {
    let now = 0;
    const timers: Array<() => void> = [];
    const retries = new ReleaseRetries({ keys, timing, setTimer: (run) => void timers.push(run), now: () => now });
    const claim = await claimed();
    faults.arm({ nth: 1, match: ANY_RELEASE, fault: { kind: 'error', sqlState: '53100' }, times: Infinity });
    expect(await retries.release(claim)).toBe('retrying');
    timers.shift()!();
    await waitFor('the second try', async () => timers.length === 1);
    now = LEASE_MS;
    timers.shift()!();
    await waitFor('the retries to end', async () => retries.pending === 0);
    expect(timers).toEqual([]);
    faults.disarm();
    expect((await rowOf(claim)).owner).toBe(claim.owner);

    const refused = await claimed();
    faults.arm({ nth: 1, match: ANY_RELEASE, fault: { kind: 'error', sqlState: '42501' } });
    expect(await retries.release(refused)).toBe('not-released');
    expect(retries.pending).toBe(0);
  });
});
