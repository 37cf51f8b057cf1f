/**
 * The chaos workers' job handlers and the tables they write. No table has a unique constraint
 * on the key: a second execution of an effect shows up as a second row.
 *
 * - `external_calls`: one row per simulated call to another system (a payment provider),
 *   written outside the key's transactions, as a real external call would be, with the
 *   caller's fence, pid and the time. The other system is assumed to be always up: the handler
 *   retries the row's insert through the nemesis's Postgres faults, under a call id of its own
 *   (unique), so a retried insert whose first COMMIT did land still leaves one row. The handler
 *   itself thus never fails; the key's transactions are the library's to get through a fault.
 * - `effects`: one row per execution of the effect, written inside `ctx.transaction`, so it
 *   commits with the key's completion or not at all.
 * - `step_effects` (the multi-step handler only): one row per execution of a database step,
 *   written inside the step's transaction, so it commits with the step's record or not at all.
 *
 * {@link chaosHandler} makes one external call, then the effect. {@link databaseOnlyChaosHandler}
 * (`--database-only`) is the database-only form: the work and the effect in its one
 * transaction, no external call. {@link chaosStepsHandler}
 * (`--steps`) runs three steps, then the completion: `reserve` (database), `charge` (external:
 * its call is the `external_calls` row), `ledger` (database), and crashes at the step points of
 * its {@link Crasher} when they are armed.
 */
import { randomUUID } from 'node:crypto';
import { sql, type Kysely } from 'kysely';
import type { DatabaseOnlyJobHandler, JobContext } from '../../src/index.js';
import type { Crasher } from './fault-injection.js';

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
    at timestamptz not null default clock_timestamp(),
    -- The multi-step handler's calls: the step that made the call, and its start count then.
    step text,
    starts integer
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
  await sql`create table ${sql.id(schema, 'step_effects')} (
    id bigint generated always as identity primary key,
    scope text not null,
    key text not null,
    step text not null,
    fence bigint not null,
    worker_pid integer not null,
    -- Time of the write, just before the step's record and the COMMIT of its transaction.
    at timestamptz not null default clock_timestamp()
  )`.execute(db);
}

/** The multi-step handler's steps, in the order it calls them (the checker reads this too). */
export const CHAOS_STEPS = [
  { name: 'reserve', kind: 'database' },
  { name: 'charge', kind: 'external' },
  { name: 'ledger', kind: 'database' },
] as const satisfies ReadonlyArray<{ readonly name: string; readonly kind: 'database' | 'external' }>;

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
 * The database-only chaos handler (`--database-only`): `{ transaction }`, so the workers run it
 * on the fast path with group commit by default. The simulated work, then the effect row, both
 * inside its transaction (there is no outside): nothing but the database, as the form requires.
 */
export function databaseOnlyChaosHandler(schema: string): DatabaseOnlyJobHandler<ChaosPayload, unknown> {
  return {
    transaction: async (tx, ctx) => {
      if (ctx.data.workMs > 0) await new Promise((resolve) => setTimeout(resolve, ctx.data.workMs));
      await sql`insert into ${sql.id(schema, 'effects')} (scope, key, fence, worker_pid)
                values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${process.pid})`.execute(tx);
      return { n: ctx.data.n, fence: ctx.fence };
    },
  };
}

/**
 * The multi-step chaos handler (`--steps`): `reserve` (a database step: one `step_effects`
 * row), `charge` (an external step: the simulated work, then one `external_calls` row, written
 * outside any transaction of the key), `ledger` (a database step), then the effect row in
 * `ctx.transaction`. `crash` is reached inside each step (after its write, before its record)
 * and after each step (before the next one, or the completion).
 */
export function chaosStepsHandler(schema: string, db: Promise<Kysely<any>>, crash: Crasher) {
  const databaseStep = (ctx: JobContext<ChaosPayload>, name: string) =>
    ctx.step(name, {
      transaction: async (tx, step) => {
        await sql`insert into ${sql.id(schema, 'step_effects')} (scope, key, step, fence, worker_pid)
                  values (${ctx.scope}, ${ctx.key}, ${name}, ${step.fence}, ${process.pid})`.execute(tx);
        crash('inside-database-step', { scope: ctx.scope, key: ctx.key, step: name });
        return { fence: step.fence };
      },
    });
  return async (ctx: JobContext<ChaosPayload>) => {
    const pool = await db;
    const at = { scope: ctx.scope, key: ctx.key };
    const reserve = await databaseStep(ctx, 'reserve');
    crash('between-steps', { ...at, step: 'reserve' });
    const charge = await ctx.step('charge', async (step) => {
      if (ctx.data.workMs > 0) await new Promise((resolve) => setTimeout(resolve, ctx.data.workMs));
      const callId = randomUUID();
      await untilDone(
        () => sql`insert into ${sql.id(schema, 'external_calls')} (call_id, scope, key, fence, worker_pid, step, starts)
                  values (${callId}, ${ctx.scope}, ${ctx.key}, ${step.fence}, ${process.pid}, ${step.name}, ${step.starts})
                  on conflict (call_id) do nothing`.execute(pool),
        step.signal,
      );
      crash('inside-external-step', { ...at, step: step.name });
      return { fence: step.fence, starts: step.starts };
    });
    crash('between-steps', { ...at, step: 'charge' });
    const ledger = await databaseStep(ctx, 'ledger');
    crash('between-steps', { ...at, step: 'ledger' });
    return ctx.transaction(async (tx) => {
      await sql`insert into ${sql.id(schema, 'effects')} (scope, key, fence, worker_pid)
                values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${process.pid})`.execute(tx);
      return { n: ctx.data.n, fence: ctx.fence, steps: { reserve: reserve.fence, charge: charge.fence, ledger: ledger.fence } };
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
