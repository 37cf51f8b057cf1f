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
 *   commits with the key's completion or not at all. The database-only handler also writes what
 *   the job saw of the settings another job's fault could leak to it (`seen_tenant`,
 *   `seen_synchronous_commit`).
 * - `step_effects` (the multi-step handler only): one row per execution of a database step,
 *   written inside the step's transaction, so it commits with the step's record or not at all.
 *
 * {@link chaosHandler} makes one external call, then the effect. {@link databaseOnlyChaosHandler}
 * (`--database-only`) is the database-only form: the work and the effect in its one
 * transaction, no external call; a job whose payload carries a fault (`--job-faults`, see
 * `job-faults.ts`) sends it in that transaction, around its effect. {@link chaosStepsHandler}
 * (`--steps`) runs three steps, then the completion: `reserve` (database), `charge` (external:
 * its call is the `external_calls` row), `ledger` (database), and crashes at the step points of
 * its {@link Crasher} when they are armed.
 */
import { randomUUID } from 'node:crypto';
import { sql as drizzleSql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import { sql, type Kysely, type RawBuilder, type Transaction } from 'kysely';
import pg from 'pg';
import { drizzleDataLayer } from '../../src/drizzle/index.js';
import type { DataLayer, JobContext } from '../../src/index.js';
import type { DatabaseOnlyJobHandler } from '../../src/bullmq/idempotent-worker.js';
import type { Crasher } from './fault-injection.js';
import { TENANT_SETTING, tenantOf, type JobFault } from './job-faults.js';

/** What the producer puts in each job. */
export interface ChaosPayload {
  /** Sequence number of the key at the producer. */
  readonly n: number;
  /** Simulated work between the external call and the effect, in ms. */
  readonly workMs: number;
  /** What the job does wrong (`--job-faults`, database-only handler): see `job-faults.ts`. */
  readonly fault?: JobFault;
  /** A coalescing key's adds are numbered 1, 2, … in the order sent (`--coalescing`); the effect records it. */
  readonly version?: number;
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
    -- Made by a run on the fast path, whose fence is not a lease's: a rolled-back attempt
    -- leaves no row, and the key's next claim gets the same fence.
    fast_path boolean not null default false,
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
    at timestamptz not null default clock_timestamp(),
    -- The transaction that committed it: rows of one group commit share it.
    txid bigint not null default txid_current(),
    -- The database-only handler: what its transaction showed of settings a job can change
    -- (current_setting('app.tenant', true), current_setting('synchronous_commit')).
    seen_tenant text,
    seen_synchronous_commit text,
    -- The payload's version (coalescing keys, --coalescing): which of the key's adds ran.
    version integer
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
export function chaosHandler(schema: string, db: Promise<Kysely<any>>, inDataLayer?: DataLayerEffect, fastPath = false) {
  return async (ctx: JobContext<ChaosPayload>) => {
    const pool = await db;
    const callId = randomUUID();
    await untilDone(
      () => sql`insert into ${sql.id(schema, 'external_calls')} (call_id, scope, key, fence, worker_pid, fast_path)
                values (${callId}, ${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${process.pid}, ${fastPath})
                on conflict (call_id) do nothing`.execute(pool),
      ctx.signal,
    );
    if (ctx.data.workMs > 0) await new Promise((resolve) => setTimeout(resolve, ctx.data.workMs));
    if (inDataLayer) return inDataLayer(ctx);
    return ctx.transaction(async (tx) => {
      await sql`insert into ${sql.id(schema, 'effects')} (scope, key, fence, worker_pid, version)
                values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${process.pid}, ${ctx.data.version ?? null})`.execute(tx);
      return { n: ctx.data.n, fence: ctx.fence };
    });
  };
}

/** The effect of {@link chaosHandler} written in a data layer of the user's own. */
export type DataLayerEffect = (ctx: JobContext<ChaosPayload>) => Promise<unknown>;

/**
 * The effect row written with Drizzle over node-postgres (`--drizzle`), in Drizzle's own
 * transaction on a pool of its own, the key's completion inside it (`ctx.transaction(dataLayer, fn)`);
 * and the data layer, for the worker to check at start (`dataLayers`).
 */
export function drizzleEffect(databaseUrl: string, schema: string, poolSize: number): { effect: DataLayerEffect; layer: DataLayer<unknown> } {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: poolSize });
  pool.on('error', () => {});
  const layer = drizzleDataLayer(drizzle(pool));
  const effects = `${pg.escapeIdentifier(schema)}.effects`;
  const effect: DataLayerEffect = (ctx) =>
    ctx.transaction(layer, async (tx) => {
      await tx.execute(drizzleSql`insert into ${drizzleSql.raw(effects)} (scope, key, fence, worker_pid) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${process.pid})`);
      return { n: ctx.data.n, fence: ctx.fence };
    });
  return { effect, layer: layer as DataLayer<unknown> };
}

