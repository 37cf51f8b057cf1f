/**
 * The handler the worker tests run, in-process and in child processes. Its payload steers it:
 * sleep (a slow effect), fail N times (transient), fail for good (permanent). The effect is a
 * row in `<schema>.effects`, which has no unique constraint, so a duplicate would show.
 */
import { UnrecoverableError } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { IdempotencyKeys, createIdempotentWorker, type IdempotentWorker, type JobContext } from '../../src/index.js';
import type { TestEnv } from './test-env.js';

export interface TestPayload {
  readonly sleepMs?: number;
  /** On the key's first claim only, sleep this long first: a worker to kill mid-handler, which must not finish before the kill however slowly the test goes. */
  readonly holdFirstClaimMs?: number;
  readonly failTimes?: number;
  readonly permanent?: boolean;
  readonly value?: unknown;
}

export function testHandler(schema: string, worker: string) {
  return async (ctx: JobContext<TestPayload>) => {
    const payload = ctx.data ?? {};
    if (payload.holdFirstClaimMs && ctx.attempt === 1) await new Promise((resolve) => setTimeout(resolve, payload.holdFirstClaimMs));
    if (payload.sleepMs) await new Promise((resolve) => setTimeout(resolve, payload.sleepMs));
    if (payload.permanent) throw new UnrecoverableError('account closed (permanent)');
    if (payload.failTimes && ctx.job.attemptsMade < payload.failTimes) throw new Error('provider timed out (transient)');
    return ctx.transaction(async (tx) => {
      await sql`insert into ${sql.id(schema, 'effects')} (scope, key, fence, worker)
                values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${worker})`.execute(tx);
      return { value: payload.value ?? null, fence: ctx.fence, worker };
    });
  };
}

/**
 * An in-process worker on `queue` that runs {@link testHandler} on the test file's schema and
 * Redis prefix (concurrency 2, silent); the caller closes it.
 */
export function startTestHandlerWorker(env: TestEnv, queue: string): IdempotentWorker<TestPayload, unknown> {
  return createIdempotentWorker<TestPayload>({
    queue,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    keys: new IdempotencyKeys({ db: env.db, schema: env.schema }),
    handler: testHandler(env.schema, 'in-process'),
    concurrency: 2,
    logger: pino({ level: 'silent' }),
  });
}
