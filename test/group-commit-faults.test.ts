// @module-tag redis
/**
 * Group commit with a store fault at each of its statements, in turn: the session is terminated
 * by the server while that statement runs (`pg_terminate_backend` of its own backend, from a
 * function or trigger the statement runs: the BEGIN's keeping of the state and the state check
 * between jobs, each given a call of it first; a job's write, a leased job's fenced completion,
 * the fast path's insert of its new keys and the COMMIT, through triggers). Whatever statement it cut, every job completes once, no
 * effect commits twice, no key is left held, and no job fails for it (each has one attempt).
 */
import { randomUUID } from 'node:crypto';
import { Queue, type Job } from 'bullmq';
import { CompiledQuery, sql, type Kysely } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, createIdempotentWorker, createPostgresDb, type DatabaseOnlyJobHandler, type JobContext, type WorkerEvent } from '../src/index.js';
import type { KeyStore } from '../src/store/key-store.js';
import { PostgresKeyStore } from '../src/store/postgres-key-store.js';
import { createEffectsTable, effectsOf, withGroupStatements } from './support/protocol-fixtures.js';
import { waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let workerDb: Kysely<any>;
let queue: Queue;
const QUEUE = 'gc-faults';
const scope = 'gc-faults';
const t = (name: string) => sql.id(env.schema, name);

beforeAll(async () => {
  env = await createTestEnv('gc_faults');
  await createEffectsTable(env.db, env.schema);
  workerDb = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 8, preparedStatements: env.preparedStatements }, () => {});
  queue = new Queue(QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  await sql`create table ${t('fault_plan')} (point text primary key)`.execute(env.db);
  // A sequence: its count survives the rollback of the transaction the fault ends, so it fires once.
  await sql`create sequence ${t('fault_fired')}`.execute(env.db);
  await env.db.transaction().execute(async (tx) => {
    // Functions that pin the schema's path (`set search_path from current`) name its objects plainly.
    await sql`set local search_path to ${sql.id(env.schema)}`.execute(tx);
    // Terminates its own session at `p_point` (once), inside a group's transaction only (the
    // group keeps its starting state in a setting of its transaction): the statement that called
    // it is the one the fault cuts.
    await sql`create function fault_at(p_point text, p_anywhere boolean default false) returns void language plpgsql set search_path from current as $$
      begin
        if not p_anywhere and coalesce(current_setting('idempotent_jobs.group_state', true), '') = '' then return; end if;
        if not exists (select from fault_plan where point = p_point) then return; end if;
        if nextval('fault_fired') = 1 then perform pg_terminate_backend(pg_backend_pid()); end if;
      end $$`.execute(tx);
    // A job's write, a completion (an update of a key), the new keys (an insert of keys), and the COMMIT.
    await sql`create function fault_on() returns trigger language plpgsql set search_path from current as $$
      begin perform fault_at(tg_argv[0]); return null; end $$`.execute(tx);
    await sql`create trigger fault_effect after insert on effects for each statement execute function fault_on('effect')`.execute(tx);
    await sql`create trigger fault_completion after update on idempotency_keys for each statement execute function fault_on('completion')`.execute(tx);
    await sql`create trigger fault_new_keys after insert on idempotency_keys for each statement execute function fault_on('new-keys')`.execute(tx);
    await sql`create constraint trigger fault_commit after insert on effects deferrable initially deferred for each row execute function fault_on('commit')`.execute(tx);
  });
});
afterAll(async () => {
  await queue?.close();
  await workerDb?.destroy();
  await env?.teardown();
});

/**
 * The store, its group's keeping of the state (with its BEGIN), its state check (after each
 * job, or at the group's end only) and its prepared statements' check (at the group's end)
 * calling `fault_at` first: those statements are the store's SQL, with no function of the
 * schema's to wrap. `codeCanLeaveState` is what the store reports of the database's code
 * (whether the state is checked after each job), fixed here: other test files' functions in the
 * shared database would otherwise decide it.
 */
