import type { ConnectionOptions } from 'bullmq';
import type { Logger } from 'pino';
import { Cluster } from 'ioredis';
import { assertClusterHashTag, parseClusterNodes } from './redis-cluster.js';
import { ClosingSentinelConnector } from './sentinel-connector.js';
import type { QueueConnectionOptions } from './queue-connection.js';

/** Where BullMQ's Redis is: one server (`url`), a Redis Cluster (`clusterNodes`), or a master that Redis Sentinel names (`sentinels`). */
export interface RedisConnectionSettings {
  /**
   * `redis://…` of a single server; not used when `clusterNodes` is set. With `sentinels` only
   * its credentials and database number are used (the master's address comes from the sentinels).
   */
  readonly url: string;
  /** Redis Cluster startup nodes, as `REDIS_CLUSTER_NODES` (`host:port,host:port`). */
  readonly clusterNodes?: string;
  /**
   * Redis Sentinel addresses, as `REDIS_SENTINELS` (`host:port,host:port`, or
   * `redis://[user:password@]host:port` for the sentinels' own credentials).
   * @defaultValue unset (no Sentinel)
   */
  readonly sentinels?: string;
  /** The master's name in the sentinels' configuration (`REDIS_SENTINEL_MASTER`). @defaultValue `'mymaster'` */
  readonly sentinelMaster?: string;
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
 * The one place a Redis connection is built from configuration. A single server, and a master
 * found through Redis Sentinel (`sentinels`, see `sentinelOptions`), stay plain
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
 * import { IdempotentProducer } from 'idempotent-jobs';
 * import { openRedisConnection } from 'idempotent-jobs/process';
 *
 * const redis = openRedisConnection({ url: 'redis://127.0.0.1:6379', clusterNodes: '127.0.0.1:7000,127.0.0.1:7001' });
 * const producer = new IdempotentProducer({ queue: 'payments', connection: redis.connection, prefix: '{ij}' });
 * await producer.close();
 * await redis.close();
 * ```
 */
export function openRedisConnection(settings: RedisConnectionSettings): RedisConnection {
  if (settings.sentinels !== undefined) return { connection: sentinelOptions(settings, settings.sentinels), isCluster: false, close: async () => {} };
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
      // ioredis's connect() of a cluster never settles when its ready check (CLUSTER INFO) fails:
      // the check reconnects the client and drops that call's promise (redis/ioredis#741). BullMQ
      // awaits connect() when its watchdog resets a worker's blocking client, so a reset while
      // the cluster was down, or while the check reached a node just killed, left the worker
      // taking no job again and unable to close. Without the check, the client is ready once it
      // has the slot map; a command during CLUSTERDOWN waits and retries (above).
      enableReadyCheck: false,
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
 * ioredis options that find the master through Redis Sentinel: still plain options, so each
 * BullMQ queue and worker opens (and closes) connections of its own, each asking the sentinels
 * for the master. `failoverDetector` follows the sentinels' `+switch-master` at once, rather
 * than only when the connection to the old master breaks (a demoted master keeps its
 * connections open); its subscriptions close with the connection ({@link ClosingSentinelConnector}); a command answered `READONLY` by it is sent again on a new connection
 * ({@link resendOnReadonly}). `maxRetriesPerRequest: null`: commands wait out the failover.
 */
function sentinelOptions(settings: RedisConnectionSettings, sentinelsText: string): ConnectionOptions {
  const sentinels = parseClusterNodes(sentinelsText, 'REDIS_SENTINELS');
  const sentinelCredentials = sentinels.find((node) => node.password !== undefined || node.username !== undefined);
  const master = URL.canParse(settings.url) ? new URL(settings.url) : undefined;
  const db = master && /^\/\d+$/.test(master.pathname) ? Number(master.pathname.slice(1)) : undefined;
  return {
    sentinels: sentinels.map(({ host, port }) => ({ host, port })),
    name: settings.sentinelMaster ?? 'mymaster',
    ...(sentinelCredentials?.username !== undefined ? { sentinelUsername: sentinelCredentials.username } : {}),
    ...(sentinelCredentials?.password !== undefined ? { sentinelPassword: sentinelCredentials.password } : {}),
    ...(master?.username ? { username: decodeURIComponent(master.username) } : {}),
    ...(master?.password ? { password: decodeURIComponent(master.password) } : {}),
    ...(db !== undefined ? { db } : {}),
    failoverDetector: true,
    // Closes the detector's subscriptions with the connection, also on quit() (BullMQ's close).
    Connector: ClosingSentinelConnector,
    reconnectOnError: resendOnReadonly,
    maxRetriesPerRequest: null,
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
export function assertKeysFitConnection(options: QueueConnectionOptions, queue: string): void {
  if (redisClusterClientOf(options)) assertClusterHashTag(options.prefix ?? 'bull', queue);
}

/**
 * Warns when a worker is given a Redis Cluster client that runs ioredis's ready check (its
 * default): BullMQ reconnects a worker's blocking client through `connect()`, which then may
 * never settle (see {@link openRedisConnection}), and the worker stops taking jobs. A client from
 * {@link openRedisConnection} has the check off.
 */
export function warnOfClusterReadyCheck(options: QueueConnectionOptions, log: Logger): void {
  const cluster = redisClusterClientOf(options);
  if (!cluster || cluster.options?.enableReadyCheck === false) return;
  log.warn(
    'this Redis Cluster client runs ioredis\'s ready check (enableReadyCheck), with which a worker can stop taking jobs for good after the cluster was down ' +
      'or a master was killed: create it with enableReadyCheck: false, or with openRedisConnection from idempotent-jobs/process (see docs/operations.md#redis-cluster)',
  );
}

/** The Redis Cluster client `options` name as the queue's connection, or undefined (one server, Sentinel, or the Postgres backend). */
function redisClusterClientOf(options: QueueConnectionOptions): { readonly options?: { readonly enableReadyCheck?: boolean } } | undefined {
  if (options.backend === 'postgres') return undefined;
  const connection = options.connection as { isCluster?: unknown; options?: { enableReadyCheck?: boolean } };
  return connection.isCluster === true ? connection : undefined;
}
