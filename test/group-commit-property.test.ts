/**
 * Property test of group commit's promise, against real Postgres: random mixes of jobs that
 * change their transaction's state in every way a statement can (directly, inside PL/pgSQL
 * functions, inside a trigger) and then write what they see of it, run grouped, give the same
 * outcomes and rows as the same jobs run alone, one after another (the model).
 *
 * Left out, with the reason: state that outlives the transaction (a session-level `SET`, a
 * `PREPARE`, a session-level advisory lock) lands on whichever pooled connection ran the job, so
 * the model itself depends on the pool (the example tests of `group-commit-state.test.ts` cover
 * it), and `SET CONSTRAINTS` inside a function, which no check can see (see docs/architecture.md,
 * "Group commit").
 *
 * `PROPERTY_RUNS` sets the number of runs (default 8; nightly more), `FC_SEED` the seed.
 */
import fc from 'fast-check';
import { sql, type Kysely } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { IdempotencyKeys, createPostgresDb } from '../src/index.js';
import { PostgresKeyStore } from '../src/store/postgres-key-store.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let db: Kysely<any>;
let grouped: IdempotencyKeys;
let alone: IdempotencyKeys;
const scope = 'property';
const t = (name: string) => sql.id(env.schema, name);

beforeAll(async () => {
  env = await createTestEnv('group_property');
  // Sessions start with app.tenant = 'none', the value every job sees unless it changes it.
  const url = new URL(env.databaseUrl);
  url.searchParams.set('options', '-c app.tenant=none');
  db = createPostgresDb({ connectionString: url.toString(), maxConnections: 4, preparedStatements: env.preparedStatements });
  grouped = new IdempotencyKeys({ db, schema: env.schema, leaseMs: 30_000, groupCommit: { maxGroups: 2, maxJobs: 8 } }, new PostgresKeyStore(db, env.schema, { probeSettledKeys: false }));
  alone = new IdempotencyKeys({ db, schema: env.schema, leaseMs: 30_000, groupCommit: false });
  await sql`create table ${t('seen')} (key text primary key, tenant text, scratch boolean not null, cursor boolean not null)`.execute(env.db);
  await sql`create table ${t('touched')} (n int)`.execute(env.db);
  await sql`create function ${t('set_tenant')}(p_value text) returns void language plpgsql as $$
    begin perform set_config('app.tenant', p_value, true); end $$`.execute(env.db);
  await sql`create function ${t('make_scratch')}() returns void language plpgsql as $$
    begin create temp table if not exists scratch (n int) on commit drop; end $$`.execute(env.db);
  await sql`create function ${t('open_cursor')}() returns void language plpgsql as $$
    declare c refcursor := 'left_open'; begin open c for select 1; end $$`.execute(env.db);
  await sql`create function ${t('lock_quietly')}() returns void language plpgsql as $$
    begin perform pg_advisory_xact_lock(7); end $$`.execute(env.db);
  await sql`create function ${t('tenant_from_trigger')}() returns trigger language plpgsql as $$
    begin perform set_config('app.tenant', 'trigger', true); return new; end $$`.execute(env.db);
  await sql`create trigger sets_tenant before insert on ${t('touched')} for each row execute function ${t('tenant_from_trigger')}()`.execute(env.db);
});
afterAll(async () => {
  await db?.destroy();
  await env?.teardown();
});

