import { ConfigError } from '../errors.js';

/** One startup node of a Redis Cluster, with the credentials its entry named (if any). */
export interface ClusterNode {
  /** Host name or address of the node. */
  readonly host: string;
  /** Port of the node. */
  readonly port: number;
  /** Redis ACL user of the `redis://user:password@…` entry. @defaultValue unset (no user) */
  readonly username?: string;
  /** Password of the `redis://user:password@…` entry. @defaultValue unset (no password) */
  readonly password?: string;
}

/**
 * Parses `REDIS_CLUSTER_NODES`: startup nodes separated by commas, each `host:port` or a
 * `redis://[user:password@]host:port` URL (credentials apply to every node). A few reachable
 * nodes are enough: the client learns the rest of the cluster from them. Also parses
 * `REDIS_SENTINELS` (the same form), whose name `variable` puts in the error.
 */
export function parseClusterNodes(text: string, variable = 'REDIS_CLUSTER_NODES'): ClusterNode[] {
  const entries = text.split(',').map((entry) => entry.trim()).filter((entry) => entry !== '');
  if (entries.length === 0) throw new ConfigError(`Invalid configuration:\n  ${variable}: no node named (expected host:port entries separated by commas)`);
  return entries.map((entry) => {
    let url: URL;
    try {
      url = new URL(entry.includes('://') ? entry : `redis://${entry}`);
    } catch {
      url = new URL('invalid://');
    }
    const port = Number(url.port);
    if (url.protocol !== 'redis:' || url.hostname === '' || !Number.isInteger(port) || port < 1 || port > 65_535) {
      throw new ConfigError(`Invalid configuration:\n  ${variable}: "${entry}" is not host:port or redis://host:port (got ${JSON.stringify(text)})`);
    }
    return {
      host: url.hostname.replace(/^\[(.*)\]$/, '$1'),
      port,
      ...(url.username ? { username: decodeURIComponent(url.username) } : {}),
      ...(url.password ? { password: decodeURIComponent(url.password) } : {}),
    };
  });
}

/**
 * The hash tag Redis Cluster hashes `key` by: what lies between the first `{` and the first
 * `}` after it, when that is not empty; undefined when the whole key is hashed.
 */
export function hashTagOf(key: string): string | undefined {
  const open = key.indexOf('{');
  if (open < 0) return undefined;
  const close = key.indexOf('}', open + 1);
  if (close < 0 || close === open + 1) return undefined;
  return key.slice(open + 1, close);
}

/**
 * Refuses a prefix and queue whose BullMQ keys (`<prefix>:<queue>:<suffix>`) would spread over
 * the cluster's slots. BullMQ's Lua scripts touch several keys of a queue at once, which Redis
 * Cluster allows only within one slot; without a hash tag each key lands in its own slot and
 * every script fails with CROSSSLOT (or, worse, a script reaches a key it did not declare).
 */
export function assertClusterHashTag(prefix: string, queue: string): void {
  if (hashTagOf(`${prefix}:${queue}:`) !== undefined) return;
  throw new ConfigError(
    `REDIS_PREFIX "${prefix}" has no hash tag, but Redis Cluster (REDIS_CLUSTER_NODES) needs every key of queue "${queue}" in one slot ` +
      `for BullMQ's scripts. Put the prefix in braces, e.g. REDIS_PREFIX={${prefix.replace(/[{}]/g, '') || 'ij'}} ` +
      '(every queue under it then lives on one shard; give queue groups their own tags to spread them).',
  );
}
