/**
 * The producers of the key-feature profiles, beside the suite's own (`producer-load.ts`):
 *
 * - {@link runCoalescingBursts} (`--coalescing`): bursts of adds of coalescing keys, each add
 *   with a higher version than the one before, sent while the key's first run is in flight, by
 *   producers whose clocks are off by minutes, both ways;
 * - {@link runLateDuplicates} (`--tombstones`): duplicates of keys whose row the janitor has
 *   deleted (their tombstone live), with their own payload and with another one;
 * - {@link runTickDuplicates} (`--racing-schedulers`): duplicates of a schedule's ticks already
 *   enqueued or finished, with the tick's own key and payload.
 *
 * Every add is a foreign raw `Queue.add` (the wire contract) under a job id that names it, so
 * the checker can tell each job's fate and, from a log line's job id, what it carried. Each add
 * is retried until Redis acknowledges it, as the suite's producer does.
 */
import { Queue } from 'bullmq';
import { sql, type Kysely } from 'kysely';
import { jobIdFor, scheduleScope, tickKey, toWireJobData } from '../../src/index.js';
import { openRedisConnection, type RedisConnectionSettings } from '../../src/process/index.js';
import type { ChaosPayload } from './chaos-handler.js';
import type { CursorSighting, LateDuplicate, TickDuplicate } from './key-feature-checks.js';
import { jobNameFor } from './job-faults.js';
import { abortableSleep } from './nemesis.js';
import type { ProducedKey } from './producer-load.js';
import { seededRandom } from './random.js';

/** The scope of the coalescing keys (their effects are checked apart from the suite's keys). */
export const COALESCING_SCOPE = 'coalesce';

/** Where the adds go. */
export interface QueueTarget {
  readonly queue: string;
  readonly prefix: string;
  readonly redis: RedisConnectionSettings;
}

/** Adds one job (stamped `timestamp`, by default the producer's clock), retrying until acknowledged; false when given up. */
async function addUntilAcknowledged(queue: Queue, name: string, data: object, jobId: string, giveUp: AbortSignal, timestamp?: number): Promise<boolean> {
  for (;;) {
    try {
      await queue.add(name, data, { jobId, ...(timestamp === undefined ? {} : { timestamp }) });
      return true;
    } catch {
      if (giveUp.aborted) return false;
      await abortableSleep(100, giveUp);
    }
  }
}

/** What {@link runCoalescingBursts} sent. */
export interface CoalescingLoad {
  /** Per coalescing key (`scope/key`): the versions acknowledged, in the order sent. */
  readonly sent: Map<string, number[]>;
  /** The version of each job id. */
  readonly versionOfJob: Map<string, number>;
  /** The send time each job id was stamped with (BullMQ's job timestamp): its producer's clock. */
  readonly stampOfJob: Map<string, number>;
  /** How far the clock that stamped each job id was off (ms; positive: ahead). */
  readonly skewOfJob: Map<string, number>;
  /** The coalescing key (`scope/key`) of each job id. */
  readonly keyOfJob: Map<string, string>;
}

/**
 * The clocks of a coalescing key's two producers, drawn from the seed: right, 2–10 minutes
 * ahead, or 2–10 minutes behind, each a third of the time; each of the key's adds is stamped by
 * one of the two at random. A clock ahead stamps jobs the database counts as sent when they first
 * arrive; a clock behind, jobs that count as sent minutes earlier than they were.
 */
export function coalescingClocks(random: ReturnType<typeof seededRandom>): [number, number] {
  const clock = () => {
    const draw = random.next();
    const minutes = random.int(2 * 60, 10 * 60) * 1_000;
    return draw < 1 / 3 ? 0 : draw < 2 / 3 ? minutes : -minutes;
  };
  return [clock(), clock()];
}

