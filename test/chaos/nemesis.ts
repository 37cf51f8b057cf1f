/**
 * The nemesis: a fault schedule drawn from a seed, then carried out against the running system.
 * Faults come in shuffled rounds of every kind, so even a short run sees each kind at least once.
 */
import { sql, type Kysely } from 'kysely';
import type { ChaosRedis } from './chaos-redis.js';
import type { CrashPoint } from './fault-injection.js';
import type { PrivatePostgres } from './private-postgres.js';
import type { PatroniCluster } from '../support/patroni-cluster.js';
import { seededRandom } from './random.js';
import type { WorkerFleet } from './worker-fleet.js';

/** Kinds of faults, and what each one tests (see docs/chaos.md). */
export const FAULT_KINDS = [
  'kill',
  'pause',
  'pg-terminate',
  'pg-crash',
  'pg-restart',
  'pg-pause',
  'redis-client-kill',
  'redis-restart',
  'crash-after-claim',
  'crash-before-commit',
  'crash-after-commit',
] as const;

/**
 * The multi-step profile's extra kinds (`--steps`): crashes the multi-step handler reaches
 * inside a database step, inside the external step, and between steps.
 */
export const STEP_FAULT_KINDS = ['crash-inside-database-step', 'crash-inside-external-step', 'crash-between-steps'] as const;

/**
 * The Redis Cluster profile's extra kind (`--redis-cluster`): a coordinated failover of the
 * queue's shard, its replica taking over the slots (nothing acknowledged is lost).
 */
export const CLUSTER_FAULT_KINDS = ['redis-failover'] as const;

/**
 * The Patroni profile's Postgres faults (`--patroni`), each carried out on the private Patroni
 * cluster and followed by a wait until it is healthy again (a leader and every standby
 * streaming) so that two never overlap: SIGKILL of the leader's Postgres (Patroni restarts it in
 * place), a crash of the whole leader member (a standby takes over once the lock's TTL runs out;
 * the crashed member rejoins as a standby), the same crash after the standby fell behind (the
 * leader's WAL sender to it frozen for `lagMs`: with asynchronous replication the leader goes on
 * acknowledging commits that only it has, and the failover loses them; with synchronous
 * replication those commits wait and are never acknowledged), a planned switchover, and a
 * manual failover. With
 * two members every change of leader is undone by the next one: "fail over and back".
 */
export const PATRONI_FAULT_KINDS = ['patroni-kill-postgres', 'patroni-crash-leader', 'patroni-lagging-crash', 'patroni-switchover', 'patroni-failover'] as const;

/**
 * What the Patroni profile does between its Postgres faults: worker deaths, connections cut and
 * crashes around the commit. Not the single server's faults (crash, restart and freeze of the
 * one Postgres): the cluster's are those above.
 */
export const PATRONI_OTHER_KINDS = ['kill', 'pg-terminate', 'crash-after-claim', 'crash-before-commit', 'crash-after-commit', 'redis-client-kill'] as const;

/** One of {@link FAULT_KINDS}, {@link STEP_FAULT_KINDS}, {@link CLUSTER_FAULT_KINDS} or {@link PATRONI_FAULT_KINDS}. */
export type FaultKind =
  | (typeof FAULT_KINDS)[number]
  | (typeof STEP_FAULT_KINDS)[number]
  | (typeof CLUSTER_FAULT_KINDS)[number]
  | (typeof PATRONI_FAULT_KINDS)[number];

/**
 * The kinds a run's schedule draws from: every kind, the step kinds when the handler has steps,
 * the failover on a cluster; none of Redis's when the queue is in Postgres (no Redis runs).
 */
export function faultKindsFor(steps: boolean, redisCluster = false, queueInPostgres = false): readonly FaultKind[] {
  const kinds = [...FAULT_KINDS, ...(steps ? STEP_FAULT_KINDS : []), ...(redisCluster ? CLUSTER_FAULT_KINDS : [])];
  return queueInPostgres ? kinds.filter((kind) => !kind.startsWith('redis-')) : kinds;
}

