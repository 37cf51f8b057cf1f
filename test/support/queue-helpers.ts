/** Small BullMQ helpers for the tests: wait for a job to reach a state, poll a condition. */
import type { Queue } from 'bullmq';

export async function waitFor<T>(
  what: string,
  probe: () => Promise<T | undefined | false>,
  timeoutMs = 20_000,
  intervalMs = 50,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await beforeDeadline(probe(), deadline, () => `timed out after ${timeoutMs} ms waiting for ${what} (its last check never returned)`);
    if (value !== undefined && value !== false) return value as T;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

/** `promise`, or an error with `message()` if it has not settled by `deadline`: a check that hangs fails the wait, naming it. */
async function beforeDeadline<T>(promise: Promise<T>, deadline: number, message: () => string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(message())), Math.max(0, deadline - Date.now()) + 1_000);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** Waits until the job is in `state` and returns its state record. */
export async function waitForJobState(queue: Queue<any, any, string, any, any, string, any, any>, jobId: string, states: string[], timeoutMs = 20_000) {
  return waitFor(`job ${jobId} to be ${states.join('|')}`, async () => {
    // State first, then the job: a job read before its state could be older than the state.
    const state = await queue.getJobState(jobId);
    if (!states.includes(state)) return undefined;
    const job = await queue.getJob(jobId);
    return job ? { job, state } : undefined;
  }, timeoutMs);
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
