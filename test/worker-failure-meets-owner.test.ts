// @module-tag redis
/**
 * A run that fails for good while another run of its key holds or has just taken the key (a
 * delivery of the same job still running after a pause, a takeover) records nothing and fails
 * nothing: the job is deferred and then replays what the key's owner decided, or, when that
 * owner never finishes, runs again after its lease and records its own failure. A job is never
 * failed apart from its key, which would leave the key `processing` with no job left to end it.
 */
import { randomUUID } from 'node:crypto';
import { Queue } from 'bullmq';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  IdempotencyKeys,
  createIdempotentWorker,
  type Claim,
  type ClaimOptions,
  type ClaimOutcome,
  type IdempotentWorker,
  type IdempotentWorkerOptions,
  type JobHandler,
} from '../src/index.js';
import { waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let keys: IdempotencyKeys;
let queue: Queue;
const QUEUE = 'failure-meets-owner';
const SCOPE = 'fmo';
const workers: IdempotentWorker<any, any>[] = [];

beforeAll(async () => {
  env = await createTestEnv('failure_meets_owner');
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
  queue = new Queue(QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((worker) => worker.close({ force: true })));
});
afterAll(async () => {
  await queue?.close();
  await env?.teardown();
});

/** The claim another run of the key made, and what the test does with it. */
type OtherRun = (claim: Claim) => Promise<void>;

/**
 * Keys whose first recording of a failure (the fast path's last attempt) comes just after
 * another run claimed the key: the window between the failed run's rollback and its record.
 */
class ClaimedBeforeTheRecord extends IdempotencyKeys {
  #done = false;
  constructor(private readonly other: OtherRun, private readonly otherLeaseMs: number) {
    super({ db: env.db, schema: env.schema });
  }

  override async recordFailure(scope: string, key: string, fingerprint: string, error: unknown, options?: ClaimOptions): Promise<ClaimOutcome> {
    if (!this.#done) {
      this.#done = true;
      const claimed = await keys.claim(scope, key, fingerprint, { leaseMs: this.otherLeaseMs });
      if (claimed.kind !== 'claimed') throw new Error(`the other run could not claim the key: ${claimed.kind}`);
      void this.other(claimed);
    }
    return super.recordFailure(scope, key, fingerprint, error, options);
  }
}

/** Keys whose first failure of a held claim (the leased path's last attempt) comes just after another run took the key over. */
class TakenOverBeforeTheFailure extends IdempotencyKeys {
  #done = false;
  constructor(private readonly other: OtherRun) {
    super({ db: env.db, schema: env.schema });
  }

  override async fail(claim: Claim, error: unknown): Promise<boolean> {
    if (!this.#done) {
      this.#done = true;
      // Its lease given up, as if it had expired; the other run's claim takes it over.
      await keys.release(claim);
      const { fingerprint } = (await keys.get(claim.scope, claim.key))!;
      const taken = await keys.claim(claim.scope, claim.key, fingerprint, { leaseMs: 60_000 });
      if (taken.kind !== 'taken-over') throw new Error(`the other run could not take the key over: ${taken.kind}`);
      void this.other(taken);
    }
    return super.fail(claim, error);
  }
}

function startWorker(withKeys: IdempotencyKeys, handler: JobHandler<any>, options: Partial<IdempotentWorkerOptions<any>>) {
  const worker = createIdempotentWorker<any>({
    queue: QUEUE,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    keys: withKeys,
    handler,
    logger: pino({ level: 'silent' }),
    deferMinMs: 50,
    deferMaxMs: 500,
    ...options,
  });
  workers.push(worker);
  return worker;
}

/** Completes the other run's claim with `{ by: 'other' }` after a moment. */
const completesLater: OtherRun = async (claim) => {
  await new Promise((resolve) => setTimeout(resolve, 300));
  await keys.commitEffect(claim, async () => ({ by: 'other' }));
};

/**
 * Runs one job of `key` (one attempt) on a worker over `withKeys` whose handler always throws
 * "the card was declined", until the job completes or fails; counts the handler's runs.
 */
async function runDeclinedJob(withKeys: IdempotencyKeys, key: string, fastPath: boolean) {
  let runs = 0;
  startWorker(withKeys, async () => {
    runs++;
    throw new Error('the card was declined');
  }, { fastPath });
  const job = await queue.add('job', { idempotencyKey: key, scope: SCOPE, payload: { n: 1 } }, { jobId: `job-${randomUUID()}`, attempts: 1 });
  const done = await waitForJobState(queue, job.id!, ['completed', 'failed']);
  return { ...done, runs, record: await keys.get(SCOPE, key) };
}

describe('a run fails for good while another run of its key holds it', () => {
  it('1. fast path: the other run claimed the key before the failure was recorded and completes it: the job replays its result', async () => {
    const done = await runDeclinedJob(new ClaimedBeforeTheRecord(completesLater, 60_000), 'fast-completed', true);
    expect(done.state, done.job.failedReason).toBe('completed');
    expect(done.job.returnvalue).toEqual({ by: 'other' });
    expect(done.record).toMatchObject({ status: 'completed', result: { by: 'other' } });
    expect(done.runs).toBe(1);
  });

  it('2. fast path: the other run never finishes: after its lease the job runs again, and its failure is recorded on the key', async () => {
    const done = await runDeclinedJob(new ClaimedBeforeTheRecord(async () => {}, 1_000), 'fast-zombie', true);
    expect(done.state).toBe('failed');
    expect(done.job.failedReason).toContain('the card was declined');
    expect(done.record).toMatchObject({ status: 'failed', fence: 2, error: { message: 'the card was declined' } });
    expect(done.runs).toBe(2);
  });

  it('3. leased path: the key was taken over while the run failed: the job replays what the new owner stored', async () => {
    const done = await runDeclinedJob(new TakenOverBeforeTheFailure(completesLater), 'leased-taken-over', false);
    expect(done.state, done.job.failedReason).toBe('completed');
    expect(done.job.returnvalue).toEqual({ by: 'other' });
    expect(done.record).toMatchObject({ status: 'completed', fence: 2, result: { by: 'other' } });
    expect(done.runs).toBe(1);
  });
});

describe('a failure the store refuses for good', () => {
  it('4. leased path: the job fails and its key is released, never left processing under a lease nobody ends', async () => {
    class RefusingFailures extends IdempotencyKeys {
      override async fail(): Promise<boolean> {
        throw new Error('the store refused the failure');
      }
    }
    const done = await runDeclinedJob(new RefusingFailures({ db: env.db, schema: env.schema }), 'leased-refused', false);
    expect(done.state).toBe('failed');
    expect(done.job.failedReason).toContain('the card was declined');
    expect(done.record).toMatchObject({ status: 'processing', owner: null, error: { message: 'the card was declined' } });
    expect(done.runs).toBe(1);
  });
});
