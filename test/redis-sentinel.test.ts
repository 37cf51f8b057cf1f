// @module-tag redis
/**
 * The private Redis Sentinel set-up (test/support/redis-sentinel.ts): ioredis finds the master
 * through the sentinels; a requested failover promotes the replica at once while the old master
 * goes on acknowledging writes until the sentinels reconfigure it, and those writes are lost; a
 * crashed master is replaced, keeps what its replica had, and rejoins as a replica.
 */
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RedisSentinelSet } from './support/redis-sentinel.js';

function direct(port: number): Redis {
  const client = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 0, retryStrategy: () => null });
  client.on('error', () => {});
  return client;
}

async function tcpPort(client: Redis): Promise<number> {
  return Number(/tcp_port:(\d+)/.exec(await client.info('server'))![1]);
}

describe('RedisSentinelSet', () => {
  let set: RedisSentinelSet;
  let client: Redis;

  beforeAll(async () => {
    set = await RedisSentinelSet.start({ replicas: 1, sentinels: 3 });
    // failoverDetector: ioredis follows the sentinels' +switch-master at once, not only when its
    // connection to the old master breaks.
    client = new Redis({ sentinels: set.sentinels, name: set.masterName, maxRetriesPerRequest: null, failoverDetector: true });
    client.on('error', () => {});
  }, 60_000);

  afterAll(async () => {
    client?.disconnect();
    await set?.stop();
  });

  it('ioredis connects to the master through the sentinels; the replica receives its writes', async () => {
    const master = await set.masterPort();
    expect(set.sentinels).toHaveLength(3);
    expect(await tcpPort(client)).toBe(master);
    await client.set('first', '1');
    const replicas = Number(await client.call('WAIT', '1', '5000'));
    expect(replicas).toBe(1);
    const replica = direct(set.nodePorts.find((port) => port !== master)!);
    try {
      expect(await replica.get('first')).toBe('1');
      await expect(replica.set('x', '1')).rejects.toThrow(/READONLY/);
    } finally {
      replica.disconnect();
    }
  });

  it('SENTINEL FAILOVER: the replica is promoted; the old master acknowledges writes until it is reconfigured, and they are lost', async () => {
    const change = await set.failover();
    expect(change.to).not.toBe(change.from);
    const oldMaster = direct(change.from);
    try {
      // The sentinels reconfigure the old master only at their next check of it (seconds).
      expect(/role:(\w+)/.exec(await oldMaster.info('replication'))![1]).toBe('master');
      expect(await oldMaster.set('split-brain', '1')).toBe('OK');
    } finally {
      oldMaster.disconnect();
    }
    // The old master follows the new one at a sentinel's next check of it (up to 10 s), then resyncs.
    await set.waitForHealthy(60_000);
    await expect.poll(() => tcpPort(client), { timeout: 20_000 }).toBe(change.to);
    expect(await client.get('split-brain')).toBeNull();
    expect(await client.get('first')).toBe('1');
  }, 90_000);

  it('crash of the master: the sentinels promote the replica, which has every replicated write; the old master rejoins as a replica', async () => {
    await client.set('before-crash', '1');
    expect(Number(await client.call('WAIT', '1', '5000'))).toBe(1);
    const change = await set.crashMaster();
    await expect.poll(() => tcpPort(client), { timeout: 20_000 }).toBe(change.to);
    expect(await client.get('before-crash')).toBe('1');
    // It restarts as a master (its configuration says so) until a sentinel turns it into a replica.
    await set.restartNode(change.from);
    expect(await set.waitForHealthy(60_000)).toBe(change.to);
    const rejoined = direct(change.from);
    try {
      expect(/role:(\w+)/.exec(await rejoined.info('replication'))![1]).toBe('slave');
    } finally {
      rejoined.disconnect();
    }
  }, 90_000);
});
