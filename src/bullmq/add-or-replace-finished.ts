import type { JobsOptions } from 'bullmq';
import type { Fingerprinter } from '../fingerprint.js';
import { addTimestamp } from './add-timestamps.js';
import { readStoredJob, removeFinishedJob, type StoredJob } from './finished-job-removal.js';
import { fingerprintOfJob } from './job-fingerprint.js';
import type { AnyQueue } from './queue-connection.js';

/** One job to add under its deterministic id. */
export interface JobToAdd {
  readonly name: string;
  /** The wire-contract data. */
  readonly data: unknown;
  /** BullMQ options, `jobId` included. */
  readonly opts: JobsOptions & { readonly jobId: string };
  /** Fingerprint of the job's name and payload, by the same fingerprinter as the call's. */
  readonly fingerprint: string;
}

/**
 * What became of one job:
 * - `added`: the id was free; the job is ours.
 * - `duplicate`: the id holds a job with the same fingerprint (pending or finished), which
 *   stands for ours: it runs, ran, or its claim replays the key's outcome.
 * - `replaced`: the id held a finished job with another fingerprint (an earlier request whose
 *   key record retention has since deleted, or a reuse the worker will refuse); that job was
 *   removed and ours added.
 * - `held-by-other`: the id holds a job with another fingerprint that is still waiting,
 *   delayed or running (or finished inside a flow). Ours was not added; once that job has
 *   finished, a new attempt replaces it.
 */
export type AddOutcome = 'added' | 'duplicate' | 'replaced' | 'held-by-other';

/** How many times one job is re-read after the id changed under it before giving up for now. */
const MAX_ROUNDS = 5;

/**
 * Adds jobs under their deterministic ids and never drops one silently. BullMQ ignores an add
 * whose id exists in any state, and it keeps finished jobs: after the key's record has
 * expired, a new request with the same key but another payload would be dropped, and readers
 * of the old job would take its result for the new request's. So each job is read back: the
 * same fingerprint is a true duplicate; a finished job with another fingerprint is removed
 * (atomically, only if it is still that job: see {@link removeFinishedJob}) and ours added;
 * a pending one with another fingerprint is reported, for the caller to refuse or retry.
 *
 * `inIdOrder` (the PostgreSQL backend's callers set it): the batch goes in job-id order, see
 * {@link addBulkInIdOrder}; on Redis a batch is one atomic script, and keeps the caller's order.
 * `inCallersTransaction`: a deadlock aborted the caller's transaction, so the batch is not sent
 * again; the caller's transaction fails with it.
 *
 * One BullMQ round trip for the batch, one read per job, and more only where an id is taken.
 * Racing callers are safe: only one of them can remove a given finished job, and every adder
 * then reads back what the id holds.
 */
export async function addOrReplaceFinished(
  queue: AnyQueue,
  jobs: readonly JobToAdd[],
  fingerprint: Fingerprinter,
  options: { readonly inIdOrder?: boolean; readonly inCallersTransaction?: boolean } = {},
): Promise<AddOutcome[]> {
  jobs = jobs.map(timestamped);
  const added = options.inIdOrder ? await addBulkInIdOrder(queue, jobs, options.inCallersTransaction ? 0 : MAX_DEADLOCK_RETRIES) : await queue.addBulk(jobs.map((job) => ({ name: job.name, data: job.data, opts: job.opts })));
  const stored = await Promise.all(jobs.map((job) => readStoredJob(queue, job.opts.jobId)));
  const seen = new Set<string>();
  const outcomes: AddOutcome[] = [];
  for (const [i, job] of jobs.entries()) {
    const repeatedInBatch = seen.has(job.opts.jobId);
    seen.add(job.opts.jobId);
    const ourAdd = !repeatedInBatch && stored[i]?.timestamp === String(added[i]!.timestamp);
    outcomes.push(await outcomeOfAdd(queue, job, stored[i], ourAdd, fingerprint));
  }
  return outcomes;
}