/** One scheduled fault. */
export interface NemesisOp {
  /** When, from the start of the chaos phase. */
  readonly atMs: number;
  readonly kind: FaultKind;
  /** Target worker slot (for worker faults). */
  readonly slot: number;
  /** `pause`, `pg-pause`: how long the worker or Postgres stays stopped. */
  readonly pauseMs?: number;
  /** `redis-restart`, `pg-crash`, `pg-restart`: how long the server stays down. */
  readonly downMs?: number;
  /** `patroni-lagging-crash`: how long the standby receives nothing before the leader crashes. */
  readonly lagMs?: number;
  /** `pg-terminate`, `redis-client-kill`: the share of connections cut. */
  readonly fraction?: number;
}

/** A fault as it was carried out. */
export interface NemesisEvent extends NemesisOp {
  /** Wall-clock time it was carried out. */
  readonly at: number;
  /**
   * Wall-clock time it was over: for the Redis and Patroni faults, once the servers were healthy
   * again (a Sentinel failover's re-sending window ends here, `failover-resend.ts`).
   */
  readonly endedAt: number;
  /** Target process, when there was one. */
  readonly pid?: number;
  /** Connections cut. */
  readonly cut?: number;
  /** Why nothing was done (no live target). */
  readonly skipped?: string;
  /** `redis-failover`: the ports of the old and the new master. */
  readonly failover?: { readonly from: number; readonly to: number };
  /** The Patroni faults: the leader before and after, and how long until the cluster was healthy again. */
  readonly leader?: { readonly from: string | undefined; readonly to: string; readonly healthyAfterMs: number };
}

/** What the schedule depends on; the same seed and parameters give the same schedule. */
export interface ScheduleOptions {
  readonly seed: number;
  readonly durationMs: number;
  readonly intervalMs: number;
  readonly workers: number;
  readonly leaseMs: number;
  /** The multi-step profile: rounds include {@link STEP_FAULT_KINDS}. @defaultValue false */
  readonly steps?: boolean;
  /** The Redis Cluster profile: rounds include {@link CLUSTER_FAULT_KINDS}. @defaultValue false */
  readonly redisCluster?: boolean;
  /**
   * The Patroni profile: every other fault is one of {@link PATRONI_FAULT_KINDS} (in shuffled
   * rounds, so a short run sees each), the ones between drawn from {@link PATRONI_OTHER_KINDS}.
   * @defaultValue false
   */
  readonly patroni?: boolean;
  /** The queue is in Postgres: rounds include no Redis fault. @defaultValue false */
  readonly queueInPostgres?: boolean;
}

/** The seeded fault schedule. */
export function nemesisSchedule(options: ScheduleOptions): NemesisOp[] {
  const random = seededRandom(options.seed, 1);
  const ops: NemesisOp[] = [];
  let round: FaultKind[] = [];
  // Let the workers settle before the first fault; stop one lease before the end.
  let atMs = Math.min(3_000, options.intervalMs);
  let clusterRound: FaultKind[] = [];
  while (atMs < options.durationMs - options.leaseMs) {
    let kind: FaultKind;
    if (options.patroni) {
      if (clusterRound.length === 0) clusterRound = random.shuffle(PATRONI_FAULT_KINDS);
      kind = ops.length % 2 === 0 ? clusterRound.pop()! : PATRONI_OTHER_KINDS[random.int(0, PATRONI_OTHER_KINDS.length - 1)]!;
    } else {
      if (round.length === 0) round = random.shuffle(faultKindsFor(options.steps ?? false, options.redisCluster ?? false, options.queueInPostgres ?? false));
      kind = round.pop()!;
    }
    const slot = random.int(0, options.workers - 1);
    const op: NemesisOp = { atMs, kind, slot };
    if (kind === 'pause' || kind === 'pg-pause') ops.push({ ...op, pauseMs: Math.round(options.leaseMs * (1.5 + random.next())) });
    else if (kind === 'redis-restart' || kind === 'pg-crash' || kind === 'pg-restart') ops.push({ ...op, downMs: random.int(200, 2_000) });
    else if (kind === 'patroni-lagging-crash') ops.push({ ...op, lagMs: random.int(500, 3_000) });
    else if (kind === 'pg-terminate' || kind === 'redis-client-kill') ops.push({ ...op, fraction: 0.25 + 0.75 * random.next() });
    else ops.push(op);
    atMs += Math.round(options.intervalMs * (0.5 + random.next()));
  }
  return ops;
}

