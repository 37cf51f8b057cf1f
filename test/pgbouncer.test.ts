// @module-tag redis
/**
 * The store through PgBouncer in transaction mode: a PgBouncer of this file's own
 * (test/support/pgbouncer.ts, the configuration docs/operations.md gives) with 3 server
 * connections, so that clients share them. Parameterised (unnamed prepared) statements,
 * transaction-local settings, the PL/pgSQL functions and the statements merged into one round
 * trip work through it; what needs a session (advisory locks, LISTEN) goes to Postgres itself.
 * A role of the file's own has a serializable default (ALTER ROLE … SET), dropped after.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe as anyDescribe, expect, it } from 'vitest';
import { Queue } from 'bullmq';
import { pino } from 'pino';
import {
  DataLayerElsewhereError,
  IdempotencyKeys,
  KeySettledListener,
  KeyedJobRunner,
  StoreUnavailableError,
  createPostgresDb,
  databaseOnly,
  identityFromWireContract,
  isHeld,
  resolveWorkerTiming,
  type Delivery,
  type JobLike,
  type RunOutcome,
} from '../src/index.js';
import { pgDataLayer } from '../src/pg/index.js';
import { loadEnvConfig, startWorkerProcess } from '../src/process/index.js';
import { withMaintenanceLock } from '../src/store/maintenance-lock.js';
import { createCountingDb } from './support/counting-db.js';
import { PgBouncer } from './support/pgbouncer.js';
import { createEffectsTable, effectsOf, expireLease, insertEffect } from './support/protocol-fixtures.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { systemToolForTests } from './support/system-tools.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

/** Every test here runs through a PgBouncer: without one (outside CI) each is skipped, and so are the hooks. */
const describe = anyDescribe.skipIf(systemToolForTests('pgbouncer') === undefined);

let env: TestEnv;
let bouncer: PgBouncer;
let db: Kysely<any>;
let keys: IdempotencyKeys;
const role = `ij_pgb_serializable_${randomBytes(4).toString('hex')}`;
const dbs: Kysely<any>[] = [];
const scope = 'pgb';

beforeAll(async () => {
  env = await createTestEnv('pgbouncer');
  await createEffectsTable(env.db, env.schema);
  await sql`create role ${sql.id(role)} login`.execute(env.db);
  await sql`alter role ${sql.id(role)} set default_transaction_isolation = 'serializable'`.execute(env.db);
  await sql`grant usage on schema ${sql.id(env.schema)} to ${sql.id(role)}`.execute(env.db);
  await sql`grant all on all tables in schema ${sql.id(env.schema)} to ${sql.id(role)}`.execute(env.db);
  const user = decodeURIComponent(new URL(env.databaseDirectUrl).username) || 'postgres';
  const database = new URL(env.databaseDirectUrl).pathname.slice(1) || 'postgres';
  bouncer = await PgBouncer.start({
    upstream: env.databaseDirectUrl,
    poolSize: 3,
    users: [user, role],
    databases: {
      // One server connection: two clients' statements meet on it.
      single: `dbname=${database} pool_size=1`,
      // Server connections whose default isolation is serializable, the client's own options ignored.
      strict: `dbname=${database} connect_query='set default_transaction_isolation = "serializable"'`,
    },
  });
  db = pooled(bouncer.url());
  keys = new IdempotencyKeys({ db, schema: env.schema, leaseMs: 30_000 });
});
afterAll(async () => {
  await Promise.all(dbs.map((each) => each.destroy()));
  await bouncer?.stop();
  await sql`drop owned by ${sql.id(role)}`.execute(env.db);
  await sql`drop role if exists ${sql.id(role)}`.execute(env.db);
  await env?.teardown();
});

/** A pool through the pooler, configured as docs/operations.md says: prepared statements off (PgBouncer 1.18 keeps none). */
function pooled(connectionString: string, maxConnections = 8, preparedStatements = false): Kysely<any> {
  const each = createPostgresDb({ connectionString, maxConnections, applicationName: 'test:pgbouncer', preparedStatements }, () => {});
  dbs.push(each);
  return each;
}

/** The pooler's URL as the serializable role. */
function roleUrl(database?: string): string {
  const url = new URL(bouncer.url(database));
  url.username = role;
  url.password = '';
  return url.toString();
}

const fingerprint = (value: unknown) => keys.fingerprint({ value });

