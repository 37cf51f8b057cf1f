import { CompiledQuery, sql, type Kysely } from 'kysely';
import pg from 'pg';
import { register } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, LeaseLostError, TransactionControlError, ValidationError, createPostgresDb, isHeld, type ClaimOutcome, type ExecuteOnceOutcome, type HeldClaim } from '../src/index.js';
import { type KeyStore } from '../src/store/key-store.js';
import { PostgresKeyStore } from '../src/store/postgres-key-store.js';
import { groupPostlude, groupPrelude } from '../src/store/gathering-connection.js';
import { LeavesGroup } from '../src/protocol/group-transaction.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';
import { createGate, expireLease, withGroupStatements } from './support/protocol-fixtures.js';
import { sleep } from './support/queue-helpers.js';

let env: TestEnv;
let plain: IdempotencyKeys;
const scope = 'group';

beforeAll(async () => {
  env = await createTestEnv('group_commit');
  plain = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000, groupCommit: false });
  // txid records which transaction committed each effect; `ref` is a foreign key checked only
  // at COMMIT; `seen` what a job read of a setting.
  await sql`create table ${sql.id(env.schema, 'group_refs')} (id int primary key)`.execute(env.db);
  await sql`create table ${sql.id(env.schema, 'group_effects')} (
    key text not null, txid bigint not null default txid_current(), seen text,
    ref int references ${sql.id(env.schema, 'group_refs')} (id) deferrable initially deferred)`.execute(env.db);
  // A function that changes a setting where the statement screen cannot see it.
  await sql`create function ${sql.id(env.schema, 'set_quietly')}(p_name text, p_value text) returns void
    language plpgsql as $$ begin perform set_config(p_name, p_value, true); end $$`.execute(env.db);
});
afterAll(async () => {
  await env?.teardown();
});

/**
 * Group commit on, one group at a time, no settled-key probe: jobs submitted together share a
 * transaction, and every job reaches its group.
 */
function groupedKeys(db: Kysely<any> = env.db, groupCommit: { maxJobs?: number; watchSettings?: readonly string[]; slowJobMs?: number } = {}) {
  const store = new PostgresKeyStore(db, env.schema, { probeSettledKeys: false });
  return new IdempotencyKeys({ db, schema: env.schema, leaseMs: 30_000, groupCommit: { maxGroups: 1, ...groupCommit } }, store);
}

/**
 * {@link groupedKeys} over a store that reports no code in the database that can leave state
 * (what `codeCanLeaveState` reads on a database without such code; this file's own
 * `set_quietly` is such code, so the report is fixed here).
 */
function groupedKeysOfCleanDatabase() {
  const store = new PostgresKeyStore(env.db, env.schema, { probeSettledKeys: false });
  const state = store.groupStatements.state!;
  const groupStatements = { ...store.groupStatements, state: { ...state, watched: async () => ({ ...(await state.watched()), codeCanLeaveState: false }) } };
  const clean = withGroupStatements(store, groupStatements);
  return new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000, groupCommit: { maxGroups: 1, watchSettings: [] } }, clean);
}

function held(outcome: ClaimOutcome): HeldClaim {
  if (!isHeld(outcome)) throw new Error(`expected a held claim, got ${outcome.kind}`);
  return outcome;
}

async function insertEffect(tx: Kysely<any>, key: string, options: { badRef?: boolean; seen?: string } = {}): Promise<void> {
  await sql`insert into ${sql.id(env.schema, 'group_effects')} (key, ref, seen) values (${key}, ${options.badRef ? -1 : null}, ${options.seen ?? null})`.execute(tx);
}

async function effects(prefix: string): Promise<Array<{ key: string; txid: string; seen: string | null }>> {
  const { rows } = await sql<{ key: string; txid: string; seen: string | null }>`
    select key, txid, seen from ${sql.id(env.schema, 'group_effects')} where key like ${`${prefix}%`} order by key`.execute(env.db);
  return rows;
}

const fp = (key: string) => plain.fingerprint({ key });

/** Runs `body` and records every statement text any pg client sent meanwhile (a pipeline's statements joined by `;\n`). */
async function recordStatements<T>(body: () => Promise<T>): Promise<{ value: T; statements: string[] }> {
  const statements: string[] = [];
  const original = pg.Client.prototype.query;
  pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
    statements.push(typeof args[0] === 'string' ? args[0] : String((args[0] as { text?: string })?.text));
    return (original as (...a: unknown[]) => unknown).apply(this, args);
  } as typeof original;
  try {
    return { value: await body(), statements };
  } finally {
    pg.Client.prototype.query = original;
  }
}

/**
 * Runs 8 fast-path jobs submitted together (one group), `jobAt(i)` being each one's effect;
 * counts how often each effect ran. Keys `${prefix}0` … `${prefix}7`.
 */
async function groupOfEight(keys: IdempotencyKeys, prefix: string, jobAt: (tx: Kysely<any>, i: number) => Promise<unknown>) {
  const runs = Array<number>(8).fill(0);
  const settled = await Promise.allSettled(
    Array.from({ length: 8 }, (_, i) =>
      keys.executeOnce(scope, `${prefix}${i}`, fp(`${prefix}${i}`), async (tx) => {
        runs[i]!++;
        return jobAt(tx, i);
      }),
    ),
  );
  return { settled, runs };
}