/** What a job may do to its transaction before it writes what it sees. */
const ACTIONS: Record<string, (tx: Kysely<any>) => Promise<unknown>> = {
  'set local': (tx) => sql`set local app.tenant = 'direct'`.execute(tx),
  set_config: (tx) => sql`select set_config('app.tenant', 'config', true)`.execute(tx),
  'a function sets it': (tx) => sql`select ${t('set_tenant')}('function')`.execute(tx),
  'a function puts it back': (tx) => sql`select ${t('set_tenant')}('none')`.execute(tx),
  'a trigger sets it': (tx) => sql`insert into ${t('touched')} (n) values (1)`.execute(tx),
  'temporary table': (tx) => sql`create temp table if not exists scratch (n int) on commit drop`.execute(tx),
  'a function makes a temporary table': (tx) => sql`select ${t('make_scratch')}()`.execute(tx),
  'cursor left open': (tx) => sql`declare left_open cursor for select 1`.execute(tx),
  'a function opens a cursor': (tx) => sql`select ${t('open_cursor')}()`.execute(tx),
  'savepoint left open': (tx) => sql`savepoint left_open`.execute(tx),
  'balanced savepoint': async (tx) => {
    await sql`savepoint balanced`.execute(tx);
    await sql`insert into ${t('touched')} (n) values (2)`.execute(tx);
    await sql`rollback to savepoint balanced`.execute(tx);
    await sql`release savepoint balanced`.execute(tx);
  },
  'advisory transaction lock': (tx) => sql`select pg_advisory_xact_lock(7)`.execute(tx),
  'a function takes an advisory transaction lock': (tx) => sql`select ${t('lock_quietly')}()`.execute(tx),
  'set constraints': (tx) => sql`set constraints all deferred`.execute(tx),
  listen: (tx) => sql`listen group_property`.execute(tx),
  'nothing but a write': (tx) => sql`insert into ${t('touched')} (n) values (3)`.execute(tx),
};
const NAMES = Object.keys(ACTIONS);

/** A job: its actions, then a write of what it sees. */
async function job(tx: Kysely<any>, key: string, actions: readonly string[]): Promise<string> {
  for (const action of actions) await ACTIONS[action]!(tx);
  await sql`insert into ${t('seen')} (key, tenant, scratch, cursor)
    values (${key}, current_setting('app.tenant', true), to_regclass('pg_temp.scratch') is not null, exists (select from pg_cursors where name = 'left_open'))`.execute(tx);
  return key;
}

/** Each job's outcome and the row it wrote, by its index. */
async function outcomes(prefix: string, settled: ReadonlyArray<PromiseSettledResult<unknown>>) {
  const { rows } = await sql<{ key: string; tenant: string; scratch: boolean; cursor: boolean }>`
    select key, tenant, scratch, cursor from ${t('seen')} where key like ${`${prefix}%`}`.execute(env.db);
  const byKey = new Map(rows.map(({ key, ...seen }) => [key, seen]));
  return settled.map((s, i) => ({
    outcome: s.status === 'fulfilled' ? 'done' : `failed ${(s.reason as { code?: string }).code ?? (s.reason as Error).message}`,
    seen: byKey.get(`${prefix}${i}`),
  }));
}

let run = 0;

it('grouped jobs that change their transaction\'s state in any way give the outcomes and rows of the same jobs run alone, one after another', async () => {
  const seed = Number(process.env.FC_SEED ?? Math.floor(Math.random() * 2 ** 31));
  const numRuns = Number(process.env.PROPERTY_RUNS ?? 8);
  console.log(`group commit property: fast-check seed ${seed}, ${numRuns} runs (reproduce with FC_SEED=${seed})`);
  const jobs = fc.array(fc.array(fc.constantFrom(...NAMES), { maxLength: 3 }), { minLength: 2, maxLength: 12 });
  await fc.assert(
    fc.asyncProperty(jobs, async (plan) => {
      run++;
      const fp = (key: string) => alone.fingerprint({ key });
      // The model: each job alone, in a transaction of its own, one after another.
      const modelPrefix = `r${run}-alone-`;
      const modelSettled: PromiseSettledResult<unknown>[] = [];
      for (const [i, actions] of plan.entries()) {
        const key = `${modelPrefix}${i}`;
        modelSettled.push(
          await alone.executeOnce(scope, key, fp(key), (tx) => job(tx, key, actions)).then(
            (value) => ({ status: 'fulfilled', value }) as const,
            (reason: unknown) => ({ status: 'rejected', reason }) as const,
          ),
        );
      }
      // The same jobs, submitted together: they share groups where they can.
      const groupPrefix = `r${run}-grouped-`;
      const groupSettled = await Promise.allSettled(
        plan.map((actions, i) => {
          const key = `${groupPrefix}${i}`;
          return grouped.executeOnce(scope, key, fp(key), (tx) => job(tx, key, actions), { databaseOnly: true });
        }),
      );
      expect(await outcomes(groupPrefix, groupSettled)).toEqual(await outcomes(modelPrefix, modelSettled));
    }),
    { seed, numRuns },
  );
});
