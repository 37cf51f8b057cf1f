/**
 * A Redis Cluster of the caller's own: `masters` redis-servers with `--cluster-enabled yes` and
 * one replica each, on free ports of 7100–7199 (bus ports 17100–17199; `REDIS_CLUSTER_PORTS`
 * moves the range, e.g. `7100-7199`), each in its own directory under a fresh temporary
 * directory, joined by `redis-cli --cluster create … --cluster-replicas 1`. The tests, the
 * chaos suite and the failover experiment start one; {@link RedisCluster.stop} kills every
 * node and deletes the directory. The machine's shared Redis is never touched.
 *
 * Every node writes an append-only file fsynced on every write (`appendfsync always`): a node
 * killed and started again within the node timeout comes back with what it acknowledged, so
 * only a failover (a replica promoted while behind) can lose writes.
 *
 * Binaries: `REDIS_SERVER` (else `redis-server`) and `REDIS_CLI` (else `redis-cli`).
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Redis } from 'ioredis';

/** Options of {@link RedisCluster.start}. */
export interface RedisClusterOptions {
  /** @defaultValue `3` */
  readonly masters?: number;
  /** `cluster-node-timeout`: how long a master may be unreachable before its replica takes over. @defaultValue `3000` */
  readonly nodeTimeoutMs?: number;
}

/** One node as the cluster sees it. */
export interface ClusterNodeInfo {
  readonly id: string;
  readonly port: number;
  readonly role: 'master' | 'replica';
  /** A replica's master's id. */
  readonly masterId?: string;
  /** Whether the cluster marks it failed (`fail` or `fail?`). */
  readonly failing: boolean;
  /** A master's slot ranges, e.g. `['0-5460']`. */
  readonly slots: readonly string[];
}

const execFileAsync = promisify(execFile);

/** A running private Redis Cluster. */
export class RedisCluster {
  readonly dir: string;
  readonly ports: readonly number[];
  readonly #nodeTimeoutMs: number;
  readonly #processes = new Map<number, ChildProcess>();
  readonly #binary = process.env.REDIS_SERVER ?? 'redis-server';

  private constructor(dir: string, ports: number[], nodeTimeoutMs: number) {
    this.dir = dir;
    this.ports = ports;
    this.#nodeTimeoutMs = nodeTimeoutMs;
  }

  /** Starts the nodes, creates the cluster, and waits until every node says `cluster_state:ok` and every replica is in sync. */
  static async start(options: RedisClusterOptions = {}): Promise<RedisCluster> {
    const masters = options.masters ?? 3;
    const ports = await freeClusterPorts(masters * 2);
    const cluster = new RedisCluster(mkdtempSync(join(tmpdir(), 'ij-redis-cluster-')), ports, options.nodeTimeoutMs ?? 3_000);
    try {
      await Promise.all(ports.map((port) => cluster.startNode(port)));
      const cli = process.env.REDIS_CLI ?? 'redis-cli';
      await execFileAsync(cli, ['--cluster', 'create', ...ports.map((port) => `127.0.0.1:${port}`), '--cluster-replicas', '1', '--cluster-yes'], { timeout: 60_000 }).catch(
        (error: Error & { stdout?: string; stderr?: string }) => {
          throw new Error(`redis-cli --cluster create failed: ${error.message}\n${error.stdout ?? ''}${error.stderr ?? ''}`);
        },
      );
      await cluster.waitUntilHealthy(60_000);
      return cluster;
    } catch (error) {
      await cluster.stop();
      throw error;
    }
  }

  /** `REDIS_CLUSTER_NODES`: every node, `127.0.0.1:<port>` separated by commas. */
  get nodesSetting(): string {
    return this.ports.map((port) => `127.0.0.1:${port}`).join(',');
  }

  /** The pid of the node on `port` while it runs. */
  pidOf(port: number): number | undefined {
    const child = this.#processes.get(port);
    return child && child.exitCode === null && child.signalCode === null ? child.pid : undefined;
  }

