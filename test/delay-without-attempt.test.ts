/**
 * A deferral's move to delayed when the queue's store does not answer for a moment: tried again,
 * never thrown to BullMQ as the job's error (on the Postgres backend BullMQ stored such a job as
 * failed once the server was back: the queue-in-Postgres chaos profile, seed 1085619041).
 */
import { DelayedError, ErrorCode, WaitingError, type Job } from 'bullmq';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { delayWithoutAttempt } from '../src/bullmq/delay-without-attempt.js';

const silent = pino({ level: 'silent' });

/** A job whose store refuses the first `failures` moves as a server that is down does. */
function jobWhoseStoreIsDown(failures: number, error: Error = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' })) {
  const moves: number[] = [];
  const job = {
    id: 'j1',
    async moveToDelayed(timestamp: number) {
      moves.push(timestamp);
      if (moves.length <= failures) throw error;
    },
  } as unknown as Job;
  return { job, moves };
}

describe('delayWithoutAttempt', () => {
  it('tries the move again while the store does not answer, then delays the job', async () => {
    const { job, moves } = jobWhoseStoreIsDown(2);
    const thrown = await delayWithoutAttempt(job, 'token', 1_000, 10_000, silent);
    expect(thrown).toBeInstanceOf(DelayedError);
    expect(moves).toHaveLength(3);
  });

  it('leaves the job to stall detection (WaitingError), never to a failure, when the store stays down past the lock', async () => {
    const { job, moves } = jobWhoseStoreIsDown(Infinity);
    const thrown = await delayWithoutAttempt(job, 'token', 1_000, 400, silent);
    expect(thrown).toBeInstanceOf(WaitingError);
    expect(moves.length).toBeGreaterThanOrEqual(2);
  });

  it('gives the job up at once when its lock is no longer this worker\'s', async () => {
    const refusal = Object.assign(new Error('Missing lock for job j1. moveToDelayed'), { code: ErrorCode.JobLockNotExist });
    const { job, moves } = jobWhoseStoreIsDown(1, refusal);
    expect(await delayWithoutAttempt(job, 'token', 1_000, 10_000, silent)).toBeInstanceOf(WaitingError);
    expect(moves).toHaveLength(1);
  });
});