describe('group commit: the outcome of one job after another', () => {
  it('1. concurrent fast-path jobs share transactions, and each key takes effect once', async () => {
    const keys = Array.from({ length: 12 }, (_, i) => `share-${String(i).padStart(2, '0')}`);
    const grouped = groupedKeys();
    const outcomes = await Promise.all(keys.map((key) => grouped.executeOnce(scope, key, fp(key), async (tx) => (await insertEffect(tx, key), { key }))));
    expect(outcomes.map((o) => o.kind)).toEqual(keys.map(() => 'executed'));
    const rows = await effects('share-');
    expect(rows.map((r) => r.key)).toEqual(keys);
    expect(new Set(rows.map((r) => r.txid)).size).toBeLessThan(keys.length);
    const again = await grouped.executeOnce(scope, keys[3]!, fp(keys[3]!), async () => 'must not run');
    expect(again).toMatchObject({ kind: 'completed', result: { key: keys[3] } });
  });

  it('2. a job that throws, and one whose statement fails, fail alone: the group rolls back, they run alone, the others commit together', async () => {
    const { settled, runs } = await groupOfEight(groupedKeys(), 'iso-', async (tx, i) => {
      if (i === 4) {
        await insertEffect(tx, `iso-${i}`);
        throw new Error('boom in the middle of the group');
      }
      if (i === 6) await sql`insert into ${sql.id(env.schema, 'group_effects')} (key) values (${`iso-${i}`} || (1 / 0)::text)`.execute(tx);
      else await insertEffect(tx, `iso-${i}`);
      return i;
    });
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled', 'fulfilled', 'rejected', 'fulfilled', 'rejected', 'fulfilled']);
    expect((settled[4] as PromiseRejectedResult).reason).toMatchObject({ message: 'boom in the middle of the group' });
    expect((settled[6] as PromiseRejectedResult).reason).toMatchObject({ code: '22012' });
    const rows = await effects('iso-');
    expect(rows.map((r) => r.key)).toEqual(['iso-0', 'iso-1', 'iso-2', 'iso-3', 'iso-5', 'iso-7']);
    expect(new Set(rows.map((r) => r.txid)).size).toBe(1); // the six committed together
    expect(await plain.get(scope, 'iso-4')).toBeUndefined();
    expect(await plain.get(scope, 'iso-6')).toBeUndefined();
    // The failing two ran in the group and again alone; the others in the group and in its re-run.
    expect(runs).toEqual([2, 2, 2, 2, 2, 2, 2, 2]);
  });

  it('3. a leased job whose lease was taken over is fenced: it fails alone with LeaseLostError; its group-mates commit', async () => {
    const grouped = groupedKeys();
    const zombie = held(await plain.claim(scope, 'fenced-zombie', fp('fenced-zombie')));
    await expireLease(env.db, env.schema, scope, 'fenced-zombie');
    const successor = held(await plain.claim(scope, 'fenced-zombie', fp('fenced-zombie')));
    expect(successor.fence).toBe(2);
    const mates = await Promise.all(['fenced-mate-1', 'fenced-mate-2'].map(async (key) => held(await plain.claim(scope, key, fp(key)))));
    const results = await Promise.allSettled([
      grouped.commitEffect(mates[0]!, async (tx) => (await insertEffect(tx, 'fenced-mate-1'), 1)),
      grouped.commitEffect(zombie, async (tx) => (await insertEffect(tx, 'fenced-zombie'), 'zombie')),
      grouped.commitEffect(mates[1]!, async (tx) => (await insertEffect(tx, 'fenced-mate-2'), 2)),
    ]);
    expect(results[0]).toMatchObject({ status: 'fulfilled', value: 1 });
    expect((results[1] as PromiseRejectedResult).reason).toBeInstanceOf(LeaseLostError);
    expect(results[2]).toMatchObject({ status: 'fulfilled', value: 2 });
    expect((await effects('fenced-')).map((r) => r.key)).toEqual(['fenced-mate-1', 'fenced-mate-2']);
    expect(await plain.get(scope, 'fenced-zombie')).toMatchObject({ status: 'processing', fence: 2 });
    await grouped.commitEffect(successor, async (tx) => (await insertEffect(tx, 'fenced-zombie'), 'successor'));
    expect(await plain.get(scope, 'fenced-zombie')).toMatchObject({ status: 'completed', result: 'successor' });
  });

  it('4. two jobs of one key: one runs, the others replay its result, never a second effect', async () => {
    const grouped = groupedKeys();
    const runs = await Promise.all([1, 2, 3].map(() => grouped.executeOnce(scope, 'same-key', fp('same-key'), async (tx) => (await insertEffect(tx, 'same-key'), 'only once'))));
    expect(runs.filter((o) => o.kind === 'executed')).toHaveLength(1);
    for (const o of runs) if (o.kind !== 'executed') expect(o).toMatchObject({ kind: 'completed', result: 'only once' });
    expect((await effects('same-key')).length).toBe(1);
  });

  it('5. a job that swallows its statement\'s error and returns nothing fails (its transaction was aborted), alone and in a group; nothing is reported done that did not commit', async () => {
    const swallow = async (tx: Kysely<any>, key: string) => {
      await insertEffect(tx, key);
      await sql`select 1 / 0`.execute(tx).catch(() => {});
    };
    await expect(plain.executeOnce(scope, 'swallow-alone', fp('swallow-alone'), (tx) => swallow(tx, 'swallow-alone'))).rejects.toMatchObject({ code: '25P02' });
    expect(await plain.get(scope, 'swallow-alone')).toBeUndefined();
    const { settled } = await groupOfEight(groupedKeys(), 'swallow-', async (tx, i) => (i === 3 ? swallow(tx, `swallow-${i}`) : insertEffect(tx, `swallow-${i}`)));
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled', 'rejected', 'fulfilled', 'fulfilled', 'fulfilled', 'fulfilled']);
    expect((await effects('swallow-')).map((r) => r.key)).toEqual(['swallow-0', 'swallow-1', 'swallow-2', 'swallow-4', 'swallow-5', 'swallow-6', 'swallow-7']);
  });
});

/**
 * The faults of one job, each at every position of a group of 8: only that job fails (with its
 * own error), every other commits once, and nothing of the failing job is kept.
 */
const FAULTS = {
  // Kysely compiles an empty `in` list to `in ()`: a syntax error, found when Postgres parses it.
  'a syntax error': {
    effect: (tx: Kysely<any>, key: string) =>
      tx
        .insertInto(`${env.schema}.group_effects`)
        .columns(['key'])
        .expression(tx.selectNoFrom(sql.lit(key).as('key')).where(sql.lit(key), 'in', []))
        .execute(),
    code: '42601',
  },
  // Bound, a NUL is an invalid byte for Postgres: a deterministic error of the job's, never a connection fault.
  'a NUL in a value': { effect: (tx: Kysely<any>, key: string) => insertEffect(tx, key, { seen: 'a\u0000b' }), code: '22021' },
  // Checked only at COMMIT: the group's COMMIT fails, nobody's for certain, so every job runs alone.
  'a deferred foreign key broken': { effect: (tx: Kysely<any>, key: string) => insertEffect(tx, key, { badRef: true }), code: '23503' },
  // The transaction is the library's: refused before it is sent, for good.
  'a COMMIT of its own': {
    effect: async (tx: Kysely<any>, key: string) => {
      await insertEffect(tx, key);
      await sql`commit`.execute(tx);
    },
    code: 'TRANSACTION_CONTROL',
  },
} as const;

