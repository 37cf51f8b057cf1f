/**
 * A Redis Sentinel set-up of the caller's own, as BullMQ's high-availability deployments run it:
 * a master, its replica(s), and three sentinels that agree (quorum 2) when the master is down
 * and promote a replica. Every process is on a spare port of 127.0.0.1 with a directory of its
 * own under one temporary directory; the machine's shared Redis is never touched. Clients find
 * the master through the sentinels (ioredis: `new Redis({ sentinels, name })`).
 *
 * Each data node has a configuration file, so that what the sentinels tell it (`REPLICAOF`,
 * then `CONFIG REWRITE`) survives its restart, as on a production host, and an append-only
 * file fsynced on every write: a node killed and started again keeps what it acknowledged, so
 * only a failover (a replica promoted while behind) loses writes. Redis replication is
 * asynchronous: the master acknowledges a write before any replica has it.
 *
 * Binary: `REDIS_SERVER` (else `redis-server`) for the data nodes and, with `--sentinel`, for the
 * sentinels (Debian's `redis-sentinel` package adds only a service around the same binary).
 */
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { freePorts, sleep, waitUntil } from './daemon.js';
import { RestartableServer, type ServerCommand } from './restartable-server.js';

/** Options of {@link RedisSentinelSet.start}. */
export interface RedisSentinelOptions {
  /** How many replicas of the master. @defaultValue `1` */
  readonly replicas?: number;
  /** How many sentinels (quorum: a majority of them). @defaultValue `3` */
  readonly sentinels?: number;
  /** The name the sentinels monitor the master by. @defaultValue `'ijmaster'` */
  readonly masterName?: string;
  /** `down-after-milliseconds`: how long the master may not answer before a sentinel calls it down. @defaultValue `1000` */
  readonly downAfterMs?: number;
  /** `failover-timeout`: also the least time between two failovers of the master. @defaultValue `3000` */
  readonly failoverTimeoutMs?: number;
  /** `min-replicas-to-write` on every data node (0: the master takes writes with no replica). @defaultValue `0` */
  readonly minReplicasToWrite?: number;
}

/** `host` and `port`, as ioredis's `sentinels` option takes them. */
export interface RedisAddress {
  readonly host: string;
  readonly port: number;
}

/** What a failover did, and how long it took until every sentinel named the new master and it answered as master. */
export interface MasterChange {
  readonly from: number;
  readonly to: number;
  readonly ms: number;
}

/** A redis-server process, a data node or (with `--sentinel`) a sentinel, started from its configuration file. */
class RedisNode extends RestartableServer {
  readonly #binary: string;
  readonly #sentinel: boolean;
  #running = false;

  constructor(port: number, dir: string, binary: string, sentinel: boolean) {
    super(port, dir);
    this.#binary = binary;
    this.#sentinel = sentinel;
  }

  get configFile(): string {
    return join(this.dir, this.#sentinel ? 'sentinel.conf' : 'redis.conf');
  }

  get running(): boolean {
    return this.#running;
  }

  async start(): Promise<void> {
    await this.spawnServer();
    this.#running = true;
  }

  override async crash(): Promise<void> {
    this.#running = false;
    await super.crash();
  }

  logTail(chars = 2_000): string {
    try {
      return readFileSync(join(this.dir, 'redis.log'), 'utf8').slice(-chars);
    } catch {
      return '';
    }
  }

  protected command(): ServerCommand {
    return {
      binary: this.#binary,
      binaryVariable: 'REDIS_SERVER',
      args: this.#sentinel ? [this.configFile, '--sentinel'] : [this.configFile],
      logFile: join(this.dir, 'redis.log'),
    };
  }

  protected async waitUntilReady(timeoutMs: number): Promise<void> {
    await waitUntil(`redis on port ${this.port}`, async () => ((await withClient(this.port, (client) => client.ping())) === 'PONG' ? true : undefined), timeoutMs, 50);
  }
}

/** A running private master, replica(s) and sentinels. */
export class RedisSentinelSet {
  /** The temporary directory: one directory per node and per sentinel. */
  readonly dir: string;
  readonly masterName: string;
  readonly #nodes: RedisNode[];
  readonly #sentinels: RedisNode[];

  private constructor(dir: string, masterName: string, nodes: RedisNode[], sentinels: RedisNode[]) {
    this.dir = dir;
    this.masterName = masterName;
    this.#nodes = nodes;
    this.#sentinels = sentinels;
  }

