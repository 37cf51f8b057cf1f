import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, KeySettledListener, isHeld, type ClaimOutcome, type HeldClaim } from '../src/index.js';
import { keySettledChannel } from '../src/store/channels.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let keys: IdempotencyKeys;
let listener: KeySettledListener;
/** A raw LISTEN on the schema's channel: every notification that went out. */
let spy: pg.Client;
const heard: string[] = [];
const scope = 'notify';

beforeAll(async () => {
  env = await createTestEnv('listener');
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000 });
  listener = new KeySettledListener({ connectionString: env.databaseDirectUrl, schema: env.schema });
  spy = new pg.Client({ connectionString: env.databaseDirectUrl });
  await spy.connect();
  spy.on('notification', (message) => heard.push(JSON.parse(message.payload ?? '{}').key));
  await spy.query(`LISTEN ${pg.escapeIdentifier(keySettledChannel(env.schema))}`);
});
afterAll(async () => {
  await spy?.end();
  await listener?.close();
  await env?.teardown();
});

function held(outcome: ClaimOutcome): HeldClaim {
  if (!isHeld(outcome)) throw new Error(`expected a held claim, got ${outcome.kind}`);
  return outcome;
}

/** Resolves after a round trip on the spy's own connection, so notifications already sent have been read. */
async function drainSpy(): Promise<void> {
  await spy.query('select 1');
}

describe('key-settled notifications go out only for keys someone waits on', () => {
  it('1. completions and failures nobody waits for send no notification', async () => {
    const completed = held(await keys.claim(scope, 'quiet-complete', keys.fingerprint({})));
    await keys.runEffect(completed, async () => 'done');
    const failed = held(await keys.claim(scope, 'quiet-fail', keys.fingerprint({})));
    await keys.fail(failed, new Error('no'));
    const fast = await keys.executeOnce(scope, 'quiet-fast', keys.fingerprint({}), async () => 'fast');
    expect(fast.kind).toBe('executed');
    await drainSpy();
    expect(heard.filter((k) => k.startsWith('quiet-'))).toEqual([]);
  });

  it('2. a waiter is woken by the notification itself (its own looks never see the key settled)', async () => {
    const claim = held(await keys.claim(scope, 'waited-on', keys.fingerprint({})));
    // isSettled always answers false, so only the notification can end this wait with true.
    const woken = listener.waitForSettled(scope, 'waited-on', 20_000, async () => false);
    await waitUntil(async () => (await keys.get(scope, 'waited-on'))?.status === 'processing' && (await hasWaiters('waited-on')));
    await keys.runEffect(claim, async () => 'done');
    expect(await woken).toBe(true);
    await drainSpy();
    expect(heard).toContain('waited-on');
  });

  it('3. a fast-path takeover of a key someone waits on notifies; a waiter of a key with no row yet is answered by its looks', async () => {
    const claim = held(await keys.claim(scope, 'fast-takeover', keys.fingerprint({}), { leaseMs: 1 }));
    expect(claim.fence).toBe(1);
    const woken = listener.waitForSettled(scope, 'fast-takeover', 20_000, async () => false);
    await waitUntil(() => hasWaiters('fast-takeover'));
    const outcome = await keys.executeOnce(scope, 'fast-takeover', keys.fingerprint({}), async () => 'taken');
    expect(outcome.kind).toBe('executed');
    expect(await woken).toBe(true);

    // No row when the wait begins: nothing can ask for a notification, the repeated look finds it.
    let looks = 0;
    const looked = listener.waitForSettled(scope, 'not-yet', 20_000, async () => {
      looks++;
      return (await keys.get(scope, 'not-yet'))?.status === 'completed';
    });
    await keys.executeOnce(scope, 'not-yet', keys.fingerprint({}), async () => 'later');
    expect(await looked).toBe(true);
    expect(looks).toBeGreaterThanOrEqual(1);
  });
});

async function hasWaiters(key: string): Promise<boolean> {
  const row = await env.db
    .selectFrom(`${env.schema}.idempotency_keys`)
    .select('has_waiters')
    .where('scope', '=', scope)
    .where('key', '=', key)
    .executeTakeFirst();
  return row?.has_waiters === true;
}

async function waitUntil(condition: () => Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