describe.each(Object.entries(FAULTS))('one job of a group of 8 with %s', (name, fault) => {
  const prefix = `${name.replace(/[^a-z]+/gi, '-')}-`;
  it.each([0, 1, 2, 3, 4, 5, 6, 7])('at position %i: only it fails, with its own error; the other 7 commit once', async (position) => {
    const keys = groupedKeys();
    const at = `${prefix}${position}-`;
    const { settled, runs } = await groupOfEight(keys, at, (tx, i) => (i === position ? fault.effect(tx, `${at}${i}`) : insertEffect(tx, `${at}${i}`)));
    expect(settled.map((s) => s.status)).toEqual(Array.from({ length: 8 }, (_, i) => (i === position ? 'rejected' : 'fulfilled')));
    expect((settled[position] as PromiseRejectedResult).reason).toMatchObject({ code: fault.code });
    const committed = await effects(at);
    expect(committed.map((r) => r.key)).toEqual(Array.from({ length: 8 }, (_, i) => `${at}${i}`).filter((_, i) => i !== position));
    for (let i = 0; i < 8; i++) {
      if (i === position) expect(await plain.get(scope, `${at}${i}`)).toBeUndefined();
      else expect(await plain.get(scope, `${at}${i}`)).toMatchObject({ status: 'completed', fence: 1 });
    }
    // All 8 shared the first group (each ran in it), and each ran once more: alone, or in the re-run.
    expect(runs).toEqual(Array(8).fill(2));
  });
});

describe('no state crosses from one job to another', () => {
  /** Each job records what it sees of `setting`; the job at `position` first changes it with `change`. */
  async function changedAt(position: number, prefix: string, setting: string, change: (tx: Kysely<any>) => Promise<unknown>, db: Kysely<any> = env.db) {
    const keys = groupedKeys(db, { watchSettings: ['app.tenant'] });
    return groupOfEight(keys, prefix, async (tx, i) => {
      if (i === position) await change(tx);
      const { rows } = await sql<{ seen: string | null }>`select current_setting(${setting}, true) as seen`.execute(tx);
      await insertEffect(tx, `${prefix}${i}`, { seen: rows[0]!.seen ?? '<unset>' });
    });
  }

  const SETTINGS: ReadonlyArray<readonly [string, string, string]> = [
    ['synchronous_commit', 'set local synchronous_commit = off', 'off'],
    ['app.tenant', "select set_config('app.tenant', 'tenant-A', true)", 'tenant-A'],
    ['statement_timeout', "set local statement_timeout = '7s'", '7s'],
    ['search_path', 'set local search_path = pg_catalog', 'pg_catalog'],
    ['session_replication_role', 'set local session_replication_role = replica', 'replica'],
    ['lock_timeout', "set local lock_timeout = '3s'", '3s'],
  ];

  it.each(SETTINGS)('%s changed by one job (%s) is seen by no group-mate; that job runs alone and sees its own', async (setting, statement, value) => {
    for (const position of [0, 3, 7]) {
      const prefix = `set-${setting.replace(/\W/g, '')}-${position}-`;
      const { settled } = await changedAt(position, prefix, setting, (tx) => sql.raw(statement).execute(tx));
      expect(settled.every((s) => s.status === 'fulfilled')).toBe(true);
      const rows = await effects(prefix);
      expect(rows).toHaveLength(8);
      for (const row of rows) {
        if (row.key === `${prefix}${position}`) expect(row.seen).toBe(value);
        else expect(row.seen).not.toBe(value);
      }
      // The job that changed it committed in a transaction of its own.
      const own = rows.find((row) => row.key === `${prefix}${position}`)!;
      expect(rows.filter((row) => row.txid === own.txid)).toHaveLength(1);
    }
  });

  it('a setting changed inside a function (out of the statement screen\'s sight) is caught at the group\'s end: nothing of the group commits with it, every job runs alone', async () => {
    // A custom setting the sessions know from their start, watched because it is named (watchSettings).
    const url = new URL(env.databaseUrl);
    url.searchParams.set('options', '-c app.tenant=none');
    const db = createPostgresDb({ connectionString: url.toString(), maxConnections: 4, preparedStatements: env.preparedStatements });
    try {
      for (const [setting, value] of [
        ['app.tenant', 'tenant-A'],
        ['synchronous_commit', 'off'],
      ] as const) {
        const prefix = `quiet-${setting.replace(/\W/g, '')}-`;
        const { settled } = await changedAt(2, prefix, setting, (tx) => sql`select ${sql.id(env.schema, 'set_quietly')}(${setting}, ${value})`.execute(tx), db);
        expect(settled.every((s) => s.status === 'fulfilled')).toBe(true);
        const rows = await effects(prefix);
        expect(rows.filter((row) => row.seen === value).map((row) => row.key)).toEqual([`${prefix}2`]);
      }
    } finally {
      await db.destroy();
    }
  });

  it('a job that declares it runs alone (runsAlone) never shares a transaction', async () => {
    const keys = groupedKeys();
    const outcomes = await Promise.all(
      [0, 1, 2].map((i) =>
        keys.executeOnce(scope, `declared-${i}`, fp(`declared-${i}`), async (tx) => (await insertEffect(tx, `declared-${i}`), i), {
          databaseOnly: true,
          runsAlone: i === 1,
        }),
      ),
    );
    expect(outcomes.map((o) => o.kind)).toEqual(['executed', 'executed', 'executed']);
    const rows = await effects('declared-');
    const alone = rows.find((row) => row.key === 'declared-1')!;
    expect(rows.filter((row) => row.txid === alone.txid)).toHaveLength(1);
  });

  it('once a job of a kind is found changing a setting, later jobs of that kind run alone from the start (no group rolled back for them)', async () => {
    const keys = groupedKeys();
    const run = (prefix: string) =>
      Promise.all(
        Array.from({ length: 4 }, (_, i) =>
          keys.executeOnce(
            scope,
            `${prefix}${i}`,
            fp(`${prefix}${i}`),
            async (tx) => {
              if (i % 2 === 0) await sql`set local statement_timeout = '9s'`.execute(tx);
              return insertEffect(tx, `${prefix}${i}`);
            },
            { jobName: i % 2 === 0 ? 'tenant-job' : 'plain-job' },
          ),
        ),
      );
    await run('kind-first-');
    const { statements: sent } = await recordStatements(() => run('kind-later-'));
    expect(sent.filter((text) => /^rollback$/.test(text))).toEqual([]);
    expect((await effects('kind-later-')).length).toBe(4);
  });
});