  /** Starts the master, its replicas and the sentinels, and waits until every sentinel sees them all. */
  static async start(options: RedisSentinelOptions = {}): Promise<RedisSentinelSet> {
    const binary = process.env.REDIS_SERVER ?? 'redis-server';
    const replicas = options.replicas ?? 1;
    const sentinelCount = options.sentinels ?? 3;
    const masterName = options.masterName ?? 'ijmaster';
    const dir = mkdtempSync(join(tmpdir(), 'ij-redis-sentinel-'));
    const ports = await freePorts(1 + replicas + sentinelCount);
    const nodePorts = ports.slice(0, 1 + replicas);
    const masterPort = nodePorts[0]!;
    const node = (port: number, sentinel: boolean) => {
      const nodeDir = join(dir, `${sentinel ? 'sentinel' : 'redis'}-${port}`);
      mkdirSync(nodeDir);
      return new RedisNode(port, nodeDir, binary, sentinel);
    };
    const nodes = nodePorts.map((port) => node(port, false));
    const sentinels = ports.slice(1 + replicas).map((port) => node(port, true));
    const set = new RedisSentinelSet(dir, masterName, nodes, sentinels);
    try {
      for (const each of nodes) writeFileSync(each.configFile, dataNodeConfig(each, each.port === masterPort ? undefined : masterPort, options));
      for (const each of sentinels) writeFileSync(each.configFile, sentinelConfig(each, masterName, masterPort, Math.floor(sentinelCount / 2) + 1, options));
      await Promise.all(nodes.map((each) => each.start()));
      await Promise.all(sentinels.map((each) => each.start()));
      await set.waitForHealthy(30_000);
      return set;
    } catch (error) {
      await set.stop();
      throw error;
    }
  }

  /** The sentinels' addresses, for ioredis's `sentinels` option. */
  get sentinels(): RedisAddress[] {
    return this.#sentinels.map((each) => ({ host: '127.0.0.1', port: each.port }));
  }

  /** The sentinels as one setting: `127.0.0.1:<port>,127.0.0.1:<port>,…`. */
  get sentinelsSetting(): string {
    return this.sentinels.map((each) => `${each.host}:${each.port}`).join(',');
  }

  /** The data nodes' ports (the master's first at start). */
  get nodePorts(): number[] {
    return this.#nodes.map((each) => each.port);
  }

  /** The master's port, as the first live sentinel names it (`SENTINEL GET-MASTER-ADDR-BY-NAME`). */
  async masterPort(): Promise<number> {
    const sentinel = this.#sentinels.find((each) => each.running);
    if (!sentinel) throw new Error('no sentinel is running');
    return this.#masterPortAccordingTo(sentinel.port);
  }