/**
 * `keys` coalescing keys spread over `spreadMs`, at most 8 bursting at once. A burst: 3–7 adds
 * of one key, versions 1, 2, …, sent one after another 30–150 ms apart (each acknowledged before
 * the next is sent), then, 0.5–1.5 s later, the last version. Each run works 300–700 ms, so most
 * adds arrive while a run of their key is in flight. Each add is stamped by one of the key's two
 * producer clocks ({@link coalescingClocks}).
 */
export async function runCoalescingBursts(
  options: QueueTarget & { readonly seed: number; readonly keys: number; readonly spreadMs: number; readonly stop: AbortSignal; readonly giveUp: AbortSignal },
): Promise<CoalescingLoad> {
  const random = seededRandom(options.seed, 13);
  const redis = openRedisConnection(options.redis);
  const queue = new Queue(options.queue, { connection: redis.connection, prefix: options.prefix });
  queue.on('error', () => {});
  const sent = new Map<string, number[]>();
  const versionOfJob = new Map<string, number>();
  const stampOfJob = new Map<string, number>();
  const skewOfJob = new Map<string, number>();
  const keyOfJob = new Map<string, string>();
  const burst = async (k: number, size: number, workMs: number[], gapsMs: number[], skews: number[]) => {
    const key = `entity-${k}`;
    const acknowledged: number[] = [];
    sent.set(`${COALESCING_SCOPE}/${key}`, acknowledged);
    for (let version = 1; version <= size; version++) {
      if (version > 1) await abortableSleep(gapsMs[version - 2]!, options.giveUp);
      const payload: ChaosPayload = { n: k, workMs: workMs[version - 1]!, version };
      const jobId = `coalesce-${k}-${version}`;
      versionOfJob.set(jobId, version);
      const skew = skews[version - 1]!;
      const stamp = Date.now() + skew;
      stampOfJob.set(jobId, stamp);
      skewOfJob.set(jobId, skew);
      keyOfJob.set(jobId, `${COALESCING_SCOPE}/${key}`);
      const data = { ...toWireJobData(COALESCING_SCOPE, key, payload), coalesce: true };
      if (await addUntilAcknowledged(queue, 'sync', data, jobId, options.giveUp, stamp)) acknowledged.push(version);
      else return;
    }
  };
  const inFlight = new Set<Promise<void>>();
  const startedAt = Date.now();
  try {
    for (let k = 0; k < options.keys && !options.stop.aborted; k++) {
      const wait = startedAt + (k * options.spreadMs) / options.keys - Date.now();
      if (wait > 0) await abortableSleep(wait, options.stop);
      if (options.stop.aborted) break;
      while (inFlight.size >= 8) await Promise.race(inFlight);
      // Drawn here, in key order, so the seed decides them whatever the timing.
      const size = random.int(3, 7);
      const workMs = Array.from({ length: size }, () => random.int(300, 700));
      const gapsMs = Array.from({ length: size - 1 }, (_, i) => (i === size - 2 ? random.int(500, 1_500) : random.int(30, 150)));
      const clocks = coalescingClocks(random);
      const skews = Array.from({ length: size }, () => clocks[random.int(0, 1)]!);
      const task = burst(k, size, workMs, gapsMs, skews);
      inFlight.add(task);
      void task.finally(() => inFlight.delete(task));
    }
    await Promise.all(inFlight);
  } finally {
    await queue.close().catch(() => {});
    await redis.close();
  }
  return { sent, versionOfJob, stampOfJob, skewOfJob, keyOfJob };
}

/**
 * Every `intervalMs` until `stop`: of the acknowledged keys first acknowledged at least
 * `olderThanMs` ago and not sent late yet, those whose row is gone and whose tombstone is live
 * (asked of Postgres), up to `perRound` of them: each sent again, two in three with its own
 * payload (job `late-same-…`), one in three with another (`late-other-…`, `workMs` + 1, a
 * different fingerprint). Returns what was acknowledged.
 */