function faultingStore(codeCanLeaveState: boolean): KeyStore {
  const store = new PostgresKeyStore(workerDb, env.schema);
  const state = store.groupStatements.state!;
  const faultFirst = (point: string, query: CompiledQuery) =>
    CompiledQuery.raw(`select ${env.schema}.fault_at('${point}', ${point === 'begin'}), (select count(*) from (${query.sql}) as statement)`, [...query.parameters]);
  const groupStatements = {
    ...store.groupStatements,
    state: {
      ...state,
      watched: async () => ({ ...(await state.watched()), codeCanLeaveState }),
      keep: (names: readonly string[]) => faultFirst('begin', state.keep(names)),
      check: (names: readonly string[], options: { readonly preparedStatements: boolean }) => faultFirst('check', state.check(names, options)),
      checkPreparedStatements: (names: readonly string[]) => faultFirst('check-prepared', state.checkPreparedStatements(names)),
    },
  };
  return withGroupStatements(store, groupStatements);
}

const write = (tx: Kysely<any>, ctx: { scope: string; key: string; fence: number }) =>
  sql`insert into ${t('effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, 'w')`.execute(tx);

const functionHandler = (ctx: JobContext<{ n: number }>) =>
  ctx.transaction(async (tx) => {
    await write(tx, ctx);
    return { n: ctx.data.n };
  });

const databaseOnlyHandler: DatabaseOnlyJobHandler<{ n: number }, { n: number }> = {
  transaction: async (tx, ctx) => {
    await write(tx, ctx);
    return { n: ctx.data.n };
  },
};

// `check` is the state check after each job where the database's code can leave state, and the
// one at the group's end where it cannot (which then compares the prepared statements too).
const PATHS = [
  { path: 'leased (a function handler, its ctx.transaction grouped)', codeCanLeaveState: true, handler: functionHandler, points: ['begin', 'effect', 'check', 'check-prepared', 'completion', 'commit'] },
  { path: 'fast path (a database-only handler)', codeCanLeaveState: true, handler: databaseOnlyHandler, points: ['begin', 'effect', 'check', 'check-prepared', 'new-keys', 'commit'] },
  { path: 'leased, no code that can leave state', codeCanLeaveState: false, handler: functionHandler, points: ['begin', 'check', 'completion'] },
  { path: 'fast path, no code that can leave state', codeCanLeaveState: false, handler: databaseOnlyHandler, points: ['begin', 'check', 'new-keys'] },
] as const;

describe.each(PATHS)('a store fault at each statement of a group: $path', ({ handler, points, codeCanLeaveState }) => {
  it.each(points)('at %s: every job completes once, none fails, no key stays held', async (point) => {
    await sql`delete from ${t('fault_plan')}`.execute(env.db);
    await sql`insert into ${t('fault_plan')} (point) values (${point})`.execute(env.db);
    await sql`alter sequence ${t('fault_fired')} restart`.execute(env.db);
    const keys = new IdempotencyKeys({ db: workerDb, schema: env.schema, leaseMs: 5_000, groupCommit: { maxGroups: 1 } }, faultingStore(codeCanLeaveState));
    const events: WorkerEvent[] = [];
    const worker = createIdempotentWorker<{ n: number }>({
      queue: QUEUE,
      connection: { url: env.redisUrl },
      prefix: env.redisPrefix,
      keys,
      handler,
      concurrency: 8,
      logger: pino({ level: 'silent' }),
      storeRetryMinMs: 10,
      storeRetryMaxMs: 100,
    });
    worker.on('event', (event) => events.push(event));
    try {
      const added: Array<{ job: Job; key: string }> = [];
      for (let n = 0; n < 8; n++) {
        const key = `${point}-${n}-${randomUUID()}`;
        added.push({ job: await queue.add('pay', { idempotencyKey: key, scope, payload: { n } }), key });
      }
      for (const { job } of added) {
        const { job: finished, state } = await waitForJobState(queue, job.id!, ['completed', 'failed'], 30_000);
        expect({ state, failedReason: finished.failedReason }).toEqual({ state: 'completed', failedReason: undefined });
      }
      const fired = await sql<{ is_called: boolean }>`select is_called from ${t('fault_fired')}`.execute(env.db);
      expect(fired.rows[0]!.is_called).toBe(true);
      for (const { key } of added) {
        expect(await effectsOf(env.db, env.schema, scope, key)).toHaveLength(1);
        expect(await keys.get(scope, key)).toMatchObject({ status: 'completed' });
      }
      expect(events.filter((e) => e.kind === 'failed')).toEqual([]);
    } finally {
      await worker.close({ force: true });
    }
  });
});