describe('the store through PgBouncer (transaction mode)', () => {
  it('the leased path: claim (claim_key), effect and fenced completion (complete_key) merged into two round trips', async () => {
    const counting = createCountingDb(bouncer.url(), 'library', false);
    dbs.push(counting.db);
    const counted = new IdempotencyKeys({ db: counting.db, schema: env.schema });
    const claim = await counted.claim(scope, 'leased-1', fingerprint(1));
    if (!isHeld(claim)) throw new Error(`expected to hold leased-1, got ${claim.kind}`);
    const { roundTrips, statements } = await counting.count(() =>
      counted.runEffect(claim, async (tx) => {
        await insertEffect(tx, env.schema, { scope, key: 'leased-1', fence: claim.fence, worker: 'pgb' });
        return { booked: true };
      }),
    );
    expect(roundTrips).toBe(2);
    expect(statements[0]).toMatch(/^begin isolation level read committed;\ninsert into /);
    expect(statements[1]).toMatch(/complete_key\(.*;\s*commit$/s);
    expect(await effectsOf(env.db, env.schema, scope, 'leased-1')).toHaveLength(1);
    expect(await counted.claim(scope, 'leased-1', fingerprint(1))).toMatchObject({ kind: 'completed', result: { booked: true } });
  });

  it('a zombie whose key was taken over is fenced: its effect rolls back with the completion', async () => {
    const zombie = await keys.claim(scope, 'fenced-1', fingerprint(1));
    if (!isHeld(zombie)) throw new Error('expected to hold fenced-1');
    await expireLease(env.db, env.schema, scope, 'fenced-1');
    const owner = await keys.claim(scope, 'fenced-1', fingerprint(1));
    expect(owner.kind).toBe('taken-over');
    await expect(
      keys.runEffect(zombie, async (tx) => insertEffect(tx, env.schema, { scope, key: 'fenced-1', fence: zombie.fence, worker: 'zombie' })),
    ).rejects.toMatchObject({ code: 'LEASE_LOST' });
    expect(await effectsOf(env.db, env.schema, scope, 'fenced-1')).toEqual([]);
  });

  it('the fast path (claim_new_key, then claim_key for a key with a row): concurrent duplicates run one effect', async () => {
    for (let round = 0; round < 5; round++) {
      const key = `fast-${round}`;
      const outcomes = await Promise.all(
        Array.from({ length: 6 }, (_, i) =>
          keys.executeOnce(scope, key, fingerprint(round), async (tx, claim) => {
            await insertEffect(tx, env.schema, { scope, key, fence: claim.fence, worker: `w${i}` });
            return { round };
          }),
        ),
      );
      expect(outcomes.filter((o) => o.kind === 'executed')).toHaveLength(1);
      expect(await effectsOf(env.db, env.schema, scope, key)).toHaveLength(1);
    }
  });

  it.each([['grouped']] as const)('group commit (%s: the jobs\' statements and the group\'s end pipelined): 24 jobs over 12 keys take effect once each; a failing job fails alone', async (mode) => {
    const grouped = new IdempotencyKeys({ db, schema: env.schema, leaseMs: 30_000, groupCommit: { maxJobs: 16, maxGroups: 2 } });
    const key = (i: number) => `group-${mode}-${i % 12}`;
    const jobs = Array.from({ length: 24 }, (_, i) =>
      grouped.executeOnce(scope, key(i), fingerprint(key(i)), async (tx, claim) => {
        await insertEffect(tx, env.schema, { scope, key: key(i), fence: claim.fence, worker: `g${i}` });
        return key(i);
      }),
    );
    const failing = grouped.executeOnce(scope, `group-${mode}-fails`, fingerprint('fails'), async (tx, claim) => {
      await insertEffect(tx, env.schema, { scope, key: `group-${mode}-fails`, fence: claim.fence, worker: 'f' });
      throw new Error('this job fails');
    }).then(
      () => undefined,
      (error: unknown) => error,
    );
    const outcomes = await Promise.all(jobs);
    expect(await failing).toMatchObject({ message: 'this job fails' });
    expect(outcomes.filter((o) => o.kind === 'executed')).toHaveLength(12);
    for (let k = 0; k < 12; k++) expect(await effectsOf(env.db, env.schema, scope, key(k))).toHaveLength(1);
    expect(await effectsOf(env.db, env.schema, scope, `group-${mode}-fails`)).toEqual([]);
  });

  it('transaction-local settings (the claim functions\' set_config(…, true), SET LOCAL) leave no trace on the shared server connections', async () => {
    const bounded = new IdempotencyKeys({ db, schema: env.schema, leaseMs: 30_000, claimLockTimeoutMs: 1234 });
    await Promise.all(Array.from({ length: 20 }, (_, i) => bounded.claim(scope, `local-${i % 5}`, fingerprint(i % 5))));
    await db.transaction().execute(async (tx) => {
      await sql`set local statement_timeout = 4321`.execute(tx);
      expect((await sql<{ t: string }>`select current_setting('statement_timeout') as t`.execute(tx)).rows[0]!.t).toBe('4321ms');
    });
    // Every server connection of the pool, each seen by a client holding it in a transaction.
    const seen = await Promise.all(
      Array.from({ length: 3 }, () =>
        db.transaction().execute(async (tx) => {
          const { rows } = await sql<{ pid: number; lock: string; statement: string }>`
            select pg_backend_pid() as pid, current_setting('lock_timeout') as lock, current_setting('statement_timeout') as statement,
                   pg_sleep(0.5)`.execute(tx);
          return rows[0]!;
        }),
      ),
    );
    expect(new Set(seen.map((s) => s.pid)).size).toBe(3);
    for (const s of seen) expect({ lock: s.lock, statement: s.statement }).toEqual({ lock: '0', statement: '0' });
  });

  it('sends no named prepared statement (PgBouncer 1.18 in transaction mode cannot keep one): parameters travel unnamed', async () => {
    const named: string[] = [];
    let parses = 0;
    const Connection = (pg as unknown as { Connection: { prototype: { parse(message: { name?: string }): void } } }).Connection;
    const original = Connection.prototype.parse;
    Connection.prototype.parse = function (this: unknown, message: { name?: string }) {
      parses++;
      if (message.name) named.push(message.name);
      return original.call(this, message);
    };
    try {
      const claim = await keys.claim(scope, 'unnamed-1', fingerprint(1));
      if (!isHeld(claim)) throw new Error('expected to hold unnamed-1');
      await keys.extend(claim);
      await keys.runEffect(claim, async (tx) => insertEffect(tx, env.schema, { scope, key: 'unnamed-1', fence: claim.fence, worker: 'u' }));
      await keys.executeOnce(scope, 'unnamed-2', fingerprint(2), async () => 'fast');
      await keys.get(scope, 'unnamed-1');
    } finally {
      Connection.prototype.parse = original;
    }
    expect(parses).toBeGreaterThan(4);
    expect(named).toEqual([]);
  });

  it('prepared statements turned on through it anyway: a statement found missing or taken on a server connection is a store fault, never a job failure; each job runs once', async () => {
    // Two pools of several clients share the three server connections: sooner or later a
    // client's named statement meets a server connection that lacks it, or has another's.
    const named = [pooled(bouncer.url(), 4, true), pooled(bouncer.url(), 4, true)].map((each) => new IdempotencyKeys({ db: each, schema: env.schema, leaseMs: 30_000 }));
    const faults: unknown[] = [];
    const run = async (keysOf: IdempotencyKeys, key: string) => {
      for (;;) {
        try {
          const claim = await keysOf.claim(scope, key, fingerprint(key));
          if (!isHeld(claim)) return claim.kind;
          await keysOf.runEffect(claim, (tx) => insertEffect(tx, env.schema, { scope, key, fence: claim.fence, worker: 'named' }));
          return 'completed';
        } catch (error) {
          if (!(error instanceof StoreUnavailableError)) throw error;
          faults.push(error);
        }
      }
    };
    const outcomes = await Promise.all(Array.from({ length: 80 }, (_, n) => run(named[n % 2]!, `named-${n}`)));
    expect(new Set(outcomes)).toEqual(new Set(['completed']));
    // The premise: clients met server connections that did not hold what they had prepared.
    expect(faults.length).toBeGreaterThan(0);
    for (const fault of faults) expect(((fault as Error).cause as Error).name).toBe('PreparedStatementLostError');
    for (let n = 0; n < 80; n++) expect(await effectsOf(env.db, env.schema, scope, `named-${n}`)).toHaveLength(1);
  });
});

describe('read committed through PgBouncer', () => {
  it("PgBouncer drops the pool's startup option (ignore_startup_parameters = options): the premise", async () => {
    const client = new pg.Client({ connectionString: roleUrl('strict'), options: '-c default_transaction_isolation=read\\ committed' });
    await client.connect();
    try {
      expect((await client.query('show transaction_isolation')).rows[0].transaction_isolation).toBe('serializable');
    } finally {
      await client.end();
    }
  });

  it('every server connection starts at read committed (connect_query), also for a role whose default is serializable', async () => {
    const roleDb = pooled(roleUrl());
    const { rows } = await sql<{ isolation: string }>`select current_setting('transaction_isolation') as isolation`.execute(roleDb);
    expect(rows[0]!.isolation).toBe('read committed');
    const roleKeys = new IdempotencyKeys({ db: roleDb, schema: env.schema, leaseMs: 30_000 });
    for (let round = 0; round < 5; round++) {
      const key = `dup-${round}-${randomUUID()}`;
      const outcomes = await Promise.allSettled(Array.from({ length: 8 }, () => roleKeys.claim(scope, key, fingerprint(key))));
      expect(outcomes.filter((o) => o.status === 'rejected').map((o) => String((o as PromiseRejectedResult).reason))).toEqual([]);
      expect(outcomes.filter((o) => o.status === 'fulfilled' && o.value.kind === 'claimed')).toHaveLength(1);
    }
  });

  it("on a serializable server connection the store's transactions still run at read committed: their BEGIN says so", async () => {
    const strictKeys = new IdempotencyKeys({ db: pooled(bouncer.url('strict')), schema: env.schema, leaseMs: 30_000 });
    const claim = await strictKeys.claim(scope, 'strict-1', fingerprint(1));
    if (!isHeld(claim)) throw new Error('expected to hold strict-1');
    const isolation = await strictKeys.runEffect(claim, async (tx) => {
      const { rows } = await sql<{ isolation: string }>`select current_setting('transaction_isolation') as isolation`.execute(tx);
      return rows[0]!.isolation;
    });
    expect(isolation).toBe('read committed');
    const fast = await strictKeys.executeOnce(scope, 'strict-2', fingerprint(2), async (tx) => {
      const { rows } = await sql<{ isolation: string }>`select current_setting('transaction_isolation') as isolation`.execute(tx);
      return rows[0]!.isolation;
    });
    expect(fast).toMatchObject({ kind: 'executed', result: 'read committed' });
  });
});

describe('a data layer through PgBouncer (transaction mode): node-postgres (idempotent-jobs/pg)', () => {
  const pools: pg.Pool[] = [];
  afterAll(async () => {
    await Promise.all(pools.map((each) => each.end()));
  });

  /** A node-postgres pool of the user's own, through the pooler (`database`: one of its entries). */
  function userPool(connectionString: string, max = 6): pg.Pool {
    const pool = new pg.Pool({ connectionString, max });
    pool.on('error', () => {});
    pools.push(pool);
    return pool;
  }

  function runner(handler: ConstructorParameters<typeof KeyedJobRunner<unknown, unknown, JobLike>>[0]['handler'], storeKeys: IdempotencyKeys, fastPath: boolean | undefined) {
    return new KeyedJobRunner<unknown, unknown, JobLike>({
      keys: storeKeys,
      timing: resolveWorkerTiming({ deferMinMs: 20, storeRetryMinMs: 20 }, storeKeys.options.leaseMs),
      handler,
      identityOf: (message) => identityFromWireContract(message) as never,
      logger: pino({ level: 'silent' }),
      fastPath,
    });
  }

  let deliveries = 0;
  function delivery(key: string, worker: string): Delivery<JobLike> {
    const id = `dl-${++deliveries}-${worker}`;
    const message: JobLike = { id, name: 'ledger', data: { idempotencyKey: key, scope, payload: {} } };
    return { message, id, label: `Job ${id}`, queue: 'ledger', name: 'ledger', lastAttempt: false, deferrals: 0 };
  }

  /** Runs a delivery until it is not deferred (another run holds the key), as a broker would. */
  async function runToEnd(r: KeyedJobRunner<unknown, unknown, JobLike>, d: Delivery<JobLike>): Promise<RunOutcome> {
    for (let i = 0; ; i++) {
      const outcome = await r.run(d);
      if ((outcome.kind !== 'deferred' && outcome.kind !== 'store-unavailable') || i > 300) return outcome;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }

  const insertWith = (client: pg.PoolClient, key: string, fence: number, worker: string) =>
    client.query(`insert into "${env.schema}".effects (scope, key, fence, worker) values ($1, $2, $3, $4)`, [scope, key, fence, worker]);

  for (const path of ['leased', 'fast path'] as const) {
    it(`${path}: duplicates and concurrent claims of 6 keys, the data layer and the keys sharing one server connection (pool_size=1), take effect once each and replay`, async () => {
      // Both pools go through the pooler's `single` entry: every transaction, the data layer's
      // and the store's, takes turns on one server connection.
      const layer = pgDataLayer(userPool(bouncer.url('single')));
      const sharedKeys = new IdempotencyKeys({ db: pooled(bouncer.url('single')), schema: env.schema, leaseMs: 30_000 });
      const r =
        path === 'leased'
          ? runner(async (ctx) => ctx.transaction(layer, async (client) => {
              await insertWith(client, ctx.key, ctx.fence, String(ctx.message.id));
              return { booked: ctx.key };
            }), sharedKeys, false)
          : runner(databaseOnly(layer, async (client, ctx: { key: string; fence: number; message: JobLike }) => {
              await insertWith(client, ctx.key, ctx.fence, String(ctx.message.id));
              return { booked: ctx.key };
            }), sharedKeys, undefined);
      const names = Array.from({ length: 6 }, (_, i) => `dl-${path === 'leased' ? 'leased' : 'fast'}-${i}`);
      const outcomes = await Promise.all(names.flatMap((key) => [0, 1, 2].map((n) => runToEnd(r, delivery(key, `w${n}`)))));
      expect(outcomes.filter((o) => o.kind === 'completed')).toHaveLength(names.length);
      expect(outcomes.filter((o) => o.kind === 'replayed')).toHaveLength(names.length * 2);
      for (const key of names) {
        expect(await effectsOf(env.db, env.schema, scope, key)).toHaveLength(1);
        expect(await keys.get(scope, key)).toMatchObject({ status: 'completed', result: { booked: key } });
      }
    });
  }

  it("a zombie's commit is refused: its writes roll back with the completion, the new owner's stay", async () => {
    const layer = pgDataLayer(userPool(bouncer.url()));
    const key = 'dl-zombie';
    const zombie = await keys.claim(scope, key, fingerprint(key));
    if (!isHeld(zombie)) throw new Error(`expected to hold ${key}`);
    await expireLease(env.db, env.schema, scope, key);
    const owner = await keys.claim(scope, key, fingerprint(key));
    if (!isHeld(owner)) throw new Error(`expected to take ${key} over`);
    await expect(keys.commitEffectIn(zombie, layer, (client) => insertWith(client, key, zombie.fence, 'zombie'))).rejects.toMatchObject({ code: 'LEASE_LOST' });
    await keys.commitEffectIn(owner, layer, (client) => insertWith(client, key, owner.fence, 'owner'));
    expect((await effectsOf(env.db, env.schema, scope, key)).map((row) => row.worker)).toEqual(['owner']);
  });

  it('on a serializable server connection (and for a role whose default is serializable) the data layer\'s transaction runs at read committed', async () => {
    for (const url of [bouncer.url('strict'), roleUrl()]) {
      const layer = pgDataLayer(userPool(url, 2));
      const key = `dl-isolation-${randomBytes(3).toString('hex')}`;
      const claim = await keys.claim(scope, key, fingerprint(key));
      if (!isHeld(claim)) throw new Error(`expected to hold ${key}`);
      const isolation = await keys.commitEffectIn(claim, layer, async (client) => (await client.query<{ isolation: string }>("select current_setting('transaction_isolation') as isolation")).rows[0]!.isolation);
      expect(isolation).toBe('read committed');
    }
  });

  it("the start-up check (keys' database, server and table) passes through the pooler, and refuses a pooler entry on another database", async () => {
    await keys.checkDataLayer(pgDataLayer(userPool(bouncer.url())));
    const other = `ij_pgb_other_${randomBytes(3).toString('hex')}`;
    await sql`create database ${sql.id(other)}`.execute(env.db);
    try {
      const elsewhere = await PgBouncer.start({ upstream: env.databaseDirectUrl, poolSize: 1, databases: { other: `dbname=${other}` } });
      try {
        const pool = userPool(elsewhere.url('other'), 1);
        await expect(keys.checkDataLayer(pgDataLayer(pool))).rejects.toBeInstanceOf(DataLayerElsewhereError);
        await pool.end();
        pools.splice(pools.indexOf(pool), 1);
      } finally {
        await elsewhere.stop();
      }
    } finally {
      await sql`drop database if exists ${sql.id(other)} with (force)`.execute(env.db);
    }
  });
});

describe('what needs a session goes to Postgres itself', () => {
  it('a maintenance lock taken through the pooler does not exclude another client; over the direct URL it does', async () => {
    const first = pooled(bouncer.url('single'), 1);
    const second = pooled(bouncer.url('single'), 1);
    const throughPooler = await withMaintenanceLock(first, env.schema, 'janitor', () => withMaintenanceLock(second, env.schema, 'janitor', async () => 'both ran'));
    // Both clients' statements reached the one server connection, whose session held the lock already.
    expect(throughPooler).toEqual({ ran: true, result: { ran: true, result: 'both ran' } });
    const directA = pooled(env.databaseDirectUrl, 1);
    const directB = pooled(env.databaseDirectUrl, 1);
    const direct = await withMaintenanceLock(directA, env.schema, 'janitor', () => withMaintenanceLock(directB, env.schema, 'janitor', async () => 'both ran'));
    expect(direct).toEqual({ ran: true, result: { ran: false } });
  });

  it('a worker process migrates and runs its janitor over DATABASE_DIRECT_URL, and its jobs through DATABASE_URL', async () => {
    const tag = `ij-direct-${randomBytes(3).toString('hex')}`;
    // node-postgres takes application_name from the URL first: the direct connections carry the tag.
    const direct = new URL(env.databaseDirectUrl);
    direct.searchParams.set('application_name', tag);
    const queueName = `pgb-${randomBytes(3).toString('hex')}`;
    const janitorRuns: unknown[] = [];
    const started = await startWorkerProcess({
      config: loadEnvConfig({
        DATABASE_URL: bouncer.url('single'),
        DATABASE_DIRECT_URL: direct.toString(),
        REDIS_URL: env.redisUrl,
        REDIS_PREFIX: env.redisPrefix,
        SCHEMA: env.schema,
        QUEUE: queueName,
        CONCURRENCY: '2',
        JANITOR_INTERVAL_MS: '100',
        SWEEPER_ENABLED: 'false',
      }),
      handler: async (ctx) => ({ echoed: ctx.data }),
      logger: pino({ level: 'silent' }),
      handleSignals: false,
    });
    const queue = new Queue(queueName, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
    try {
      started.maintenance!.on('janitor', (report) => janitorRuns.push(report));
      const job = await queue.add('echo', { idempotencyKey: 'worker-1', payload: { n: 1 } });
      const done = await waitForJobState(queue, job.id!, ['completed', 'failed']);
      expect(done.state).toBe('completed');
      expect(await keys.get('default', 'worker-1')).toMatchObject({ status: 'completed' });
      await waitFor('a janitor run', async () => janitorRuns.length > 0);
      const { rows } = await sql<{ n: string }>`select count(*) as n from pg_stat_activity where application_name = ${tag}`.execute(env.db);
      expect(Number(rows[0]!.n)).toBeGreaterThan(0);
    } finally {
      await queue.close();
      await started.stop();
    }
  });

  it('a listener on the direct URL wakes a waiter whose key completes through the pooler', async () => {
    const listener = new KeySettledListener({ connectionString: env.databaseDirectUrl, schema: env.schema });
    try {
      const claim = await keys.claim(scope, 'wait-1', fingerprint(1));
      if (!isHeld(claim)) throw new Error('expected to hold wait-1');
      const began = Date.now();
      const waited = listener.waitForSettled(scope, 'wait-1', 10_000, async () => (await keys.get(scope, 'wait-1'))?.status === 'completed');
      setTimeout(() => void keys.runEffect(claim, async () => 'done'), 300);
      expect(await waited).toBe(true);
      expect(Date.now() - began).toBeLessThan(5_000);
    } finally {
      await listener.close();
    }
  });
});
