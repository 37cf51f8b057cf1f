/**
 * The workload every contender runs: one Postgres transaction that inserts one row. The
 * at-least-once baseline runs it bare; idempotent-jobs runs it through `ctx.transaction`.
 * The multi-step comparison runs three writes and a call before that completion, without
 * steps ({@link threeWritesHandler}) and as steps ({@link threeStepsHandler}).
 */
import { sql, type Kysely } from 'kysely';
import type { JobContext } from '../../src/index.js';

/** What a benchmark job carries. */
export interface BenchPayload {
  /** Distinct per key (duplicates carry the same payload, so their fingerprints match). */
  readonly n: number;
  /** Sleep this long before the effect (to keep many jobs in flight for the RSS runs). */
  readonly sleepMs?: number;
  /** On the key's first claim only, sleep this long before the effect (the recovery runs kill it here). */
  readonly holdFirstAttemptMs?: number;
}

/** The effect itself: one insert, in the caller's transaction. */
export async function insertEffect(tx: Kysely<any>, schema: string, scope: string, key: string, worker: string): Promise<void> {
  await sql`insert into ${sql.id(schema, 'bench_effects')} (scope, key, worker) values (${scope}, ${key}, ${worker})`.execute(tx);
}

/** The idempotent-jobs handler: the same effect, committed with the key's completion. */
export function benchHandler(schema: string, worker: string) {
  return async (ctx: JobContext<BenchPayload>) => {
    const payload = ctx.data;
    if (payload.sleepMs) await sleep(payload.sleepMs);
    if (payload.holdFirstAttemptMs && ctx.attempt === 1) await sleep(payload.holdFirstAttemptMs);
    return ctx.transaction(async (tx) => {
      await insertEffect(tx, schema, ctx.scope, ctx.key, worker);
      return { n: payload.n };
    });
  };
}

/**
 * The other system the multi-step jobs call: answers at once, so that the comparison measures
 * what the step around it costs, not the provider's latency (which both handlers would wait for
 * alike).
 */
async function simulatedCall(n: number): Promise<{ charged: number }> {
  return { charged: n };
}

/**
 * Three effects, then the completion, without steps: an insert (its own autocommit statement),
 * a call, an insert, then the completion's insert in `ctx.transaction`. The least a handler can
 * do for the same work; a run after a crash would repeat all of it.
 */
export function threeWritesHandler(schema: string, worker: string, db: Kysely<any>) {
  return async (ctx: JobContext<BenchPayload>) => {
    await insertEffect(db, schema, ctx.scope, ctx.key, `${worker}:reserve`);
    const charge = await simulatedCall(ctx.data.n);
    await insertEffect(db, schema, ctx.scope, ctx.key, `${worker}:ledger`);
    return ctx.transaction(async (tx) => {
      await insertEffect(tx, schema, ctx.scope, ctx.key, worker);
      return { n: ctx.data.n, charge };
    });
  };
}

/**
 * The same work as {@link threeWritesHandler} as three steps: `reserve` (a database step),
 * `charge` (an external step around the call), `ledger` (a database step), then the completion.
 */
export function threeStepsHandler(schema: string, worker: string) {
  return async (ctx: JobContext<BenchPayload>) => {
    await ctx.step('reserve', { transaction: (tx) => insertEffect(tx, schema, ctx.scope, ctx.key, `${worker}:reserve`) });
    const charge = await ctx.step('charge', () => simulatedCall(ctx.data.n));
    await ctx.step('ledger', { transaction: (tx) => insertEffect(tx, schema, ctx.scope, ctx.key, `${worker}:ledger`) });
    return ctx.transaction(async (tx) => {
      await insertEffect(tx, schema, ctx.scope, ctx.key, worker);
      return { n: ctx.data.n, charge };
    });
  };
}

/** Resolves after `ms`. */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
