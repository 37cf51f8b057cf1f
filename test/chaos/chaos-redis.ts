/**
 * The Redis a chaos run uses, and the Redis faults the nemesis can cause on it: a private
 * redis-server ({@link PrivateRedis}), or a private Redis Cluster (`--redis-cluster`: 3 masters
 * with a replica each, test/support/redis-cluster.ts) whose faults aim at the shard holding the
 * run's queue (the prefix's hash tag puts the whole queue on one shard).
 */
import { Redis } from 'ioredis';
import type { RedisConnectionSettings } from '../../src/process/index.js';
import { RedisCluster } from '../support/redis-cluster.js';
import { RedisSentinelSet } from '../support/redis-sentinel.js';
import { PrivateRedis } from './private-redis.js';

/** What the harness, the producer and the nemesis need of the run's Redis. */
export interface ChaosRedis {
  /** How the harness and the producer connect (`openRedisConnection`). */
  readonly settings: RedisConnectionSettings;
  /** The workers' environment: `REDIS_URL`, or `REDIS_CLUSTER_NODES`. */
  readonly workerEnv: Readonly<Record<string, string>>;
  /** One line for the run's log. */
  readonly description: string;
  /** A port to name in the report (the single server's, or the cluster's first). */
  readonly port: number;
  /** Kills about `fraction` of the clients (the workers', the producer's; never the nemesis's own) on every node. Returns how many. */
  killClients(fraction: number, next: () => number): Promise<number>;
  /** Crashes the server (the queue's master on a cluster), keeps it down `downMs`, starts it again from its AOF. */
  restart(downMs: number): Promise<void>;
  /** Cluster only: a coordinated failover of the queue's shard (its replica becomes master; nothing acknowledged is lost). */
  failover?(): Promise<{ readonly from: number; readonly to: number }>;
  /** Stops every server and deletes its files. */
  destroy(): Promise<void>;
}

/** A private redis-server on a spare port. */
export async function startSingleChaosRedis(): Promise<ChaosRedis> {
  const redis = await PrivateRedis.start();
  const admin = new Redis(redis.url, { maxRetriesPerRequest: null });
  admin.on('error', () => {});
  return {
    settings: { url: redis.url },
    workerEnv: { REDIS_URL: redis.url },
    description: `private redis-server on port ${redis.port} (${redis.dir})`,
    port: redis.port,
    killClients: (fraction, next) => killClientsOn(admin, fraction, next),
    restart: (downMs) => redis.restart(downMs),
    async destroy() {
      admin.disconnect();
      await redis.destroy();
    },
  };
}

/**
 * A private Redis Cluster. `keyInQueueSlot` is any key of the run's queue: the faults find the
 * queue's current master (and its replica) through it. The node timeout is well above the
 * longest `redis-restart` downtime, so a restarted master comes back as master (from its AOF,
 * fsynced on every write) instead of being replaced: only `failover` moves the shard.
 */
export async function startClusterChaosRedis(keyInQueueSlot: string): Promise<ChaosRedis> {
  const cluster = await RedisCluster.start({ masters: 3, nodeTimeoutMs: CLUSTER_NODE_TIMEOUT_MS });
  return {
    settings: { url: 'redis://unused.invalid:1', clusterNodes: cluster.nodesSetting },
    workerEnv: { REDIS_CLUSTER_NODES: cluster.nodesSetting },
    description: `private Redis Cluster, 3 masters with a replica each, on ports ${cluster.ports.join(', ')} (${cluster.dir})`,
    port: cluster.ports[0]!,
    async killClients(fraction, next) {
      let killed = 0;
      for (const port of cluster.ports) {
        if (cluster.pidOf(port) === undefined) continue;
        const admin = new Redis({ port, host: '127.0.0.1', maxRetriesPerRequest: 1, retryStrategy: () => null });
        admin.on('error', () => {});
        try {
          killed += await killClientsOn(admin, fraction, next);
        } finally {
          admin.disconnect();
        }
      }
      return killed;
    },
    async restart(downMs) {
      const { master } = await cluster.shardWithReplica(keyInQueueSlot);
      await cluster.restart(master, Math.min(downMs, CLUSTER_NODE_TIMEOUT_MS / 2));
      // Back as master once its replica has synced again, before the next fault.
      await cluster.waitUntilHealthy(60_000);
    },
    async failover() {
      const { master, replicas } = await cluster.shardWithReplica(keyInQueueSlot);
      await cluster.failover(replicas[0]!);
      await cluster.waitUntilHealthy(60_000);
      return { from: master, to: replicas[0]! };
    },
    destroy: () => cluster.stop(),
  };
}

