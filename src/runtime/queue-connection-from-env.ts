import type { QueueConnectionOptions } from '../bullmq/queue-connection.js';
import { openRedisConnection } from '../bullmq/redis-connection.js';
import { directDatabaseUrl, redisSettingsFromEnv, type EnvConfig } from './env-config.js';

/** Where the process's queues are, from the environment, and how to close what was opened for them. */
export interface QueueConnectionFromEnv extends QueueConnectionOptions {
  /** Which backend, for messages: `Redis` or `Postgres`. */
  readonly label: string;
  /** Closes a shared client (a Redis Cluster's); the queues and workers close their own connections. */
  close(): Promise<void>;
}

/**
 * The queues' connection from `QUEUE_BACKEND`: Redis (`REDIS_URL`, `REDIS_CLUSTER_NODES` or
 * `REDIS_SENTINELS`; `REDIS_PREFIX`), or BullMQ's PostgreSQL backend in `QUEUE_SCHEMA` over the direct database
 * URL (BullMQ holds a LISTEN connection, which a transaction-mode pooler would not keep).
 */
export function queueConnectionFromEnv(
  config: Pick<
    EnvConfig,
    'QUEUE_BACKEND' | 'QUEUE_SCHEMA' | 'REDIS_URL' | 'REDIS_CLUSTER_NODES' | 'REDIS_SENTINELS' | 'REDIS_SENTINEL_MASTER' | 'REDIS_PREFIX' | 'DATABASE_URL' | 'DATABASE_DIRECT_URL'
  >,
): QueueConnectionFromEnv {
  if (config.QUEUE_BACKEND === 'postgres') {
    return { backend: 'postgres', connection: directDatabaseUrl(config), prefix: config.QUEUE_SCHEMA, label: 'Postgres (queue)', close: async () => {} };
  }
  const redis = openRedisConnection(redisSettingsFromEnv(config));
  return { backend: 'redis', connection: redis.connection, prefix: config.REDIS_PREFIX, label: 'Redis', close: () => redis.close() };
}
