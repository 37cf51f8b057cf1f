/**
 * The timestamp of each job this process adds: now, or one millisecond past the last one this
 * process gave the same job id, whichever is later.
 *
 * *Why:* BullMQ keeps the first job added under an id and ignores later adds without saying
 * which happened, so an add is known to be ours when the job the id holds has our add's
 * timestamp (`add-or-replace-finished.ts`). Two adds of one id from this process within one
 * millisecond (a repeat sent back to back on a fast machine) had the same timestamp, and the
 * ignored second one read as ours: a duplicate reported as added. Only the same id needs
 * distinct timestamps, so a burst of other jobs leaves each at its own `Date.now()`. Adds of
 * one id from two processes within one millisecond can still both read as their own: the job
 * is in the queue once either way, and only the status one of them reports is wrong.
 */
const lastByJobId = new Map<string, number>();
/** Ids remembered; the oldest is forgotten first (a millisecond later, it no longer matters). */
const REMEMBERED = 10_000;

/** The timestamp for the next add of `jobId`. */
export function addTimestamp(jobId: string, now: number = Date.now()): number {
  const last = lastByJobId.get(jobId);
  const timestamp = last !== undefined && last >= now ? last + 1 : now;
  lastByJobId.delete(jobId);
  if (lastByJobId.size >= REMEMBERED) lastByJobId.delete(lastByJobId.keys().next().value!);
  lastByJobId.set(jobId, timestamp);
  return timestamp;
}