/** What the nemesis acts on. */
export interface NemesisTargets {
  readonly fleet: WorkerFleet;
  /** The private Redis or Redis Cluster, with its faults (none when the queue is in Postgres). */
  readonly redis?: ChaosRedis;
  /** The private Postgres cluster the workers use (not in the Patroni profile). */
  readonly postgres?: PrivatePostgres;
  /** The Patroni profile's cluster (leader behind HAProxy), instead of {@link postgres}. */
  readonly patroni?: PatroniCluster;
  /** The harness's own pool on it. */
  readonly db: Kysely<any>;
  /** The workers' `application_name`, which identifies their Postgres backends. */
  readonly applicationName: string;
}

/**
 * Carries out `schedule` from `startedAt`, until done or `signal` aborts. Paused workers are
 * resumed before it returns.
 */
export async function runNemesis(
  schedule: readonly NemesisOp[],
  targets: NemesisTargets,
  startedAt: number,
  signal: AbortSignal,
  seed: number,
): Promise<NemesisEvent[]> {
  const random = seededRandom(seed, 2);
  const events: NemesisEvent[] = [];
  const resumes: Array<Promise<void>> = [];
  for (const op of schedule) {
    const wait = startedAt + op.atMs - Date.now();
    if (wait > 0) await abortableSleep(wait, signal);
    if (signal.aborted) break;
    try {
      events.push(await carryOut(op, targets, random.next, resumes, signal));
    } catch (error) {
      events.push({ ...op, at: Date.now(), endedAt: Date.now(), skipped: `failed: ${(error as Error).message}` });
    }
  }
  await Promise.all(resumes);
  return events;
}

async function carryOut(
  op: NemesisOp,
  targets: NemesisTargets,
  next: () => number,
  resumes: Array<Promise<void>>,
  signal: AbortSignal,
): Promise<NemesisEvent> {
  const { fleet } = targets;
  const at = Date.now();
  const done = (extra: Partial<NemesisEvent>): NemesisEvent => ({ ...op, at, endedAt: Date.now(), ...extra });
  switch (op.kind) {
    case 'kill': {
      const pid = fleet.signal(op.slot, 'SIGKILL');
      return pid === undefined ? done({ skipped: 'no live worker in slot' }) : done({ pid });
    }
    case 'pause': {
      if (fleet.isPaused(op.slot)) return done({ skipped: 'already paused' });
      const pid = fleet.signal(op.slot, 'SIGSTOP');
      if (pid === undefined) return done({ skipped: 'no live worker in slot' });
      resumes.push(
        abortableSleep(op.pauseMs!, signal).then(() => {
          if (fleet.pidOf(op.slot) === pid) fleet.signal(op.slot, 'SIGCONT');
        }),
      );
      return done({ pid });
    }
    case 'pg-terminate': {
      if (targets.postgres?.paused) return done({ skipped: 'postgres is paused' });
      const { rows } = await sql<{ pid: number }>`
        select pid from pg_stat_activity
         where application_name = ${targets.applicationName} and pid <> pg_backend_pid()
         order by pid`.execute(targets.db);
      const chosen = choose(rows.map((r) => r.pid), op.fraction!, next);
      for (const pid of chosen) await sql`select pg_terminate_backend(${pid}::int)`.execute(targets.db);
      return done({ cut: chosen.length });
    }
    case 'pg-crash': {
      if (!targets.postgres) return done({ skipped: 'no single server' });
      // A frozen server (pg-pause) is killed as well: SIGKILL needs no cooperation.
      const pid = targets.postgres.pid;
      await targets.postgres.crashAndRecover(op.downMs!);
      return done({ pid });
    }
    case 'pg-restart': {
      if (!targets.postgres) return done({ skipped: 'no single server' });
      if (targets.postgres.paused) return done({ skipped: 'postgres is paused' });
      const pid = targets.postgres.pid;
      await targets.postgres.fastRestart(op.downMs!);
      return done({ pid });
    }
    case 'pg-pause': {
      const { postgres } = targets;
      if (!postgres) return done({ skipped: 'no single server' });
      if (postgres.paused) return done({ skipped: 'already paused' });
      const pid = postgres.pid;
      if (pid === undefined) return done({ skipped: 'postgres is down' });
      postgres.pause();
      resumes.push(
        abortableSleep(op.pauseMs!, signal).then(() => {
          // Only the server that was frozen: a crash in between started another one.
          if (postgres.pid === pid) postgres.resume();
        }),
      );
      return done({ pid });
    }
    case 'redis-client-kill':
      if (!targets.redis) return done({ skipped: 'no Redis' });
      return done({ cut: await targets.redis.killClients(op.fraction!, next) });
    case 'redis-restart':
      if (!targets.redis) return done({ skipped: 'no Redis' });
      await targets.redis.restart(op.downMs!);
      return done({});
    case 'redis-failover': {
      if (!targets.redis?.failover) return done({ skipped: 'not a cluster' });
      return done({ failover: await targets.redis.failover() });
    }
    case 'patroni-kill-postgres':
    case 'patroni-crash-leader':
    case 'patroni-lagging-crash':
    case 'patroni-switchover':
    case 'patroni-failover': {
      if (!targets.patroni) return done({ skipped: 'no Patroni cluster' });
      return done({ leader: await patroniFault(op, targets.patroni, signal) });
    }
    case 'crash-after-claim':
    case 'crash-before-commit':
    case 'crash-after-commit':
    case 'crash-inside-database-step':
    case 'crash-inside-external-step':
    case 'crash-between-steps': {
      const pid = fleet.arm(op.slot, op.kind.slice('crash-'.length) as CrashPoint);
      return pid === undefined ? done({ skipped: 'no live worker in slot' }) : done({ pid });
    }
  }
}