/**
 * The database-only chaos handler (`--database-only`): `{ transaction }`, so the workers run it
 * on the fast path with group commit by default. The simulated work, then the effect row, both
 * inside its transaction (there is no outside): nothing but the database, as the form requires.
 * A job with a fault in its payload sends it too ({@link effectWithFault}).
 */
export function databaseOnlyChaosHandler(schema: string): DatabaseOnlyJobHandler<ChaosPayload, unknown> {
  return {
    transaction: async (tx, ctx) => {
      if (ctx.data.workMs > 0) await new Promise((resolve) => setTimeout(resolve, ctx.data.workMs));
      await effectWithFault(tx, schema, { scope: ctx.scope, key: ctx.key, fence: ctx.fence }, ctx.data.fault);
      return { n: ctx.data.n, fence: ctx.fence };
    },
  };
}

interface EffectJob {
  readonly scope: string;
  readonly key: string;
  readonly fence: number;
}

/**
 * The job's effect row, with its fault (if any) in the same transaction. A job without a fault,
 * and the `nul` and `set-tenant-quietly` jobs, send one statement (so a gathered group stays
 * gathered); `deferred-fk`, `set-local` and `set-tenant` send the fault's statement, then the
 * effect; `syntax` and `transaction-control` send a statement that fails (or is refused), and
 * the effect only if it did not.
 */
async function effectWithFault(tx: Transaction<any>, schema: string, job: EffectJob, fault: JobFault | undefined): Promise<void> {
  const effect = (parts: { with?: RawBuilder<unknown>; from?: RawBuilder<unknown> } = {}) => sql`
    ${parts.with ? sql`with ${parts.with}` : sql``}
    insert into ${sql.id(schema, 'effects')} (scope, key, fence, worker_pid, seen_tenant, seen_synchronous_commit)
    select ${job.scope}, ${job.key}, ${job.fence}, ${process.pid}, current_setting(${TENANT_SETTING}, true), current_setting('synchronous_commit')
    ${parts.from ? sql`from ${parts.from}` : sql``}`;
  switch (fault) {
    case undefined:
      await effect().execute(tx);
      return;
    case 'nul':
      await effect({
        with: sql`note as (insert into ${sql.id(schema, 'fault_notes')} (scope, key, note) values (${job.scope}, ${job.key}, ${'before\u0000after'}))`,
      }).execute(tx);
      return;
    case 'set-tenant-quietly':
      // The function runs before the select list reads the setting: the row shows its own tenant.
      await effect({ from: sql`(select ${sql.id(schema, 'set_tenant_quietly')}(${tenantOf(job)})) as quiet` }).execute(tx);
      return;
    case 'syntax':
      // Kysely compiles an empty `in` list to `in ()`.
      await tx.withSchema(schema).selectFrom('effects').select('id').where('key', 'in', []).execute();
      break;
    case 'deferred-fk':
      await sql`insert into ${sql.id(schema, 'fault_children')} (scope, key, parent_id) values (${job.scope}, ${job.key}, -1)`.execute(tx);
      break;
    case 'transaction-control':
      await sql`commit`.execute(tx);
      break;
    case 'set-local':
      await sql`set local synchronous_commit = off`.execute(tx);
      break;
    case 'set-tenant':
      await sql`select set_config(${TENANT_SETTING}, ${tenantOf(job)}, true)`.execute(tx);
      break;
  }
  await effect().execute(tx);
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
