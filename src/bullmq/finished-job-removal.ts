import type { RedisClient } from 'bullmq';
import { redisBackendOf, type AnyQueue } from './queue-connection.js';

/** A job as BullMQ stores it, read raw so that a later check can compare it byte for byte. */
export interface StoredJob {
  readonly id: string;
  readonly name: string;
  /** The data as stored (JSON text). */
  readonly rawData: string;
  /** Creation time as stored; with name and data, what tells this job from a later one under its id. */
  readonly timestamp: string;
}

/** What {@link removeFinishedJob} did. */
export type FinishedJobRemoval =
  /** The job was completed or failed and is gone: its id is free. */
  | 'removed'
  /** The job is waiting, delayed, prioritized or active: it will run or is running; left alone. */
  | 'pending'
  /** The job is finished but part of a flow (it has a parent): left alone, as removing it would break the parent's bookkeeping. */
  | 'in-flow'
  /** The id no longer holds the job that was read (removed, or replaced by another job): nothing done. */
  | 'changed';

/** Reads the job stored under `jobId`, or undefined when the id holds none. */
export async function readStoredJob(queue: AnyQueue, jobId: string): Promise<StoredJob | undefined> {
  const redis = redisBackendOf(queue);
  if (!redis) return readStoredJobAnywhere(queue, jobId);
  const client = await redis.client;
  const [name, rawData, timestamp] = await client.hmget(queue.toKey(jobId), 'name', 'data', 'timestamp');
  if (name == null || rawData == null || timestamp == null) return undefined;
  return { id: jobId, name, rawData, timestamp };
}

/**
 * Removes `job` if it is still exactly the job that was read (same name, data and timestamp)
 * and it has finished; one Lua script, so the check and the removal are atomic. Two producers
 * or relays that both saw the same finished job can therefore never remove each other's new
 * job: the second finds the id changed. BullMQ's own `remove` would remove whatever the id
 * holds by then, a waiting job included.
 *
 * The removal is BullMQ's (`removeJob.lua`) for a finished job without parent or children:
 * out of the completed or failed set, its deduplication key if it owns it, its hash and
 * sub-keys, and a `removed` event.
 */
export async function removeFinishedJob(queue: AnyQueue, job: StoredJob): Promise<FinishedJobRemoval> {
  const redis = redisBackendOf(queue);
  if (!redis) return removeFinishedJobAnywhere(queue, job);
  const client = await redis.client;
  if (!clientsWithCommand.has(client)) {
    client.defineCommand(COMMAND, { numberOfKeys: 5, lua: REMOVE_FINISHED_JOB });
    clientsWithCommand.add(client);
  }
  const outcome = await client.runCommand(COMMAND, [
    queue.toKey(job.id),
    queue.toKey('completed'),
    queue.toKey('failed'),
    queue.toKey('events'),
    queue.toKey('meta'),
    job.id,
    job.name,
    job.rawData,
    job.timestamp,
    queue.toKey(''),
  ]);
  return outcome as FinishedJobRemoval;
}

/** {@link readStoredJob} through BullMQ's backend-neutral API (the Postgres backend). */
async function readStoredJobAnywhere(queue: AnyQueue, jobId: string): Promise<StoredJob | undefined> {
  const stored = await queue.getBackend().getJobData(jobId);
  if (!stored || stored.name == null || stored.data == null || stored.timestamp == null) return undefined;
  return { id: jobId, name: stored.name, rawData: stored.data, timestamp: String(stored.timestamp) };
}

/**
 * {@link removeFinishedJob} through BullMQ's backend-neutral API (the Postgres backend): the
 * same checks, made one after another rather than in one script. Two callers that both read
 * the same finished job can therefore both pass the check; BullMQ's removal then takes
 * whatever the id holds by the second call, which can be the first caller's new job. Producers
 * that replace finished jobs under one key at the same moment are the only way there; the
 * worker's claim still refuses a reused key whose record exists.
 */
async function removeFinishedJobAnywhere(queue: AnyQueue, job: StoredJob): Promise<FinishedJobRemoval> {
  const backend = queue.getBackend();
  const now = await backend.getJobData(job.id);
  if (!now || now.name !== job.name || now.data !== job.rawData || String(now.timestamp) !== job.timestamp) return 'changed';
  const state = await backend.getState(job.id);
  if (state === 'unknown') return 'changed';
  if (state !== 'completed' && state !== 'failed') return 'pending';
  if (now.parentKey) return 'in-flow';
  await queue.remove(job.id);
  return 'removed';
}

const COMMAND = 'idempotentJobsRemoveFinishedJob';
/** Clients the script is defined on (ioredis then runs it by EVALSHA, loading it once). */
const clientsWithCommand = new WeakSet<RedisClient>();

/*
 * KEYS: job hash, completed zset, failed zset, events stream, meta hash.
 * ARGV: job id, expected name, expected data, expected timestamp, the queue's key prefix.
 */
const REMOVE_FINISHED_JOB = `
local rcall = redis.call
local jobKey, jobId = KEYS[1], ARGV[1]
local fields = rcall('HMGET', jobKey, 'name', 'data', 'timestamp', 'parentKey')
if fields[1] ~= ARGV[2] or fields[2] ~= ARGV[3] or fields[3] ~= ARGV[4] then return 'changed' end
local finishedSet, prev
if rcall('ZSCORE', KEYS[2], jobId) then finishedSet, prev = KEYS[2], 'completed'
elseif rcall('ZSCORE', KEYS[3], jobId) then finishedSet, prev = KEYS[3], 'failed'
else return 'pending' end
if fields[4] then return 'in-flow' end
rcall('ZREM', finishedSet, jobId)
local deduplicationId = rcall('HGET', jobKey, 'deid')
if deduplicationId then
  local deduplicationKey = ARGV[5] .. 'de:' .. deduplicationId
  if rcall('GET', deduplicationKey) == jobId then rcall('DEL', deduplicationKey, ARGV[5] .. 'dn:' .. deduplicationId) end
end
rcall('DEL', jobKey, jobKey .. ':logs', jobKey .. ':dependencies', jobKey .. ':processed', jobKey .. ':failed', jobKey .. ':unsuccessful')
local maxEvents = rcall('HGET', KEYS[5], 'opts.maxLenEvents') or 10000
rcall('XADD', KEYS[4], 'MAXLEN', '~', maxEvents, '*', 'event', 'removed', 'jobId', jobId, 'prev', prev)
return 'removed'
`;