export async function runLateDuplicates(
  options: QueueTarget & {
    readonly seed: number;
    readonly db: Kysely<any>;
    readonly schema: string;
    readonly acknowledged: () => Iterable<ProducedKey>;
    readonly olderThanMs: number;
    readonly intervalMs: number;
    readonly perRound: number;
    readonly stop: AbortSignal;
    readonly giveUp: AbortSignal;
  },
): Promise<LateDuplicate[]> {
  const random = seededRandom(options.seed, 17);
  const redis = openRedisConnection(options.redis);
  const queue = new Queue(options.queue, { connection: redis.connection, prefix: options.prefix });
  queue.on('error', () => {});
  const late: LateDuplicate[] = [];
  const done = new Set<string>();
  try {
    while (!options.stop.aborted) {
      await abortableSleep(options.intervalMs, options.stop);
      if (options.stop.aborted) break;
      const now = Date.now();
      const candidates = [...options.acknowledged()].filter((p) => p.acks > 0 && p.ackedAt[0]! < now - options.olderThanMs && !done.has(`${p.scope}/${p.key}`));
      if (candidates.length === 0) continue;
      let gone: Set<string>;
      try {
        gone = await tombstonedKeys(options.db, options.schema, candidates);
      } catch {
        continue; // Postgres down or a connection cut by a fault: the next round asks again
      }
      const chosen = candidates.filter((p) => gone.has(`${p.scope}/${p.key}`)).slice(0, options.perRound);
      await Promise.all(
        chosen.map(async (produced) => {
          const id = `${produced.scope}/${produced.key}`;
          done.add(id);
          const samePayload = random.next() < 2 / 3;
          const payload: ChaosPayload = samePayload ? produced.payload : { ...produced.payload, workMs: produced.payload.workMs + 1 };
          const jobId = `late-${samePayload ? 'same' : 'other'}-${produced.payload.n}`;
          if (await addUntilAcknowledged(queue, jobNameFor(produced.payload.fault), toWireJobData(produced.scope, produced.key, payload), jobId, options.giveUp)) {
            late.push({ id, jobId, samePayload, sentAt: Date.now() });
          }
        }),
      );
    }
  } finally {
    await queue.close().catch(() => {});
    await redis.close();
  }
  return late;
}

/**
 * Every 0.5–1.5 s (seeded) until `stop`, duplicates of the schedule's ticks, each with the tick's
 * own scope, key and payload: the newest tick enqueued (the schedule's cursor) under its own job
 * id (`same-job-id`: BullMQ keeps the one job it has, if it has it); a tick already claimed or
 * completed under a job id of its own (`other-job-id`, `tick-dup-<n>`: a second job of the
 * tick); and a completed tick whose job is removed first (as `removeOnComplete` or an operator
 * would) and then added again under its own job id (`after-removal`: a new job for BullMQ).
 * Returns what was acknowledged, and each cursor it read with the database's clock at the read:
 * every tick up to a cursor was enqueued before the cursor moved, so before that time.
 */
