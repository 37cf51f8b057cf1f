import { setTimeout as sleep } from 'node:timers/promises';
import { DelayedError, WaitingError, type Job } from 'bullmq';
import type { Logger } from 'pino';
import { isLockRefusal } from './queue-lock-lost-error.js';

/**
 * What the processor throws to leave a job delayed without using an attempt. A move that the
 * queue's store does not answer (Redis, or the queue's Postgres, restarting) is tried again
 * for up to the lock's duration: thrown to BullMQ, its error would count as the job's failure,
 * and on the Postgres backend BullMQ could store it as failed once the server is back. If the
 * store still does not answer, the job is left to BullMQ's stall detection, which gives it
 * back (`WaitingError`: the processor has dealt with it; stalls never fail a job here, see
 * `maxStalledCount`): an infrastructure fault delays a job, it never fails it.
 */
export async function delayWithoutAttempt(job: Job, token: string | undefined, delayMs: number, lockDurationMs: number, log: Logger): Promise<Error> {
  const deadline = performance.now() + lockDurationMs;
  for (let waitMs = 100; ; waitMs = Math.min(waitMs * 2, 2_000)) {
    try {
      await job.moveToDelayed(Date.now() + delayMs, token);
      return new DelayedError();
    } catch (error) {
      // The job is no longer this worker's: its holder runs it.
      if (isLockRefusal(error)) return new WaitingError();
      if (performance.now() + waitMs > deadline) {
        log.warn({ err: error, jobId: job.id }, "could not delay the job: the queue's store did not answer; BullMQ's stall detection gives it back");
        return new WaitingError();
      }
      await sleep(waitMs);
    }
  }
}