  /** The nodes as the node on `askPort` (else the first live one) sees them (`CLUSTER NODES`). */
  async nodes(askPort?: number): Promise<ClusterNodeInfo[]> {
    const port = askPort ?? this.ports.find((p) => this.pidOf(p) !== undefined);
    if (port === undefined) throw new Error('no live cluster node');
    const text = await withClient(port, (client) => client.call('CLUSTER', 'NODES') as Promise<string>);
    return text
      .trim()
      .split('\n')
      .map((line) => {
        const [id, address, flags, masterId, , , , , ...slots] = line.split(' ');
        const flagSet = new Set(flags!.split(','));
        return {
          id: id!,
          port: Number(address!.split('@')[0]!.split(':').pop()),
          role: flagSet.has('master') ? 'master' : 'replica',
          ...(masterId !== '-' ? { masterId } : {}),
          failing: flagSet.has('fail') || flagSet.has('fail?'),
          slots: slots.filter((s) => /^\d/.test(s)),
        } as ClusterNodeInfo;
      });
  }

  /** `cluster_state` as the node on `port` reports it: `ok`, or `fail` while a slot has no live master. */
  async state(port: number): Promise<string> {
    const info = await withClient(port, (client) => client.call('CLUSTER', 'INFO') as Promise<string>);
    return /cluster_state:(\w+)/.exec(info)?.[1] ?? 'unknown';
  }

  /** The port of the master serving `key`'s slot, and of its replica(s). */
  async shardOf(key: string): Promise<{ master: number; replicas: number[] }> {
    const slot = await withClient(this.ports.find((p) => this.pidOf(p) !== undefined)!, (client) => client.call('CLUSTER', 'KEYSLOT', key) as Promise<number>);
    const nodes = await this.nodes();
    const master = nodes.find((n) => n.role === 'master' && !n.failing && n.slots.some((range) => inRange(slot, range)));
    if (!master) throw new Error(`no master serves slot ${slot}`);
    // The master's own view: just after a failover, other nodes may not yet know its replicas.
    const own = await this.nodes(master.port);
    return { master: master.port, replicas: own.filter((n) => n.masterId === master.id && !n.failing).map((n) => n.port) };
  }

