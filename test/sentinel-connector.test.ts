// @module-tag redis
/**
 * Connections found through Redis Sentinel close all they opened: with `failoverDetector` each
 * connection to the master also subscribes to `+switch-master` on every sentinel, and BullMQ
 * closes its queues and workers with `quit()`, which ioredis 5 does not let close those
 * subscriptions (redis/ioredis#1362): they stayed open, and the process could not exit.
 */
import { Queue, Worker } from 'bullmq';
import { Redis, type RedisOptions } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openRedisConnection } from '../src/process/index.js';
import { RedisSentinelSet } from './support/redis-sentinel.js';

/** Connections subscribed to a channel on each sentinel (the failover detectors'), apart from the sentinels' own links. */
async function subscriptionsOnSentinels(set: RedisSentinelSet): Promise<number> {
  let count = 0;
  for (const { port } of set.sentinels) {
    const client = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 0, retryStrategy: () => null });
    client.on('error', () => {});
    try {
      const list = String(await client.call('CLIENT', 'LIST'));
      count += [...list.matchAll(/ sub=(\d+) /g)].filter((m) => Number(m[1]) > 0).length;
    } finally {
      client.disconnect();
    }
  }
  return count;
}

describe('connections through Redis Sentinel', () => {
  let set: RedisSentinelSet;
  const prefix = `ij-sentinel-connector-${process.pid}`;

  beforeAll(async () => {
    set = await RedisSentinelSet.start({ replicas: 1, sentinels: 3 });
  }, 60_000);

  afterAll(async () => {
    await set?.stop();
  });

  it("close their failover detectors' subscriptions when BullMQ closes a queue and a worker (quit)", async () => {
    const redis = openRedisConnection({ url: 'redis://127.0.0.1:1', sentinels: set.sentinelsSetting, sentinelMaster: set.masterName });
    const queue = new Queue('closing', { connection: redis.connection, prefix });
    const worker = new Worker('closing', async () => 'done', { connection: redis.connection, prefix });
    queue.on('error', () => {});
    worker.on('error', () => {});
    await Promise.all([queue.waitUntilReady(), worker.waitUntilReady()]);
    await queue.add('one', {});
    // Open: the detectors subscribed on each of the 3 sentinels.
    await expect.poll(() => subscriptionsOnSentinels(set), { timeout: 10_000 }).toBeGreaterThanOrEqual(3);
    await worker.close();
    await queue.close();
    await redis.close();
    await expect.poll(() => subscriptionsOnSentinels(set), { timeout: 10_000 }).toBe(0);
  });

  it('close them on quit() after a failover too (the detector made for the new master)', async () => {
    const redis = openRedisConnection({ url: 'redis://127.0.0.1:1', sentinels: set.sentinelsSetting, sentinelMaster: set.masterName });
    const client = new Redis(redis.connection as RedisOptions);
    client.on('error', () => {});
    await client.set(`${prefix}:before`, '1');
    const change = await set.failover();
    await set.waitForHealthy(60_000);
    await expect.poll(async () => Number(/tcp_port:(\d+)/.exec(await client.info('server'))![1]), { timeout: 20_000 }).toBe(change.to);
    await client.quit();
    await expect.poll(() => subscriptionsOnSentinels(set), { timeout: 10_000 }).toBe(0);
  }, 90_000);
});
