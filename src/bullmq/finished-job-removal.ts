import type { Queue, RedisClient } from 'bullmq';

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
export async function readStoredJob(queue: Queue, jobId: string): Promise<StoredJob | undefined> {
  const client = await queue.getBackend().client;
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
export async function removeFinishedJob(queue: Queue, job: StoredJob): Promise<FinishedJobRemoval> {
  const client = await queue.getBackend().client;
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
