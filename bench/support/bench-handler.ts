/**
 * The workload every contender runs: one Postgres transaction that inserts one row. The
 * at-least-once baseline runs it bare; idempotent-jobs runs it through `ctx.transaction`.
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

/** Resolves after `ms`. */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
