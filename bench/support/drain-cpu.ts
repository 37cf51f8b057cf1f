/**
 * CPU time of the processes one deployed drain involves, read from /proc before and after it:
 *
 * - the worker: the process the benchmark started and its descendants;
 * - Postgres: the backends serving the worker, found at the end of the drain as the rows of
 *   `pg_stat_activity` whose `client_port` is a local port of the worker's TCP sockets (its pool,
 *   its maintenance connection, and its queue's connections on the Postgres queue backend).
 *   The benchmark's own connections and other users of the shared server are left out; so are
 *   backends that closed during the drain. Every postgres process's CPU (the checkpointer, WAL
 *   writer and everyone's backends) is kept beside it, for reference;
 * - Redis: the `redis-server` process (its pid from `INFO server`) as a whole, every client's
 *   commands included: Redis cannot say which client cost what, so the benchmark's own polling
 *   (every 50 ms) and anything else using the shared server fall in it.
 *
 * Processes that started during the drain count whole; a pid reused by another process is told
 * apart by its start time.
 */
import { Redis } from 'ioredis';
import { sql, type Kysely } from 'kysely';
import { machineBusyTicks } from './cpu-usage.js';
import { readAllProcStats, readProcStat, ticksBetween, ticksToMs, type ProcStat } from './proc-stat.js';
import { tcpLocalPortsOf } from './process-tcp-ports.js';

/** CPU milliseconds one drain cost, by process. */
export interface DrainCpu {
  /** The worker process and its descendants. */
  readonly workerMs: number;
  readonly workerProcesses: number;
  /** The Postgres backends serving the worker's connections; undefined if none could be matched (Postgres elsewhere, a Unix socket, a pooler in between). */
  readonly postgresMs: number | undefined;
  readonly postgresBackends: number;
  /** Every postgres process on this machine, whoever its client (other users of the shared server included). */
  readonly postgresAllMs: number;
  /** The redis-server process; undefined when the drain's queue is not in Redis or the server's process is not on this machine. */
  readonly redisMs: number | undefined;
  /** The whole machine's busy time (`/proc/stat`), every process's. */
  readonly machineMs: number | undefined;
}

/** A drain's CPU reading in progress: started before the drain, finished after it. */
export interface DrainCpuMeter {
  /** Reads everything again; call it after the drain and before the worker is stopped (its /proc entry goes with it). */
  finish(): Promise<DrainCpu>;
}

/** What to measure: the worker's pid, the database to find its backends in, and the Redis server's pid if the queue is there. */
export interface DrainCpuTargets {
  readonly workerPid: number;
  readonly db: Kysely<any>;
  readonly redisPid: number | undefined;
  /**
   * Whether the worker's backends can be told by its sockets: not when it reaches Postgres
   * through a pooler (then the pooler's server connections do its work, shared).
   * @defaultValue true
   */
  readonly connectsDirectly?: boolean;
}

/** Takes the "before" reading. */
export function startDrainCpuMeter(targets: DrainCpuTargets): DrainCpuMeter {
  const before = readAllProcStats();
  const machineBefore = machineBusyTicks();
  return {
    async finish() {
      const after = readAllProcStats();
      const machineAfter = machineBusyTicks();
      const spent = (pids: Iterable<number>) => {
        let ticks = 0;
        for (const pid of pids) {
          const now = after.get(pid);
          if (now) ticks += ticksBetween(before.get(pid), now);
        }
        return ticksToMs(ticks);
      };
      const workerPids = descendantsOf(targets.workerPid, after);
      const ports = new Set(workerPids.flatMap((pid) => [...tcpLocalPortsOf(pid)]));
      const backends = targets.connectsDirectly === false ? [] : await backendsWithClientPorts(targets.db, ports);
      const visibleBackends = backends.filter((pid) => after.get(pid)?.comm === 'postgres');
      const postgresAll = [...after.values()].filter((stat) => stat.comm === 'postgres').map((stat) => stat.pid);
      const redis = targets.redisPid !== undefined && after.get(targets.redisPid)?.comm === 'redis-server' ? [targets.redisPid] : undefined;
      return {
        workerMs: spent(workerPids),
        workerProcesses: workerPids.length,
        postgresMs: visibleBackends.length > 0 && visibleBackends.length === backends.length ? spent(visibleBackends) : undefined,
        postgresBackends: visibleBackends.length,
        postgresAllMs: spent(postgresAll),
        redisMs: redis ? spent(redis) : undefined,
        machineMs: machineBefore !== undefined && machineAfter !== undefined ? ticksToMs(machineAfter - machineBefore) : undefined,
      };
    },
  };
}

const redisPids = new Map<string, number | undefined>();

/**
 * The pid of the Redis server at `redisUrl` (`INFO server`'s `process_id`), if that process is on
 * this machine (a server in a container or on another host reports a pid that is not its pid here).
 */
export async function redisServerPid(redisUrl: string): Promise<number | undefined> {
  if (!redisPids.has(redisUrl)) {
    const redis = new Redis(redisUrl, { maxRetriesPerRequest: 1, lazyConnect: true });
    try {
      await redis.connect();
      const pid = Number(/process_id:(\d+)/.exec(await redis.info('server'))?.[1]);
      redisPids.set(redisUrl, Number.isInteger(pid) && readProcStat(pid)?.comm === 'redis-server' ? pid : undefined);
    } finally {
      redis.disconnect();
    }
  }
  return redisPids.get(redisUrl);
}

/** `root` and every process below it, as the ppid links in `stats` show them (empty if `root` is gone). */
function descendantsOf(root: number, stats: ReadonlyMap<number, ProcStat>): number[] {
  if (!stats.has(root)) return [];
  const found = [root];
  for (let i = 0; i < found.length; i++) for (const stat of stats.values()) if (stat.ppid === found[i]) found.push(stat.pid);
  return found;
}

/** Pids of the backends whose client is one of `ports` at the benchmark's own address (this machine). */
async function backendsWithClientPorts(db: Kysely<any>, ports: ReadonlySet<number>): Promise<number[]> {
  if (ports.size === 0) return [];
  const { rows } = await sql<{ pid: number }>`
    select pid from pg_stat_activity
    where client_port = any(${[...ports]}::int[]) and client_addr = inet_client_addr()`.execute(db);
  return rows.map((row) => Number(row.pid));
}

/** A drain's CPU per 1,000 jobs, in ms: the sum and its parts (a part that could not be measured is undefined and left out of the sum). */
export interface CpuPerThousandJobs {
  readonly total: number;
  readonly node: number;
  readonly postgres: number | undefined;
  readonly redis: number | undefined;
}

/** `cpu` per 1,000 of the drain's `jobs`. */
export function cpuPerThousandJobs(cpu: DrainCpu, jobs: number): CpuPerThousandJobs {
  const per = (ms: number) => (ms * 1000) / jobs;
  const node = per(cpu.workerMs);
  const postgres = cpu.postgresMs === undefined ? undefined : per(cpu.postgresMs);
  const redis = cpu.redisMs === undefined ? undefined : per(cpu.redisMs);
  return { total: node + (postgres ?? 0) + (redis ?? 0), node, postgres, redis };
}
