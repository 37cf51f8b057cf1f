import { ErrorCode } from 'bullmq';
import { StoreUnavailableError } from '../errors.js';

/**
 * BullMQ refused to complete a job in its effect's transaction because this worker's lock on the
 * job was gone (the job stalled and went back to the queue, or another worker holds it now):
 * the effect rolled back with the refused move. Not the handler's failure, and not the job's:
 * like a store fault, it uses no attempt and stores nothing on the key (which is released), so
 * the job's current holder runs it. `code`: `'STORE_UNAVAILABLE'`.
 */
export class QueueLockLostError extends StoreUnavailableError {
  constructor(scope: string, key: string, jobId: string | undefined, options: { cause: unknown }) {
    super(scope, key, `completion of BullMQ job ${jobId}`, options);
    this.message =
      `BullMQ refused to complete job ${jobId} (idempotency key "${key}" in scope "${scope}") in its effect's transaction: ` +
      `this worker's lock on the job was lost (${(options.cause as Error)?.message ?? String(options.cause)}), so the effect was ` +
      'rolled back and nothing was recorded as the key\'s outcome. Nothing to do: the job\'s current holder runs it.';
  }
}

/** BullMQ's finishing-move refusals that mean the job is not this worker's any more. */
const NOT_OURS: ReadonlySet<number> = new Set([ErrorCode.JobLockNotExist, ErrorCode.JobLockMismatch, ErrorCode.JobNotInState, ErrorCode.JobNotExist]);

/**
 * BullMQ refused a finishing move because the job is no longer this worker's: no lock, another
 * worker's lock, the job not active (it stalled and went back to waiting), or the job gone (its
 * lock lost, then removed). BullMQ's errors carry the numeric `code` of its `ErrorCode`.
 */
export function isLockRefusal(error: unknown): boolean {
  const code = (error as { code?: unknown } | undefined)?.code;
  return error instanceof Error && typeof code === 'number' && NOT_OURS.has(code);
}