describe('what Postgres answers is what each job gets (pipelines)', () => {
  it('6. a group of 8 fast-path jobs costs 2 round trips and no savepoint: BEGIN with the 8 effects, then the keys written completed with their results, with the COMMIT', async () => {
    const keys = groupedKeys();
    await keys.executeOnce(scope, 'lean-warm', fp('lean-warm'), async () => 'warm'); // the group's one read of the custom settings
    const { value: outcomes, statements: sent } = await recordStatements(() =>
      Promise.all(Array.from({ length: 8 }, (_, i) => keys.executeOnce(scope, `lean-${i}`, fp(`lean-${i}`), async (tx) => (await insertEffect(tx, `lean-${i}`), i)))),
    );
    expect(outcomes.map((o) => o.kind)).toEqual(Array(8).fill('executed'));
    expect(outcomes[3]).toMatchObject({ result: 3, claim: { fence: 1, attempts: 1 } });
    expect(sent).toHaveLength(2);
    expect(sent[0]).toMatch(/^begin isolation level read committed;\nselect pg_catalog\.set_config\('idempotent_jobs\.group_state'/);
    expect(sent[0]!.match(/insert into/g)).toHaveLength(8);
    // The state is checked after each job, before the next one's statement, in the same round trip.
    expect(sent[0]!.match(/group_state_differs/g)).toHaveLength(7);
    expect(sent[0]).toMatch(/insert into[^;]*;\nselect [^;]*group_state_differs\(\$1::text\[\]\)[^;]*;\ninsert into/);
    expect(sent[1]).toMatch(/^select .*group_state_differs\(.*\);\nselect .*insert_completed_keys\(.*\);\ncommit$/s);
    expect(sent.some((text) => /savepoint|claim_/.test(text))).toBe(false);
    expect(new Set((await effects('lean-')).map((r) => r.txid)).size).toBe(1);
    for (const [i, outcome] of outcomes.entries()) {
      const owner = outcome.kind === 'executed' ? outcome.claim.owner : undefined;
      expect(await plain.get(scope, `lean-${i}`)).toMatchObject({ status: 'completed', result: i, fence: 1, attempts: 1, owner });
    }
  });

  it('6b. where no code stored in the database can leave state, the same group checks its state once, at its end; what that finds no job is blamed for: every job runs alone, and later groups check after each job', async () => {
    const keys = groupedKeysOfCleanDatabase();
    await keys.executeOnce(scope, 'clean-warm', fp('clean-warm'), async () => 'warm');
    const { value: outcomes, statements: sent } = await recordStatements(() =>
      Promise.all(Array.from({ length: 8 }, (_, i) => keys.executeOnce(scope, `clean-${i}`, fp(`clean-${i}`), async (tx) => (await insertEffect(tx, `clean-${i}`), i)))),
    );
    expect(outcomes.map((o) => o.kind)).toEqual(Array(8).fill('executed'));
    expect(sent).toHaveLength(2);
    expect(sent[0]!.match(/insert into/g)).toHaveLength(8);
    expect(sent[0]).not.toMatch(/group_state_differs/);
    // One check at the end, which compares the prepared statements too.
    expect(sent[1]!.match(/group_state_differs/g)).toHaveLength(1);
    expect(sent[1]).toMatch(/^select .*group_state_differs\(.*pg_prepared_statements.*\);\nselect .*insert_completed_keys\(.*\);\ncommit$/s);

    // A function the read of the database's code did not report (as code made after the read, or
    // written in C) changes a watched setting in the second job of a group: only the group's end
    // finds it.
    const { statements: found } = await recordStatements(() =>
      Promise.all(
        Array.from({ length: 3 }, (_, i) =>
          keys.executeOnce(scope, `unseen-${i}`, fp(`unseen-${i}`), async (tx) => {
            // One statement each (the jobs of a gathered group run at once): the second job sets
            // the setting before its row records it; the others record what they run under.
            const setting = i === 1 ? sql`(select ${sql.id(env.schema, 'set_quietly')}('statement_timeout', '9s')) as quietly` : sql`(select) as plain`;
            await sql`insert into ${sql.id(env.schema, 'group_effects')} (key, seen)
              select ${`unseen-${i}`}, current_setting('statement_timeout') from ${setting}`.execute(tx);
            return i;
          }),
        ),
      ),
    );
    expect(found.filter((text) => /^rollback$/.test(text))).toHaveLength(1);
    // Each ran again alone, under its own setting only.
    expect((await effects('unseen-')).map((row) => [row.key, row.seen])).toEqual([
      ['unseen-0', '0'],
      ['unseen-1', '9s'],
      ['unseen-2', '0'],
    ]);
    // From then on, each job is checked after its statements.
    const { statements: later } = await recordStatements(() =>
      Promise.all(Array.from({ length: 4 }, (_, i) => keys.executeOnce(scope, `checked-${i}`, fp(`checked-${i}`), async (tx) => (await insertEffect(tx, `checked-${i}`), i)))),
    );
    expect(later[0]!.match(/group_state_differs/g)).toHaveLength(3);
  });

  it('7. a key that has a row fails the group at its end, naming that key: only its job runs alone (and replays); the others commit together', async () => {
    const keys = groupedKeys();
    await plain.executeOnce(scope, 'again-2', fp('again-2'), async () => 'stored before');
    const runs = new Map<string, number>();
    const outcomes = await Promise.all(
      [0, 1, 2, 3].map((i) =>
        keys.executeOnce(scope, `again-${i}`, fp(`again-${i}`), async (tx) => {
          runs.set(`again-${i}`, (runs.get(`again-${i}`) ?? 0) + 1);
          await insertEffect(tx, `again-${i}`);
          return i;
        }),
      ),
    );
    expect(outcomes.map((o) => o.kind)).toEqual(['executed', 'executed', 'completed', 'executed']);
    expect(outcomes[2]).toMatchObject({ result: 'stored before' });
    const rows = await effects('again-');
    expect(rows.map((r) => r.key)).toEqual(['again-0', 'again-1', 'again-3']);
    expect(new Set(rows.map((r) => r.txid)).size).toBe(1);
    expect(runs.get('again-2')).toBe(1); // alone, its claim found it completed: no second run
  });

  it('8. two workers run one key in groups at once: the first COMMIT wins, the other job replays its result', async () => {
    const first = groupedKeys();
    const second = groupedKeys();
    const inEffect = createGate();
    const gate = createGate();
    const slow = first.executeOnce(scope, 'race', fp('race'), async (tx) => {
      await insertEffect(tx, 'race');
      inEffect.open();
      await gate.wait;
      return 'slow';
    });
    await inEffect.wait;
    const fast = await second.executeOnce(scope, 'race', fp('race'), async (tx) => (await insertEffect(tx, 'race'), 'fast'));
    expect(fast).toMatchObject({ kind: 'executed', result: 'fast' });
    gate.open();
    expect(await slow).toMatchObject({ kind: 'completed', result: 'fast' });
    expect((await effects('race')).length).toBe(1);
  });

  it('9. a COMMIT applied whose reply was lost: each job reads its key, finds it completed under its own claim, and reports its result', async () => {
    const keys = groupedKeys();
    await keys.executeOnce(scope, 'cut-reply-warm', fp('cut-reply-warm'), async () => 'warm');
    const original = pg.Client.prototype.query;
    let cut = 0;
    pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
      const submitted = args[0] as { text?: string; handleReadyForQuery?: () => void; handleError?: (error: Error) => void };
      if (typeof submitted.text === 'string' && /insert_completed_keys.*;\ncommit$/s.test(submitted.text) && cut++ === 0) {
        // The server applies the COMMIT; its answer is lost on the way back.
        submitted.handleReadyForQuery = () => submitted.handleError!(new Error('Connection terminated unexpectedly'));
      }
      return (original as (...a: unknown[]) => unknown).apply(this, args);
    } as typeof original;
    let outcomes: Array<ExecuteOnceOutcome<number>>;
    try {
      outcomes = await Promise.all([0, 1, 2].map((i) => keys.executeOnce(scope, `cut-reply-${i}`, fp(`cut-reply-${i}`), async (tx) => (await insertEffect(tx, `cut-reply-${i}`), i))));
    } finally {
      pg.Client.prototype.query = original;
    }
    expect(cut).toBe(1);
    expect(outcomes.map((o) => o.kind === 'executed' && o.result)).toEqual([0, 1, 2]);
    expect((await effects('cut-reply-')).map((r) => r.key)).toEqual(['cut-reply-0', 'cut-reply-1', 'cut-reply-2']);
  });

  it('10. each job receives its own statement\'s result, whatever its position in the pipeline', async () => {
    const keys = groupedKeys();
    const { value: outcomes, statements: sent } = await recordStatements(() =>
      Promise.all(
        Array.from({ length: 8 }, (_, i) =>
          keys.executeOnce(scope, `own-${i}`, fp(`own-${i}`), async (tx) => {
            const { rows } = await sql<{ key: string; n: number }>`
              insert into ${sql.id(env.schema, 'group_effects')} (key) values (${`own-${i}`}) returning key, ${i}::int as n`.execute(tx);
            return rows;
          }),
        ),
      ),
    );
    expect(sent.filter((text) => /group_effects/.test(text))).toHaveLength(1);
    expect(outcomes.map((o) => o.kind === 'executed' && o.result)).toEqual(Array.from({ length: 8 }, (_, i) => [{ key: `own-${i}`, n: i }]));
  });

  it('11. jobs of several statements each (read for update, then write what was read) lose no update: the group runs again one job after another', async () => {
    const keys = groupedKeys();
    await sql`create table ${sql.id(env.schema, 'group_counter')} (id int primary key, n int not null)`.execute(env.db);
    await sql`insert into ${sql.id(env.schema, 'group_counter')} values (1, 0)`.execute(env.db);
    const counter = sql.id(env.schema, 'group_counter');
    const runs = new Map<number, number>();
    const increment = async (tx: Kysely<any>, i: number) => {
      runs.set(i, (runs.get(i) ?? 0) + 1);
      const { rows } = await sql<{ n: number }>`select n from ${counter} where id = 1 for update`.execute(tx);
      await sql`update ${counter} set n = ${rows[0]!.n + 1} where id = 1`.execute(tx);
      return rows[0]!.n + 1;
    };
    const first = await groupOfEight(keys, 'counted-', increment);
    expect(first.settled.map((o) => o.status)).toEqual(Array(8).fill('fulfilled'));
    expect((await sql<{ n: number }>`select n from ${counter}`.execute(env.db)).rows[0]!.n).toBe(8);
    const results = first.settled.map((o) => ((o as PromiseFulfilledResult<ExecuteOnceOutcome<number>>).value as { result: number }).result);
    expect(results.sort((a, b) => a - b)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect([...runs.values()].some((n) => n === 2)).toBe(true); // the gathered try, rolled back
    runs.clear();
    const { statements: sent } = await recordStatements(() => groupOfEight(keys, 'counted-again-', increment));
    expect([...runs.values()]).toEqual(Array(8).fill(1));
    expect(sent.some((text) => /^rollback$/.test(text))).toBe(false);
    expect((await sql<{ n: number }>`select n from ${counter}`.execute(env.db)).rows[0]!.n).toBe(16);
  });

  it('12. binary values share the pipeline; a parameterless text of several statements goes alone, its last result read', async () => {
    const keys = groupedKeys();
    const outcomes = await Promise.all([
      keys.executeOnce(scope, 'binary-0', fp('binary-0'), async (tx) => (await sql<{ b: string }>`select encode(${Buffer.from('hi')}::bytea, 'hex') as b`.execute(tx)).rows[0]!.b),
      keys.executeOnce(scope, 'binary-1', fp('binary-1'), async (tx) => (await insertEffect(tx, 'binary-1'), 1)),
    ]);
    expect(outcomes.map((o) => o.kind === 'executed' && o.result)).toEqual(['6869', 1]);
    const two = await Promise.all(
      [0, 1].map((i) => keys.executeOnce(scope, `two-${i}`, fp(`two-${i}`), async (tx) => (await sql.raw<{ n: number }>(`select ${i} as n; select ${i + 10} as n`).execute(tx)).rows[0]!.n)),
    );
    expect(two.map((o) => o.kind === 'executed' && o.result)).toEqual([10, 11]);
  });

  it('13. a statement types its parameters the same in a group and alone: jsonb_build_object of an untyped parameter fails both ways', async () => {
    const effect = (tx: Kysely<any>) => sql`select jsonb_build_object('k', ${'v'}) as j`.execute(tx);
    const grouped = await groupOfEight(groupedKeys(), 'typed-', (tx) => effect(tx));
    for (const outcome of grouped.settled) expect((outcome as PromiseRejectedResult).reason).toMatchObject({ code: '42P18' });
    await expect(plain.executeOnce(scope, 'typed-alone', fp('typed-alone'), (tx) => effect(tx))).rejects.toMatchObject({ code: '42P18' });
  });
});

describe('a job that leaves its group', () => {
  it('15. a job that leaves before a statement of its own (LeavesGroup) is told at once, while its group goes on; the group commits without it', async () => {
    const keys = groupedKeys();
    const gate = createGate();
    const left = new LeavesGroup('not this time');
    const running = Array.from({ length: 4 }, (_, i) =>
      keys.executeOnce(scope, `leave-${i}`, fp(`leave-${i}`), async (tx) => {
        if (i === 1) throw left;
        await insertEffect(tx, `leave-${i}`);
        if (i === 0) await gate.wait;
        return i;
      }),
    );
    // Told while its group-mate still holds the group open.
    await expect(running[1]).rejects.toBe(left);
    gate.open();
    const outcomes = await Promise.all([running[0], running[2], running[3]]);
    expect(outcomes.map((o) => o!.kind)).toEqual(['executed', 'executed', 'executed']);
    const rows = await effects('leave-');
    expect(rows.map((r) => r.key)).toEqual(['leave-0', 'leave-2', 'leave-3']);
    expect(new Set(rows.map((r) => r.txid)).size).toBe(1);
    expect(await plain.get(scope, 'leave-1')).toBeUndefined();
  });

  it('16. a job that leaves after a statement of its own fails its group as any error does: it runs alone, its statement rolled back; the others commit together', async () => {
    const keys = groupedKeys();
    const left = new LeavesGroup('too late to leave');
    const { settled, runs } = await groupOfEight(keys, 'late-leave-', async (tx, i) => {
      await insertEffect(tx, `late-leave-${i}`);
      if (i === 5) throw left;
      return i;
    });
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled', 'fulfilled', 'fulfilled', 'rejected', 'fulfilled', 'fulfilled']);
    expect((settled[5] as PromiseRejectedResult).reason).toBe(left);
    expect(runs[5]).toBe(2);
    const rows = await effects('late-leave-');
    expect(rows.map((r) => r.key)).not.toContain('late-leave-5');
    expect(new Set(rows.map((r) => r.txid)).size).toBe(1);
  });

  it('17. a prelude before a job\'s own statements is not one of them: sent in the first round trip, it does not make the job\'s later statement interleaved', async () => {
    const keys = groupedKeys();
    const prelude = groupPrelude(CompiledQuery.raw('select 1 as prelude_of_test_17', []));
    await keys.executeOnce(scope, 'prelude-warm', fp('prelude-warm'), async () => 'warm'); // the group's one read of the custom settings
    const { value: outcomes, statements: sent } = await recordStatements(() =>
      Promise.all(
        Array.from({ length: 4 }, (_, i) =>
          keys.executeOnce(scope, `prelude-${i}`, fp(`prelude-${i}`), async (tx) => {
            if (i === 0) await tx.executeQuery(prelude);
            await insertEffect(tx, `prelude-${i}`);
            return i;
          }),
        ),
      ),
    );
    expect(outcomes.map((o) => o.kind)).toEqual(Array(4).fill('executed'));
    // The prelude rode with group-mates' statements; the job's insert came a round trip later; nothing rolled back.
    expect(sent[0]).toMatch(/prelude_of_test_17[^]*insert into/);
    expect(sent.some((text) => /rollback/i.test(text))).toBe(false);
    expect(new Set((await effects('prelude-')).map((r) => r.txid)).size).toBe(1);
  });
  it('18. a prelude sent while a group-mate has a savepoint open counts as the job\'s statement: that group-mate\'s ROLLBACK TO cannot undo the prelude\'s lock under it', async () => {
    const keys = groupedKeys();
    const prelude = groupPrelude(CompiledQuery.raw('select pg_catalog.pg_try_advisory_xact_lock(424242) as prelude_of_test_18', []));
    await keys.executeOnce(scope, 'sp-prelude-warm', fp('sp-prelude-warm'), async () => 'warm');
    const [rolledBack, checked] = [createGate(), createGate()];
    const lockFree = async () =>
      (await env.db.transaction().execute((tx) => sql<{ got: boolean }>`select pg_catalog.pg_try_advisory_xact_lock(424242) as got`.execute(tx))).rows[0]!.got;
    const freeWhileHeld: boolean[] = [];
    const running = [
      keys.executeOnce(scope, 'sp-prelude-0', fp('sp-prelude-0'), async (tx) => {
        await sql`savepoint mine`.execute(tx);
        await rolledBack.wait;
        await sql`rollback to savepoint mine`.execute(tx);
        await insertEffect(tx, 'sp-prelude-0');
        return 0;
      }),
      keys.executeOnce(scope, 'sp-prelude-1', fp('sp-prelude-1'), async (tx) => {
        await tx.executeQuery(prelude);
        rolledBack.open();
        // The group-mate's ROLLBACK TO has gone out, or been refused, by now.
        await sleep(100);
        freeWhileHeld.push(await lockFree());
        checked.open();
        await insertEffect(tx, 'sp-prelude-1');
        return 1;
      }),
    ];
    await checked.wait;
    const outcomes = await Promise.all(running);
    expect(outcomes.map((o) => o.kind)).toEqual(['executed', 'executed']);
    expect(freeWhileHeld[0]).toBe(false);
    expect((await effects('sp-prelude-')).map((r) => r.key)).toEqual(['sp-prelude-0', 'sp-prelude-1']);
  });
  it('19. a group waits past slowJobMs for a slow job that sent a prelude (it may hold locks by the group\'s transaction): the locks last its run, it runs once, and its kind runs alone from then on', async () => {
    const keys = groupedKeys(env.db, { slowJobMs: 200 });
    const prelude = groupPrelude(CompiledQuery.raw('select case when pg_catalog.pg_try_advisory_xact_lock(777001) then array[777001::bigint] else \'{}\' end as lock_keys', []));
    await keys.executeOnce(scope, 'linger-warm', fp('linger-warm'), async () => 'warm');
    const lockFree = async () =>
      (await env.db.transaction().execute((tx) => sql<{ got: boolean }>`select pg_catalog.pg_try_advisory_xact_lock(777001) as got`.execute(tx))).rows[0]!.got;
    const before = Number((await register.getSingleMetricAsString('idempotent_jobs_group_commit_refusals_total')).match(/reason="slots-held-too-long"} (\d+)/)?.[1] ?? 0);
    let slowRuns = 0;
    let freeWhileSlowRan: boolean | undefined;
    const slow = keys.executeOnce(scope, 'linger-0', fp('linger-0'), async (tx) => {
      slowRuns++;
      await tx.executeQuery(prelude);
      await sleep(600); // past slowJobMs
      freeWhileSlowRan = await lockFree();
      await insertEffect(tx, 'linger-0');
      return 0;
    }, { jobName: 'linger' });
    const mate = keys.executeOnce(scope, 'linger-1', fp('linger-1'), async (tx) => (await insertEffect(tx, 'linger-1'), 1));
    expect((await Promise.all([slow, mate])).map((o) => o.kind)).toEqual(['executed', 'executed']);
    expect(slowRuns).toBe(1);
    expect(freeWhileSlowRan).toBe(false);
    expect(await lockFree()).toBe(true);
    const rows = await effects('linger-');
    expect(rows.map((r) => r.key)).toEqual(['linger-0', 'linger-1']);
    expect(new Set(rows.map((r) => r.txid)).size).toBe(1);
    expect(Number((await register.getSingleMetricAsString('idempotent_jobs_group_commit_refusals_total')).match(/reason="slots-held-too-long"} (\d+)/)?.[1])).toBe(before + 1);
    // Its kind runs alone from then on: a job of it shares no group, where one of another kind does.
    const later = await Promise.all(
      ['linger', 'other'].flatMap((kind) => [0, 1].map((i) => keys.executeOnce(scope, `later-${kind}-${i}`, fp(`later-${kind}-${i}`), async (tx) => (await insertEffect(tx, `later-${kind}-${i}`), i), { jobName: kind }))),
    );
    expect(later.map((o) => o.kind)).toEqual(Array(4).fill('executed'));
    const laterRows = await effects('later-');
    const txOf = (key: string) => laterRows.find((r) => r.key === key)!.txid;
    expect(txOf('later-linger-0')).not.toBe(txOf('later-linger-1'));
    expect(laterRows.filter((r) => r.txid === txOf('later-linger-0'))).toHaveLength(1);
    expect(txOf('later-other-0')).toBe(txOf('later-other-1'));
  });

  it('20. a slow job whose prelude counted as its statement (a group-mate had a savepoint open) is waited for too: its locks last its run', async () => {
    const keys = groupedKeys(env.db, { slowJobMs: 200 });
    const prelude = groupPrelude(CompiledQuery.raw('select case when pg_catalog.pg_try_advisory_xact_lock(777002) then array[777002::bigint] else \'{}\' end as lock_keys', []));
    await keys.executeOnce(scope, 'sp-linger-warm', fp('sp-linger-warm'), async () => 'warm');
    const lockFree = async () =>
      (await env.db.transaction().execute((tx) => sql<{ got: boolean }>`select pg_catalog.pg_try_advisory_xact_lock(777002) as got`.execute(tx))).rows[0]!.got;
    const freeWhileSlowRan: boolean[] = [];
    const runs = [
      keys.executeOnce(scope, 'sp-linger-0', fp('sp-linger-0'), async (tx) => {
        await sql`savepoint mine`.execute(tx);
        await sql`release savepoint mine`.execute(tx);
        return 0;
      }),
      keys.executeOnce(scope, 'sp-linger-1', fp('sp-linger-1'), async (tx) => {
        await tx.executeQuery(prelude);
        await sleep(600); // past slowJobMs
        freeWhileSlowRan.push(await lockFree());
        return 1;
      }, { jobName: 'sp-linger' }),
    ];
    expect((await Promise.all(runs)).map((o) => o.kind)).toEqual(['executed', 'executed']);
    expect(freeWhileSlowRan.every((free) => !free)).toBe(true);
    expect(await lockFree()).toBe(true);
  });

  /** Four jobs of one group, each sending its insert and then `last(i)` (the same text for every job), with the statements recorded. */
  async function insertThenLast(keys: IdempotencyKeys, prefix: string, last: CompiledQuery<unknown>) {
    await keys.executeOnce(scope, `${prefix}warm`, fp(`${prefix}warm`), async () => 'warm');
    return recordStatements(() =>
      Promise.all(
        Array.from({ length: 4 }, (_, i) =>
          keys.executeOnce(scope, `${prefix}${i}`, fp(`${prefix}${i}`), async (tx) => {
            await insertEffect(tx, `${prefix}${i}`);
            await tx.executeQuery(last);
            return i;
          }),
        ),
      ),
    );
  }

  it('21. a postlude after group-mates\' statements is not interleaved: the jobs\' last statements share a round trip, and nothing runs again (an ordinary last statement does make the group run again)', async () => {
    const postlude = await insertThenLast(groupedKeys(), 'postlude-', groupPostlude(CompiledQuery.raw('select 1 as postlude_of_test_21', [])));
    expect(postlude.value.map((o) => o.kind)).toEqual(Array(4).fill('executed'));
    expect(postlude.statements.some((text) => /postlude_of_test_21[^]*postlude_of_test_21/.test(text))).toBe(true);
    expect(postlude.statements.some((text) => /rollback/i.test(text))).toBe(false);
    expect(new Set((await effects('postlude-')).map((r) => r.txid)).size).toBe(1);

    const ordinary = await insertThenLast(groupedKeys(), 'not-postlude-', CompiledQuery.raw('select 1 as ordinary_of_test_21', []));
    expect(ordinary.value.map((o) => o.kind)).toEqual(Array(4).fill('executed'));
    expect(ordinary.statements.some((text) => /rollback/i.test(text))).toBe(true);
  });

  it('22. a postlude sent while a group-mate has a savepoint open is an ordinary statement: that group-mate\'s ROLLBACK TO cannot undo it', async () => {
    const keys = groupedKeys();
    const postlude = groupPostlude(CompiledQuery.raw(`insert into ${env.schema}.group_effects (key) values ('sp-postlude-1-last')`, []));
    await keys.executeOnce(scope, 'sp-postlude-warm', fp('sp-postlude-warm'), async () => 'warm');
    const [inserted, savepointOpen, postludeSent] = [createGate(), createGate(), createGate()];
    const runs = [0, 0];
    const outcomes = await Promise.all([
      keys.executeOnce(scope, 'sp-postlude-0', fp('sp-postlude-0'), async (tx) => {
        runs[0]!++;
        await inserted.wait;
        await sql`savepoint mine`.execute(tx);
        savepointOpen.open();
        await postludeSent.wait;
        await sql`rollback to savepoint mine`.execute(tx);
        await sql`release savepoint mine`.execute(tx);
        await insertEffect(tx, 'sp-postlude-0');
        return 0;
      }),
      keys.executeOnce(scope, 'sp-postlude-1', fp('sp-postlude-1'), async (tx) => {
        runs[1]!++;
        await insertEffect(tx, 'sp-postlude-1');
        inserted.open();
        await savepointOpen.wait;
        // Sent after the group-mate's SAVEPOINT: as a postlude, the ROLLBACK TO would undo it.
        await tx.executeQuery(postlude).catch(() => {});
        postludeSent.open();
        return 1;
      }),
    ]);
    expect(outcomes.map((o) => o.kind)).toEqual(['executed', 'executed']);
    expect((await effects('sp-postlude-')).map((r) => r.key)).toEqual(['sp-postlude-0', 'sp-postlude-1', 'sp-postlude-1-last']);
    expect(runs).toEqual([2, 2]); // the gathered try failed as interleaved, and ran again one job after another
  });

  it('23. a postlude runs only after the state the last job\'s statements left is checked: a setting a group-mate changed out of the screen\'s sight is found before the postlude runs under it', async () => {
    const keys = groupedKeys();
    await keys.executeOnce(scope, 'state-postlude-warm', fp('state-postlude-warm'), async () => 'warm');
    const postlude = groupPostlude(CompiledQuery.raw(`insert into ${env.schema}.group_effects (key, seen) values ('state-postlude-x-last', current_setting('synchronous_commit'))`, []));
    const [changed, postludeSent] = [createGate(), createGate()];
    const runs = [0, 0];
    const outcomes = await Promise.all([
      keys.executeOnce(scope, 'state-postlude-x', fp('state-postlude-x'), async (tx) => {
        runs[0]!++;
        await insertEffect(tx, 'state-postlude-x');
        await changed.wait;
        await tx.executeQuery(postlude).catch(() => {});
        postludeSent.open();
        return 'x';
      }),
      keys.executeOnce(scope, 'state-postlude-y', fp('state-postlude-y'), async (tx) => {
        runs[1]!++;
        // Changed, then put back after the group-mate's postlude: only a check between sees it.
        await sql`select ${sql.id(env.schema, 'set_quietly')}('synchronous_commit', 'off')`.execute(tx);
        changed.open();
        await postludeSent.wait;
        await sql`select ${sql.id(env.schema, 'set_quietly')}('synchronous_commit', 'on')`.execute(tx);
        await insertEffect(tx, 'state-postlude-y');
        return 'y';
      }),
    ]);
    expect(outcomes.map((o) => o.kind)).toEqual(['executed', 'executed']);
    // The job that left the setting is found and runs alone; the postlude never ran under it.
    expect(runs[1]).toBeGreaterThan(1);
    const rows = await effects('state-postlude-');
    expect(rows.map((r) => r.key)).toEqual(['state-postlude-x', 'state-postlude-x-last', 'state-postlude-y']);
    expect(rows.find((r) => r.key === 'state-postlude-x-last')!.seen).toBe('on');
  });
});