  /**
   * Waits until every sentinel names the same master, that node answers as master, every other
   * live data node is its replica with the link up, and every sentinel knows the others.
   */
  async waitForHealthy(timeoutMs = 30_000): Promise<number> {
    return waitUntil(
      `Redis Sentinel set ${this.masterName} healthy`,
      async () => {
        const named = await Promise.all(this.#sentinels.filter((s) => s.running).map((s) => this.#masterPortAccordingTo(s.port)));
        const master = named[0];
        if (master === undefined || named.some((port) => port !== master)) return undefined;
        if ((await role(master)).role !== 'master') return undefined;
        for (const each of this.#nodes.filter((n) => n.running && n.port !== master)) {
          const replica = await role(each.port);
          if (replica.role !== 'slave' || replica.masterPort !== master || !replica.linkUp) return undefined;
        }
        for (const sentinel of this.#sentinels.filter((s) => s.running)) {
          const others = (await withClient(sentinel.port, (client) => client.call('SENTINEL', 'SENTINELS', this.masterName))) as unknown[];
          if (others.length < this.#sentinels.filter((s) => s.running).length - 1) return undefined;
        }
        return master;
      },
      timeoutMs,
      100,
    );
  }

  /**
   * A failover the sentinels carry out on request (`SENTINEL FAILOVER`), the master being
   * healthy: a replica is promoted at once, but the old master is told to follow it (and its
   * clients are disconnected) only when a sentinel next checks it, seconds later. Until then it
   * is still a master and acknowledges writes that the new master never gets: they are lost when
   * it becomes a replica. Resolves once every sentinel names the new master; call
   * {@link waitForHealthy} to wait for the old one to follow it.
   */
  async failover(): Promise<MasterChange> {
    const from = await this.waitForHealthy();
    const began = Date.now();
    // A sentinel refuses while it does not yet count the replica as fit to promote
    // (NOGOODSLAVE) or while an earlier failover's timeout runs (INPROG): ask again.
    await waitUntil(
      `SENTINEL FAILOVER ${this.masterName} accepted`,
      () => withClient(this.#sentinels[0]!.port, (client) => client.call('SENTINEL', 'FAILOVER', this.masterName)).then(() => true),
      30_000,
      200,
    );
    const to = await this.#waitForNewMaster(from, 30_000);
    return { from, to, ms: Date.now() - began };
  }

  /**
   * Crashes the master (SIGKILL): once `down-after-milliseconds` have passed the sentinels agree
   * it is down and promote a replica. The old master stays down until {@link restartNode}.
   */
  async crashMaster(): Promise<MasterChange> {
    const from = await this.waitForHealthy();
    const began = Date.now();
    await this.#node(from).crash();
    const to = await this.#waitForNewMaster(from, 60_000);
    return { from, to, ms: Date.now() - began };
  }

  /** Crashes a data node (SIGKILL), master or replica; the sentinels react only if it was the master. */
  async crashNode(port: number): Promise<void> {
    await this.#node(port).crash();
  }

  /**
   * Starts a crashed data node again from its configuration file and append-only file. A former
   * master comes up as a master and the sentinels turn it into a replica of the current one
   * (discarding what only it had).
   */
  async restartNode(port: number): Promise<void> {
    await this.#node(port).start();
  }

  /** Kills every node and sentinel and deletes the directory. */
  async stop(): Promise<void> {
    await Promise.all([...this.#sentinels, ...this.#nodes].map((each) => each.crash()));
    rmSync(this.dir, { recursive: true, force: true });
  }

  /** The tail of a data node's or sentinel's log, for diagnostics. */
  logTail(port: number, chars = 2_000): string {
    return [...this.#nodes, ...this.#sentinels].find((each) => each.port === port)?.logTail(chars) ?? '';
  }

  async #waitForNewMaster(from: number, timeoutMs: number): Promise<number> {
    const to = await waitUntil(
      `a new master of ${this.masterName} (not port ${from})`,
      async () => {
        const named = await Promise.all(this.#sentinels.filter((s) => s.running).map((s) => this.#masterPortAccordingTo(s.port)));
        const master = named[0];
        if (master === undefined || master === from || named.some((port) => port !== master)) return undefined;
        return (await role(master)).role === 'master' ? master : undefined;
      },
      timeoutMs,
      50,
    );
    // A moment for the sentinels to broadcast the new configuration before the caller acts again.
    await sleep(100);
    return to;
  }

  async #masterPortAccordingTo(sentinelPort: number): Promise<number> {
    const address = (await withClient(sentinelPort, (client) => client.call('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', this.masterName))) as [string, string] | null;
    if (!address) throw new Error(`sentinel on port ${sentinelPort} does not know ${this.masterName}`);
    return Number(address[1]);
  }

  #node(port: number): RedisNode {
    const node = this.#nodes.find((each) => each.port === port);
    if (!node) throw new Error(`no data node on port ${port} (nodes: ${this.nodePorts.join(', ')})`);
    return node;
  }
}

function dataNodeConfig(node: RedisNode, masterPort: number | undefined, options: RedisSentinelOptions): string {
  return [
    `port ${node.port}`,
    'bind 127.0.0.1',
    `dir ${node.dir}`,
    `logfile ${join(node.dir, 'redis.log')}`,
    'daemonize no',
    'save ""',
    // Durable on each node, as PrivateRedis is: only a failover can lose acknowledged writes.
    'appendonly yes',
    'appendfsync always',
    `min-replicas-to-write ${options.minReplicasToWrite ?? 0}`,
    'min-replicas-max-lag 10',
    ...(masterPort !== undefined ? [`replicaof 127.0.0.1 ${masterPort}`] : []),
    '',
  ].join('\n');
}

function sentinelConfig(sentinel: RedisNode, masterName: string, masterPort: number, quorum: number, options: RedisSentinelOptions): string {
  return [
    `port ${sentinel.port}`,
    'bind 127.0.0.1',
    `dir ${sentinel.dir}`,
    `logfile ${join(sentinel.dir, 'redis.log')}`,
    'daemonize no',
    `sentinel monitor ${masterName} 127.0.0.1 ${masterPort} ${quorum}`,
    `sentinel down-after-milliseconds ${masterName} ${options.downAfterMs ?? 1_000}`,
    `sentinel failover-timeout ${masterName} ${options.failoverTimeoutMs ?? 3_000}`,
    `sentinel parallel-syncs ${masterName} 1`,
    '',
  ].join('\n');
}

/** A data node's replication role, from `INFO replication`. */
async function role(port: number): Promise<{ role: string; masterPort?: number; linkUp?: boolean }> {
  const info = await withClient(port, (client) => client.info('replication'));
  const field = (name: string) => new RegExp(`^${name}:(.*)$`, 'm').exec(info)?.[1]?.trim();
  const nodeRole = field('role') ?? 'unknown';
  if (nodeRole !== 'slave') return { role: nodeRole };
  return { role: nodeRole, masterPort: Number(field('master_port')), linkUp: field('master_link_status') === 'up' };
}

async function withClient<T>(port: number, use: (client: Redis) => Promise<T>): Promise<T> {
  // Never fall back to ioredis's default port: that is the machine's shared Redis.
  if (!Number.isInteger(port) || port <= 0) throw new Error(`no port given (${port})`);
  const client = new Redis({ port, host: '127.0.0.1', lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null, connectTimeout: 2_000 });
  client.on('error', () => {});
  try {
    await client.connect();
    return await use(client);
  } finally {
    client.disconnect();
  }
}