/**
 * One Patroni fault, then the wait until the cluster is healthy again (a leader taking writes,
 * every standby streaming): the next fault must not find a member still rejoining.
 */
async function patroniFault(op: NemesisOp, cluster: PatroniCluster, signal: AbortSignal): Promise<NemesisEvent['leader']> {
  const began = Date.now();
  let from: string | undefined;
  let to: string;
  switch (op.kind as (typeof PATRONI_FAULT_KINDS)[number]) {
    case 'patroni-kill-postgres':
      from = await cluster.killLeaderPostgres();
      to = await cluster.waitForLeader();
      break;
    case 'patroni-crash-leader':
      from = await cluster.crashLeader();
      to = await cluster.waitForLeader({ notMember: from, timeoutMs: 60_000 });
      await cluster.restartMember(from);
      break;
    case 'patroni-lagging-crash': {
      const standby = (await cluster.members()).find((m) => m.role !== 'leader')?.name;
      if (standby !== undefined) await cluster.pauseReplication(standby);
      // Sleeps through an abort too: the standby must not stay frozen behind a leader left alive.
      await abortableSleep(op.lagMs ?? 1_000, signal);
      from = await cluster.crashLeader();
      if (standby !== undefined) cluster.resumeReplication(standby);
      to = await cluster.waitForLeader({ notMember: from, timeoutMs: 60_000 });
      await cluster.restartMember(from);
      break;
    }
    case 'patroni-switchover':
      ({ from, to } = await cluster.switchover());
      break;
    case 'patroni-failover':
      ({ from, to } = await cluster.failover());
      break;
  }
  await cluster.waitForHealthy(90_000);
  return { from, to, healthyAfterMs: Date.now() - began };
}

/** At least one, about `fraction` of `items`, chosen with the seeded generator. */
function choose<T>(items: readonly T[], fraction: number, next: () => number): T[] {
  if (items.length === 0) return [];
  const count = Math.max(1, Math.round(items.length * fraction));
  const pool = [...items];
  const chosen: T[] = [];
  while (chosen.length < count) chosen.push(pool.splice(Math.floor(next() * pool.length), 1)[0]!);
  return chosen;
}

/** Sleeps `ms`, or less if `signal` aborts. */
export function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done, { once: true });
  });
}