/**
 * A private Redis Sentinel set-up (`--redis-sentinel`: a master, a replica, three sentinels;
 * test/support/redis-sentinel.ts). Every process finds the master through the sentinels
 * (`REDIS_SENTINELS`; `REDIS_URL` names a port where nothing listens). `restart` crashes the
 * master: the sentinels promote the replica, and the old master rejoins as a replica when it is
 * started again; `failover` is `SENTINEL FAILOVER`. Neither is coordinated with the writes:
 * an add acknowledged by the old master and not yet replicated is lost.
 */
export async function startSentinelChaosRedis(): Promise<ChaosRedis> {
  const set = await RedisSentinelSet.start({ replicas: 1, sentinels: 3 });
  const unused = 'redis://127.0.0.1:1';
  const onMaster = async <T>(use: (admin: Redis) => Promise<T>): Promise<T> => {
    const admin = new Redis({ port: await set.masterPort(), host: '127.0.0.1', maxRetriesPerRequest: 1, retryStrategy: () => null });
    admin.on('error', () => {});
    try {
      return await use(admin);
    } finally {
      admin.disconnect();
    }
  };
  return {
    settings: { url: unused, sentinels: set.sentinelsSetting, sentinelMaster: set.masterName },
    workerEnv: { REDIS_URL: unused, REDIS_SENTINELS: set.sentinelsSetting, REDIS_SENTINEL_MASTER: set.masterName },
    description: `private Redis Sentinel set-up (master ${set.masterName}: data nodes on ports ${set.nodePorts.join(', ')}, 3 sentinels) in ${set.dir}`,
    port: set.nodePorts[0]!,
    killClients: (fraction, next) => onMaster((admin) => killClientsOn(admin, fraction, next)),
    async restart(downMs) {
      const change = await set.crashMaster();
      await new Promise((resolve) => setTimeout(resolve, downMs));
      await set.restartNode(change.from);
      await set.waitForHealthy(60_000);
    },
    async failover() {
      const change = await set.failover();
      await set.waitForHealthy(60_000);
      return { from: change.from, to: change.to };
    },
    destroy: () => set.stop(),
  };
}

/** The cluster's `cluster-node-timeout`: a master down for less is not replaced. */
const CLUSTER_NODE_TIMEOUT_MS = 6_000;

/** Kills about `fraction` of the clients of the server `admin` is connected to, except `admin` itself. */
async function killClientsOn(admin: Redis, fraction: number, next: () => number): Promise<number> {
  const own = Number(await admin.client('ID'));
  const list = String(await admin.client('LIST'));
  const ids = [...list.matchAll(/^id=(\d+) .* flags=(\S+)/gm)]
    // Not itself, and not a replica's or a master's replication link (flags S or M).
    .filter((m) => Number(m[1]) !== own && !/[SM]/.test(m[2]!))
    .map((m) => Number(m[1]))
    .sort((a, b) => a - b);
  if (ids.length === 0) return 0;
  // Chosen first, then killed: a client may be gone by the time its turn comes.
  const count = Math.max(1, Math.round(ids.length * fraction));
  const pool = [...ids];
  const chosen: number[] = [];
  while (chosen.length < count) chosen.push(pool.splice(Math.floor(next() * pool.length), 1)[0]!);
  let killed = 0;
  for (const id of chosen) killed += Number(await admin.client('KILL', 'ID', String(id)).catch(() => 0));
  return killed;
}