/** `job` with the timestamp of its add (see `add-timestamps.ts`), unless its caller chose one. */
function timestamped(job: JobToAdd): JobToAdd {
  return job.opts.timestamp === undefined ? { ...job, opts: { ...job.opts, timestamp: addTimestamp(job.opts.jobId) } } : job;
}

/** How many times a batch that Postgres rolled back for a deadlock is sent again. */
const MAX_DEADLOCK_RETRIES = 3;

/**
 * `queue.addBulk` with the jobs in id order, its answers in the callers' order. On BullMQ's
 * PostgreSQL backend a batch inserts its rows in the order given, in one transaction: two
 * batches sharing ids in different orders each wait for the other's insert on the job table's
 * unique index, and Postgres ends one with a deadlock (40P01). In one order they never wait in a
 * cycle. (The sort is stable: an id repeated in a batch keeps its first occurrence first.) A
 * deadlock from elsewhere rolled the whole batch back, so it is sent again, as a fault of the
 * moment and never the caller's.
 */
async function addBulkInIdOrder(queue: AnyQueue, jobs: readonly JobToAdd[], deadlockRetries: number): Promise<Array<{ readonly timestamp: number }>> {
  const order = jobs.map((_, i) => i).sort((a, b) => (jobs[a]!.opts.jobId < jobs[b]!.opts.jobId ? -1 : jobs[a]!.opts.jobId > jobs[b]!.opts.jobId ? 1 : 0));
  for (let attempt = 0; ; attempt++) {
    try {
      const added = await queue.addBulk(order.map((i) => ({ name: jobs[i]!.name, data: jobs[i]!.data, opts: jobs[i]!.opts })));
      const inCallersOrder = new Array<{ readonly timestamp: number }>(jobs.length);
      order.forEach((i, position) => (inCallersOrder[i] = added[position]!));
      return inCallersOrder;
    } catch (error) {
      if (attempt >= deadlockRetries || (error as { code?: unknown } | null)?.code !== '40P01') throw error;
    }
  }
}

async function outcomeOfAdd(
  queue: AnyQueue,
  job: JobToAdd,
  firstRead: StoredJob | undefined,
  firstAddWasOurs: boolean,
  fingerprint: Fingerprinter,
): Promise<AddOutcome> {
  let stored = firstRead;
  let addedByUs = firstAddWasOurs;
  let removedOther = false;
  for (let round = 0; round < MAX_ROUNDS; round++) {
    if (stored && fingerprintOfStored(stored, fingerprint) === job.fingerprint) {
      return removedOther ? 'replaced' : addedByUs ? 'added' : 'duplicate';
    }
    // Our add went in and is gone already: the job ran and was removed on completion.
    if (!stored && addedByUs) return removedOther ? 'replaced' : 'added';
    if (stored) {
      const removal = await removeFinishedJob(queue, stored);
      if (removal === 'pending' || removal === 'in-flow') return 'held-by-other';
      if (removal === 'changed') {
        stored = await readStoredJob(queue, job.opts.jobId);
        continue;
      }
      removedOther = true;
    }
    // The id is free: we removed the finished job, or the job that made BullMQ ignore our
    // add has gone since. Should a racer add first, the next round reads its job.
    const again = timestamped({ ...job, opts: { ...job.opts, timestamp: undefined } });
    const ours = await queue.add(again.name, again.data, again.opts);
    stored = await readStoredJob(queue, job.opts.jobId);
    addedByUs = !stored || stored.timestamp === String(ours.timestamp);
  }
  throw new Error(
    `BullMQ job ${job.opts.jobId} in queue "${queue.name}" kept changing while it was being added (${MAX_ROUNDS} rounds): ` +
      'other producers are adding under this key at the same time. Try again.',
  );
}

function fingerprintOfStored(stored: StoredJob, fingerprint: Fingerprinter): string | undefined {
  let data: unknown;
  try {
    data = JSON.parse(stored.rawData);
  } catch {
    return undefined;
  }
  return fingerprintOfJob({ name: stored.name, data }, fingerprint);
}