  /** {@link shardOf}, once the master has a replica (after a failover the old master rejoins as one). */
  async shardWithReplica(key: string, timeoutMs = 30_000): Promise<{ master: number; replicas: number[] }> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const shard = await this.shardOf(key).catch(() => undefined);
      if (shard && shard.replicas.length > 0) return shard;
      if (Date.now() > deadline) throw new Error(`the shard of ${key} has no replica after ${timeoutMs} ms`);
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }

  /**
   * Waits until the replicas of the master on `masterPort` have every write it took so far: a
   * write of `keyInSlot` (a key of one of its slots) and `WAIT` for all of them to acknowledge it
   * (replication is ordered, so they then have everything before it too).
   */
  async waitForReplicas(masterPort: number, keyInSlot: string, timeoutMs = 10_000): Promise<void> {
    const replicas = (await this.shardOf(keyInSlot)).replicas.length;
    const acknowledged = await withClient(masterPort, async (client) => {
      await client.set(keyInSlot, String(Date.now()));
      return Number(await client.call('WAIT', String(replicas), String(timeoutMs)));
    });
    if (acknowledged < replicas) throw new Error(`${acknowledged} of ${replicas} replicas of port ${masterPort} caught up within ${timeoutMs} ms`);
  }

  /** Kills the node (SIGKILL: no shutdown, no last write to its AOF beyond what was fsynced). */
  async kill(port: number): Promise<void> {
    const child = this.#processes.get(port);
    this.#processes.delete(port);
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = once(child, 'exit');
    child.kill('SIGKILL');
    await exited;
  }

  /** Kills the node, waits `downMs`, starts it again from its AOF and nodes.conf. */
  async restart(port: number, downMs: number): Promise<void> {
    await this.kill(port);
    await new Promise((resolve) => setTimeout(resolve, downMs));
    await this.startNode(port);
  }

  /**
   * A coordinated failover (`CLUSTER FAILOVER` on the replica): the master stops taking writes,
   * the replica catches up with it, then takes its slots. Nothing acknowledged is lost.
   */
  async failover(replicaPort: number): Promise<void> {
    await withClient(replicaPort, (client) => client.call('CLUSTER', 'FAILOVER'));
  }

  /** Waits until every live node says `cluster_state:ok`, sees no failed node among the live ones, and every live replica's link is up. */
  async waitUntilHealthy(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let last = '';
    for (;;) {
      try {
        const live = this.ports.filter((port) => this.pidOf(port) !== undefined);
        const states = await Promise.all(
          live.map((port) =>
            withClient(port, async (client) => {
              const info = (await client.call('CLUSTER', 'INFO')) as string;
              const replication = await client.info('replication');
              const role = /role:(\w+)/.exec(replication)?.[1];
              return { port, ok: info.includes('cluster_state:ok'), synced: role !== 'slave' || replication.includes('master_link_status:up') };
            }),
          ),
        );
        const failing = (await this.nodes()).filter((n) => n.failing && live.includes(n.port));
        if (states.every((s) => s.ok && s.synced) && failing.length === 0) return;
        last = JSON.stringify({ states, failing: failing.map((n) => n.port) });
      } catch (error) {
        last = (error as Error).message;
      }
      if (Date.now() > deadline) throw new Error(`Redis Cluster not healthy within ${timeoutMs} ms: ${last}`);
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }

  /** The tail of a node's log, for diagnostics. */
  logTail(port: number, chars = 2_000): string {
    try {
      return readFileSync(join(this.dir, String(port), 'redis.log'), 'utf8').slice(-chars);
    } catch {
      return '';
    }
  }

  /** Kills every node and deletes the directory. */
  async stop(): Promise<void> {
    await Promise.all([...this.#processes.keys()].map((port) => this.kill(port)));
    rmSync(this.dir, { recursive: true, force: true });
  }

  async startNode(port: number): Promise<void> {
    const dir = join(this.dir, String(port));
    mkdirSync(dir, { recursive: true });
    const args = [
      '--port', String(port), '--bind', '127.0.0.1', '--dir', dir,
      '--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', String(this.#nodeTimeoutMs),
      '--appendonly', 'yes', '--appendfsync', 'always', '--save', '',
      '--daemonize', 'no', '--logfile', join(dir, 'redis.log'),
    ];
    const child = spawn(this.#binary, args, { stdio: 'ignore' });
    const failed = new Promise<never>((_, reject) => {
      child.once('error', (error) => reject(new Error(`could not start ${this.#binary}: ${error.message} (set REDIS_SERVER to its path)`)));
      child.once('exit', (code, signal) => reject(new Error(`${this.#binary} on port ${port} exited at start (${code ?? signal}): ${this.logTail(port)}`)));
    });
    failed.catch(() => {});
    this.#processes.set(port, child);
    await Promise.race([waitForPing(port, 30_000), failed]);
  }
}

async function withClient<T>(port: number, use: (client: Redis) => Promise<T>): Promise<T> {
  // Never fall back to ioredis's default port: that is the machine's shared Redis.
  if (!Number.isInteger(port) || port <= 0) throw new Error(`no cluster node port given (${port})`);
  const client = new Redis({ port, host: '127.0.0.1', lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null, connectTimeout: 2_000 });
  client.on('error', () => {});
  try {
    await client.connect();
    return await use(client);
  } finally {
    client.disconnect();
  }
}

async function waitForPing(port: number, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      if ((await withClient(port, (client) => client.ping())) === 'PONG') return;
    } catch {
      // not up yet, or still loading its AOF
    }
    if (Date.now() > deadline) throw new Error(`cluster node on port ${port} did not answer within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

function inRange(slot: number, range: string): boolean {
  const [from, to] = range.split('-').map(Number);
  return slot >= from! && slot <= (to ?? from)!;
}

/**
 * `count` ports of the range whose bus port (+10000) is free too, tried in random order so that
 * clusters started at once (a test file and a chaos run) rarely reach for the same ones.
 */
async function freeClusterPorts(count: number): Promise<number[]> {
  const [from, to] = (process.env.REDIS_CLUSTER_PORTS ?? '7100-7199').split('-').map(Number) as [number, number];
  const candidates = Array.from({ length: to - from + 1 }, (_, i) => from + i).sort(() => Math.random() - 0.5);
  const chosen: number[] = [];
  for (const port of candidates) {
    if (chosen.length === count) break;
    if ((await isFree(port)) && (await isFree(port + 10_000))) chosen.push(port);
  }
  if (chosen.length < count) throw new Error(`fewer than ${count} free ports (and bus ports +10000) in ${from}-${to}`);
  return chosen.sort((a, b) => a - b);
}

function isFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}
