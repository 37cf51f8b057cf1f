/**
 * The concurrency slots' heartbeat on real Postgres: a run whose renewals stop being confirmed
 * learns that its slot is lost before another run can take the slot, even while a renewal hangs
 * (a loaded or stalled Postgres), so that it rolls back rather than run or commit beside the
 * other run.
 */
import { pino } from 'pino';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { IdempotencyKeys, type ConcurrencySlot } from '../src/index.js';
import { ConcurrencySlotLostError, startSlotHeartbeat } from '../src/consumer/concurrency-slot-heartbeat.js';
import { JobLogger } from '../src/consumer/job-logger.js';
import { PostgresKeyStore, type KeyStore } from '../src/store/index.js';
import { sleep } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const SCOPE = 'slot-heartbeat';
const LEASE_MS = 300;
const HEARTBEAT_MS = 100;

let env: TestEnv;
beforeAll(async () => {
  env = await createTestEnv('concurrency_slot_heartbeat');
});
afterAll(async () => {
  await env?.teardown();
});

/** The store, with every slot renewal held `delayMs` before it is sent: a Postgres that answers late. */
function slowRenewals(store: KeyStore, delayMs: number): KeyStore {
  return new Proxy(store, {
    get(target, property) {
      const value = Reflect.get(target, property, target) as unknown;
      if (property === 'renewSlots') {
        return async (...args: Parameters<NonNullable<KeyStore['renewSlots']>>) => {
          await sleep(delayMs);
          return target.renewSlots!(...args);
        };
      }
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
}

it('a renewal that hangs does not hold off the loss: the run knows its slot is lost before another run can take it', async () => {
  const store = new PostgresKeyStore(env.db, env.schema);
  const slowKeys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: LEASE_MS }, slowRenewals(store, 2_000));
  const keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: LEASE_MS });
  const group = { key: 'tenant:hung-renewal', limit: 1 };

  const heldSince = performance.now();
  const slot = await slowKeys.acquireConcurrencySlot(SCOPE, 'first', group, { leaseMs: LEASE_MS, starvationMs: 60_000 });
  expect(slot.acquired).toBe(true);
  const heartbeat = startSlotHeartbeat({
    keys: slowKeys, holder: () => ({ scope: SCOPE, key: 'first', log: new JobLogger(pino({ level: 'silent' }), {}) }),
    slots: [slot as ConcurrencySlot], leaseMs: LEASE_MS, heartbeatMs: HEARTBEAT_MS, heldSince,
  });
  try {
    // Another run asks for the slot until it gets it: once the first one's time is up in the database.
    let second: Awaited<ReturnType<IdempotencyKeys['acquireConcurrencySlot']>>;
    do {
      await sleep(10);
      second = await keys.acquireConcurrencySlot(SCOPE, 'second', group, { leaseMs: LEASE_MS, starvationMs: 60_000 });
    } while (!second.acquired);
    expect(heartbeat.signal.aborted).toBe(true);
    expect(heartbeat.signal.reason).toBeInstanceOf(ConcurrencySlotLostError);
    expect((heartbeat.signal.reason as Error).message).toContain(`no renewal confirmed for ${LEASE_MS} ms`);
  } finally {
    heartbeat.stop();
  }
});
