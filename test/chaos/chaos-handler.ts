/**
 * The chaos workers' job handler and the two tables it writes. Neither table has a unique
 * constraint on the key: a second execution of an effect shows up as a second row.
 *
 * - `external_calls`: one row per simulated call to another system (a payment provider),
 *   written outside the effect's transaction and before it, as a real external call would be.
 *   The other system is assumed to be always up: the handler retries the row's insert through
 *   the nemesis's Postgres faults, under a call id of its own (unique), so a retried insert whose
 *   first COMMIT did land still leaves one row. The handler itself thus never fails; the
 *   effect's transaction is the library's to get through a fault.
 * - `effects`: one row per execution of the effect, written inside `ctx.transaction`, so it
 *   commits with the key's completion or not at all.
 */
import { randomUUID } from 'node:crypto';
import { sql, type Kysely } from 'kysely';
import type { JobContext } from '../../src/index.js';

/** What the producer puts in each job. */
export interface ChaosPayload {
  /** Sequence number of the key at the producer. */
  readonly n: number;
  /** Simulated work between the external call and the effect, in ms. */
  readonly workMs: number;
}

/** Creates the chaos tables in `schema` (after `migrate`). */
export async function createChaosTables(db: Kysely<any>, schema: string): Promise<void> {
  await sql`create table ${sql.id(schema, 'external_calls')} (
    id bigint generated always as identity primary key,
    call_id uuid not null unique,
    scope text not null,
    key text not null,
    fence bigint not null,
    worker_pid integer not null,
    at timestamptz not null default clock_timestamp()
  )`.execute(db);
  await sql`create table ${sql.id(schema, 'effects')} (
    id bigint generated always as identity primary key,
    scope text not null,
    key text not null,
    fence bigint not null,
    worker_pid integer not null,
    -- Time of the effect's insert, just before the completion and COMMIT of its transaction.
    at timestamptz not null default clock_timestamp()
  )`.execute(db);
}

/**
 * The chaos handler: an external call (its own statement, outside the transaction), some work,
 * then the effect in `ctx.transaction`. `db` resolves to the worker's pool once it is built.
 */
export function chaosHandler(schema: string, db: Promise<Kysely<any>>) {
  return async (ctx: JobContext<ChaosPayload>) => {
    const pool = await db;
    const callId = randomUUID();
    await untilDone(
      () => sql`insert into ${sql.id(schema, 'external_calls')} (call_id, scope, key, fence, worker_pid)
                values (${callId}, ${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${process.pid})
                on conflict (call_id) do nothing`.execute(pool),
      ctx.signal,
    );
    if (ctx.data.workMs > 0) await new Promise((resolve) => setTimeout(resolve, ctx.data.workMs));
    return ctx.transaction(async (tx) => {
      await sql`insert into ${sql.id(schema, 'effects')} (scope, key, fence, worker_pid)
                values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${process.pid})`.execute(tx);
      return { n: ctx.data.n, fence: ctx.fence };
    });
  };
}

/**
 * Runs `call` until it succeeds, 100 ms apart, for as long as the job may still run (its
 * `signal` aborts on shutdown); then the last error is thrown.
 */
async function untilDone<T>(call: () => Promise<T>, signal: AbortSignal): Promise<T> {
  for (;;) {
    try {
      return await call();
    } catch (error) {
      if (signal.aborted) throw signal.reason ?? error;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}
