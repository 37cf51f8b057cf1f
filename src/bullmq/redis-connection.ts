import type { ConnectionOptions } from 'bullmq';
import { Cluster } from 'ioredis';
import { assertClusterHashTag, parseClusterNodes } from '../config/redis-cluster.js';

/** Where BullMQ's Redis is: one server (`url`) or a Redis Cluster (`clusterNodes`). */
export interface RedisConnectionSettings {
  /** `redis://…` of a single server; not used when `clusterNodes` is set. */
  readonly url: string;
  /** Redis Cluster startup nodes, as `REDIS_CLUSTER_NODES` (`host:port,host:port`). */
  readonly clusterNodes?: string;
}

/** A BullMQ connection, and how to close what was opened for it. */
export interface RedisConnection {
  /** What to pass as BullMQ's `connection` (or this library's `connection` option). */
  readonly connection: ConnectionOptions;
  /** True when `connection` is a Redis Cluster client (then every queue's prefix needs a hash tag). */
  readonly isCluster: boolean;
  /** Closes the cluster client; BullMQ's own connections are closed by their queues and workers. */
  close(): Promise<void>;
}

/**
 * The one place a Redis connection is built from configuration. A single server stays plain
 * options (`{ url }`): each BullMQ queue and worker opens and closes its own connections. A
 * cluster is an ioredis `Cluster`, shared by the queues given it and duplicated by each worker
 * for its blocking reads; BullMQ leaves a client it was given open, so {@link RedisConnection.close}
 * closes it after them.
 *
 * `maxRetriesPerRequest: null` (BullMQ requires it of a worker's connection): during a failover
 * commands wait for the slots to move to the promoted replica instead of failing after a few
 * tries; the cluster refreshes its slot map on every MOVED or lost node.
 *
 * @example
 * ```ts
 * import { IdempotentProducer, openRedisConnection } from 'idempotent-jobs';
 *
 * const redis = openRedisConnection({ url: 'redis://127.0.0.1:6379', clusterNodes: '127.0.0.1:7000,127.0.0.1:7001' });
 * const producer = new IdempotentProducer({ queue: 'payments', connection: redis.connection, prefix: '{ij}' });
 * await producer.close();
 * await redis.close();
 * ```
 */
export function openRedisConnection(settings: RedisConnectionSettings): RedisConnection {
  if (settings.clusterNodes === undefined) return { connection: { url: settings.url }, isCluster: false, close: async () => {} };
  const nodes = parseClusterNodes(settings.clusterNodes);
  const credentials = nodes.find((node) => node.password !== undefined || node.username !== undefined);
  const cluster = new Cluster(
    nodes.map(({ host, port }) => ({ host, port })),
    {
      redisOptions: {
        maxRetriesPerRequest: null,
        username: credentials?.username,
        password: credentials?.password,
        reconnectOnError: resendOnReadonly,
      },
      // Keep retrying the whole cluster (capped at 2 s), as a single-server client reconnects forever.
      clusterRetryStrategy: (times) => Math.min(100 * times, 2_000),
      // A failover takes the cluster's node timeout and more. ioredis's defaults give up on a
      // command after 16 redirections at 100 ms (CLUSTERDOWN) or none (MOVED): under 2 s, so
      // BullMQ's completion of a job whose effect had committed failed with "Too many Cluster
      // redirections" and the job was marked failed. These ride out a failover of about 30 s.
      maxRedirections: 100,
      retryDelayOnClusterDown: 300,
      retryDelayOnMoved: 100,
      retryDelayOnTryAgain: 300,
    },
  );
  // Errors reach the queues and workers that use the client; this keeps an idle one from throwing.
  cluster.on('error', () => {});
  return {
    connection: cluster,
    isCluster: true,
    close: async () => {
      await cluster.quit().catch(() => cluster.disconnect());
    },
  };
}

/**
 * A command that reached a master as it was being demoted in a failover is answered `READONLY`
 * (seen on BullMQ's job completion script in the chaos suite's coordinated failovers) instead
 * of being redirected, and BullMQ would then fail the job: an infrastructure fault would use up
 * an attempt. `2` closes that node's connection and sends the command again; the cluster client
 * retries it once the connection is gone (`retryDelayOnFailover`), after refreshing its slot
 * map, on the new master. Nothing ran on the replica: it refuses every write, so a script stops
 * at its first one.
 */
function resendOnReadonly(error: Error): 2 | false {
  return error.message.startsWith('READONLY') ? 2 : false;
}

/**
 * Refuses `prefix` for `queue` when `connection` is a Redis Cluster and the queue's keys would
 * not share a slot ({@link assertClusterHashTag}): a clear error at start instead of CROSSSLOT
 * errors on the first job.
 */
export function assertKeysFitConnection(connection: ConnectionOptions, prefix: string | undefined, queue: string): void {
  if (isClusterClient(connection)) assertClusterHashTag(prefix ?? 'bull', queue);
}

function isClusterClient(connection: ConnectionOptions): boolean {
  return (connection as { isCluster?: unknown }).isCluster === true;
}