export async function runTickDuplicates(
  options: QueueTarget & {
    readonly seed: number;
    readonly db: Kysely<any>;
    readonly schema: string;
    /** The schedule's name, job name and payload. */
    readonly schedule: string;
    readonly jobName: string;
    readonly payload: ChaosPayload;
    readonly stop: AbortSignal;
    readonly giveUp: AbortSignal;
  },
): Promise<TickDuplicatesLoad> {
  const random = seededRandom(options.seed, 23);
  const redis = openRedisConnection(options.redis);
  const queue = new Queue(options.queue, { connection: redis.connection, prefix: options.prefix });
  queue.on('error', () => {});
  const scope = scheduleScope(options.schedule);
  const sent: TickDuplicate[] = [];
  const cursors: CursorSighting[] = [];
  const send = async (tick: string, jobId: string, kind: TickDuplicate['kind']) => {
    if (await addUntilAcknowledged(queue, options.jobName, toWireJobData(scope, tick, options.payload), jobId, options.giveUp)) {
      sent.push({ tick, jobId, kind, sentAt: Date.now() });
    }
  };
  try {
    while (!options.stop.aborted) {
      await abortableSleep(random.int(500, 1_500), options.stop);
      if (options.stop.aborted) break;
      let ticks: { cursor: string | null; seenAt: number; claimed: string[]; completed: string[] };
      try {
        ticks = await tickKeys(options.db, options.schema, options.schedule, scope);
      } catch {
        continue; // Postgres down or a connection cut by a fault: the next round asks again
      }
      if (ticks.cursor) cursors.push({ cursor: ticks.cursor, at: ticks.seenAt });
      if (ticks.cursor) await send(ticks.cursor, jobIdFor(scope, ticks.cursor), 'same-job-id');
      if (ticks.claimed.length > 0) await send(random.pick(ticks.claimed), `tick-dup-${sent.length}`, 'other-job-id');
      if (ticks.completed.length > 0) {
        const tick = random.pick(ticks.completed);
        const jobId = jobIdFor(scope, tick);
        try {
          // Only a completed job: an active one is a run in progress (BullMQ refuses to remove it).
          if ((await queue.getJobState(jobId)) !== 'completed' || (await queue.remove(jobId)) !== 1) continue;
        } catch {
          continue; // Redis down or restarting: the next round tries another
        }
        await send(tick, jobId, 'after-removal');
      }
    }
  } finally {
    await queue.close().catch(() => {});
    await redis.close();
  }
  return { duplicates: sent, cursors };
}

/** What {@link runTickDuplicates} did. */
export interface TickDuplicatesLoad {
  readonly duplicates: TickDuplicate[];
  readonly cursors: CursorSighting[];
}

/**
 * The schedule's cursor (the newest tick enqueued) with the database's clock read after the
 * snapshot (`clock_timestamp()`, so after the cursor's commit), and its ticks claimed, and
 * completed, by their key rows.
 */
async function tickKeys(db: Kysely<any>, schema: string, schedule: string, scope: string): Promise<{ cursor: string | null; seenAt: number; claimed: string[]; completed: string[] }> {
  const { rows: cursor } = await sql<{ last_tick: Date | null; seen_at: number }>`
    select last_tick, extract(epoch from clock_timestamp())::float8 * 1000 as seen_at
      from ${sql.id(schema, 'schedules')} where name = ${schedule}`.execute(db);
  const { rows: keys } = await sql<{ key: string; status: string }>`
    select key, status from ${sql.id(schema, 'idempotency_keys')} where scope = ${scope}`.execute(db);
  const lastTick = cursor[0]?.last_tick;
  return {
    cursor: lastTick ? tickKey(lastTick) : null,
    seenAt: Number(cursor[0]?.seen_at),
    claimed: keys.map((row) => row.key),
    completed: keys.filter((row) => row.status === 'completed').map((row) => row.key),
  };
}

/** Of `keys`, those whose row is gone and whose tombstone is live, by `scope/key`. */
async function tombstonedKeys(db: Kysely<any>, schema: string, keys: readonly ProducedKey[]): Promise<Set<string>> {
  const { rows } = await sql<{ scope: string; key: string }>`
    select c.scope, c.key
      from unnest(${keys.map((k) => k.scope)}::text[], ${keys.map((k) => k.key)}::text[]) as c(scope, key)
     where not exists (select 1 from ${sql.id(schema, 'idempotency_keys')} as k where k.scope = c.scope and k.key = c.key)
       and exists (select 1 from ${sql.id(schema, 'key_tombstones')} as t
                    where t.scope = c.scope and t.key_hash = sha256(convert_to(c.key, 'UTF8')) and t.expires_at > now())`.execute(db);
  return new Set(rows.map((row) => `${row.scope}/${row.key}`));
}