describe('group commit options and its absence', () => {
  it('14. group commit needs a store with group statements, at most 63 jobs a group, and has no `optimistic` setting any more', () => {
    const store = { schema: env.schema } as unknown as KeyStore;
    expect(() => new IdempotencyKeys({ db: env.db, schema: env.schema, groupCommit: true }, store)).toThrow(ValidationError);
    expect(() => new IdempotencyKeys({ db: env.db, schema: env.schema, groupCommit: { maxJobs: 64 } })).toThrow(/maxJobs/);
    expect(() => new IdempotencyKeys({ db: env.db, schema: env.schema, groupCommit: { optimistic: false } as never })).toThrow(/optimistic is gone/);
    expect(() => new IdempotencyKeys({ db: env.db, schema: env.schema, groupCommit: { slowJobMs: 0 } })).toThrow(/groupCommit\.slowJobMs/);
  });

  it('17. a callback that holds its group past slowJobMs: its group-mates commit together without it, and it runs alone once its abandoned run has ended, never two runs at once', async () => {
    const keys = groupedKeys(env.db, { slowJobMs: 200 });
    const othersCommitted = createGate();
    const runs = Array<number>(8).fill(0);
    let slowRunsAtOnce = 0;
    let mostSlowRunsAtOnce = 0;
    const jobs = Array.from({ length: 8 }, (_, i) =>
      keys.executeOnce(
        scope,
        `slow-${i}`,
        fp(`slow-${i}`),
        async (tx) => {
          runs[i]!++;
          if (i !== 3) return (await insertEffect(tx, `slow-${i}`), i);
          mostSlowRunsAtOnce = Math.max(mostSlowRunsAtOnce, ++slowRunsAtOnce);
          try {
            // Its first run waits, outside the database, until the others have committed:
            // without the bound their group would wait for it for ever.
            if (runs[i] === 1) await othersCommitted.wait;
            await insertEffect(tx, `slow-${i}`);
            return i;
          } finally {
            slowRunsAtOnce--;
          }
        },
        { databaseOnly: true },
      ),
    );
    await Promise.all(jobs.filter((_, i) => i !== 3));
    othersCommitted.open();
    const outcomes = await Promise.all(jobs);
    expect(outcomes.map((o) => o.kind)).toEqual(jobs.map(() => 'executed'));
    const rows = await effects('slow-');
    expect(rows.map((r) => r.key)).toEqual(jobs.map((_, i) => `slow-${i}`));
    const slow = rows.find((row) => row.key === 'slow-3')!;
    const others = rows.filter((row) => row.key !== 'slow-3');
    expect(new Set(others.map((r) => r.txid)).size).toBe(1); // the seven committed together
    expect(others[0]!.txid).not.toBe(slow.txid);
    // The others ran in the group that went on without job 3, and again; job 3 ran twice, the
    // second time alone and only after its first run had ended.
    expect(runs).toEqual([2, 2, 2, 2, 2, 2, 2, 2]);
    expect(mostSlowRunsAtOnce).toBe(1);
  });

  it('15. jobs waiting for a group fail (for their callers to retry) when no connection can be had, instead of looping', async () => {
    const unreachable = createPostgresDb({ connectionString: 'postgres://postgres@127.0.0.1:1/postgres', maxConnections: 1 });
    const keys = new IdempotencyKeys({ db: unreachable, schema: 'nowhere', groupCommit: { maxGroups: 1 } }, new PostgresKeyStore(unreachable, 'nowhere', { probeSettledKeys: false }));
    const claim = { scope, key: 'k', owner: '00000000-0000-4000-8000-000000000000', fence: 1, attempts: 1, lockedUntil: null } as const;
    const settled = await Promise.allSettled([1, 2, 3].map(() => keys.commitEffect(claim as never, async () => 'never')));
    expect(settled.map((s) => s.status)).toEqual(['rejected', 'rejected', 'rejected']);
    await unreachable.destroy();
  });

  it('16. an effect alone may not end its transaction either: COMMIT is refused before it is sent, and nothing of the effect is kept', async () => {
    const outcome = await plain
      .executeOnce(scope, 'commit-alone', fp('commit-alone'), async (tx) => {
        await insertEffect(tx, 'commit-alone');
        await sql`commit`.execute(tx);
      })
      .catch((error: unknown) => error);
    expect(outcome).toBeInstanceOf(TransactionControlError);
    expect(await effects('commit-alone')).toEqual([]);
    expect(await plain.get(scope, 'commit-alone')).toBeUndefined();
    // A savepoint of the effect's own, and a rollback to it, are fine.
    const saved = await plain.executeOnce(scope, 'savepoint-alone', fp('savepoint-alone'), async (tx) => {
      await sql`savepoint mine`.execute(tx);
      await insertEffect(tx, 'savepoint-undone');
      await sql`rollback to savepoint mine`.execute(tx);
      await insertEffect(tx, 'savepoint-alone');
      return 'kept';
    });
    expect(saved).toMatchObject({ kind: 'executed', result: 'kept' });
    expect((await effects('savepoint-')).map((r) => r.key)).toEqual(['savepoint-alone']);
  });
});
