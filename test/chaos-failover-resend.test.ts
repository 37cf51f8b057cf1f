// @module-tag redis
/**
 * The Sentinel chaos profile's re-sending after failovers: which keys a producer sends again
 * (those acknowledged around a change of master), and that sending them again brings back a
 * job Redis lost without adding a second job where it survived. A window that missed the adds
 * a failover lost, or a re-send that did not re-add them, would leave the profile failing on
 * its losses; one that added jobs twice would hide nothing but would not be the remedy the
 * operations guide describes.
 */
import { Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { jobIdFor } from '../src/index.js';
import { RESEND_AFTER_MS, RESEND_BEFORE_MS, keysToResend, resendWindows } from './chaos/failover-resend.js';
import type { NemesisEvent } from './chaos/nemesis.js';
import { resendKeys, type ProducedKey } from './chaos/producer-load.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const T0 = 1_700_000_000_000;
const event = (kind: NemesisEvent['kind'], at: number, endedAt: number, skipped?: string): NemesisEvent => ({
  atMs: 0, kind, slot: 0, at: T0 + at, endedAt: T0 + endedAt, ...(skipped ? { skipped } : {}),
});
const produced = (n: number, ...ackedAt: number[]): ProducedKey => ({
  scope: 'acme', key: `order-${n}`, payload: { n, workMs: 0 }, acks: ackedAt.length, ackedAt: ackedAt.map((at) => T0 + at),
});

describe('resendWindows', () => {
  it('spans each change of master carried out, from before it began to after it was over', () => {
    const windows = resendWindows([
      event('redis-failover', 60_000, 63_000),
      event('redis-restart', 90_000, 95_000),
      event('redis-client-kill', 20_000, 20_010),
      event('kill', 30_000, 30_000),
      event('redis-failover', 100_000, 100_000, 'failed: no master'),
    ]);
    expect(windows).toEqual([
      { from: T0 + 60_000 - RESEND_BEFORE_MS, to: T0 + 63_000 + RESEND_AFTER_MS },
      { from: T0 + 90_000 - RESEND_BEFORE_MS, to: T0 + 95_000 + RESEND_AFTER_MS },
    ]);
  });
});

describe('keysToResend', () => {
  it('takes the keys with any add acknowledged in a window, once each', () => {
    const windows = [{ from: T0 + 50_000, to: T0 + 70_000 }];
    const keys = [
      produced(1, 49_999),
      produced(2, 50_000),
      produced(3, 10_000, 65_000),
      produced(4, 70_000, 70_001),
      produced(5, 70_001),
      produced(6),
    ];
    expect(keysToResend(keys, windows).map((key) => key.key)).toEqual(['order-2', 'order-3', 'order-4']);
    expect(keysToResend(keys, [])).toEqual([]);
  });
});

describe('resendKeys', () => {
  let env: TestEnv;
  let queue: Queue;
  const name = 'resend';
  beforeAll(async () => {
    env = await createTestEnv('chaos-resend');
    queue = new Queue(name, { connection: env.openRedis({ maxRetriesPerRequest: null }), prefix: env.redisPrefix });
  });
  afterAll(async () => {
    await queue?.close();
    await env?.teardown();
  });

  it('adds again the job Redis lost, and no second job for the one that survived', async () => {
    const keys = [produced(1, 0), produced(2, 0)];
    const options = { queue: name, prefix: env.redisPrefix, redis: { url: env.redisUrl }, giveUp: new AbortController().signal };
    expect(await resendKeys(keys, options)).toEqual({ acknowledged: 2, retries: 0, unacknowledged: 0 });
    // The failover lost the first job.
    await queue.remove(jobIdFor('acme', 'order-1'));
    expect(await queue.getJob(jobIdFor('acme', 'order-1'))).toBeUndefined();

    expect(await resendKeys(keys, options)).toEqual({ acknowledged: 2, retries: 0, unacknowledged: 0 });
    const job = await queue.getJob(jobIdFor('acme', 'order-1'));
    expect(job?.data).toMatchObject({ scope: 'acme', idempotencyKey: 'order-1' });
    expect(await queue.getJobCounts('wait')).toEqual({ wait: 2 });
  });
});
