/**
 * The store's hot statements as named prepared statements (src/store/named-statements.ts):
 * parsed once per connection, a failed Parse closed before the next, a statement found gone a
 * store fault that turns naming off for the pool, and none named when the pool is told not to.
 * Against Postgres itself: through a pooler the tests of test/pgbouncer.test.ts apply.
 */
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, LeaseLostError, StoreUnavailableError, createPostgresDb, isHeld } from '../src/index.js';
import { preparedStatementsOverDatabaseUrl } from '../src/runtime/env-config.js';
import { createEffectsTable, effectsOf, expireLease, insertEffect } from './support/protocol-fixtures.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
const dbs: Kysely<any>[] = [];
const scope = 'named';
const fingerprint = (n: number | string) => `fp-${n}`;

beforeAll(async () => {
  env = await createTestEnv('named-statements');
  await createEffectsTable(env.db, env.schema);
});
afterAll(async () => {
  await Promise.all(dbs.map((db) => db.destroy()));
  await env?.teardown();
});

/** A pool of one connection straight to Postgres, so that every statement meets the same session. */
function onePostgresConnection(preparedStatements?: boolean): Kysely<any> {
  const db = createPostgresDb({ connectionString: env.databaseDirectUrl, maxConnections: 1, applicationName: 'test:named', ...(preparedStatements === undefined ? {} : { preparedStatements }) }, () => {});
  dbs.push(db);
  return db;
}

/** Every Parse message node-postgres writes while `fn` runs: the statement's name ('' unnamed) and text. */
async function parsesDuring(fn: () => Promise<void>): Promise<Array<{ name: string; text: string }>> {
  const parses: Array<{ name: string; text: string }> = [];
  const Connection = (pg as unknown as { Connection: { prototype: { parse(message: { name?: string; text: string }): void } } }).Connection;
  const original = Connection.prototype.parse;
  Connection.prototype.parse = function (this: unknown, message: { name?: string; text: string }) {
    parses.push({ name: message.name ?? '', text: message.text });
    return original.call(this, message);
  };
  try {
    await fn();
  } finally {
    Connection.prototype.parse = original;
  }
  return parses;
}

async function runJob(keys: IdempotencyKeys, key: string, worker = 'w'): Promise<void> {
  const claim = await keys.claim(scope, key, fingerprint(key));
  if (!isHeld(claim)) throw new Error(`expected to hold ${key}, got ${claim.kind}`);
  await keys.runEffect(claim, (tx) => insertEffect(tx, env.schema, { scope, key, fence: claim.fence, worker }));
}

describe('named prepared statements', () => {
  it('the claim, BEGIN, the fenced completion and COMMIT are parsed once per connection: later jobs send their names only', async () => {
    const keys = new IdempotencyKeys({ db: onePostgresConnection(), schema: env.schema, leaseMs: 30_000 });
    const first = await parsesDuring(() => runJob(keys, 'once-0'));
    const named = first.filter((p) => p.name !== '');
    expect(named.map((p) => p.text)).toEqual([
      expect.stringMatching(/^select \* from "[^"]+"\."claim_key"\(/),
      'begin isolation level read committed',
      expect.stringMatching(/^select "[^"]+"\.complete_key\(/),
      'commit',
    ]);
    // The effect's own statement is the job's: unnamed.
    expect(first.filter((p) => p.name === '').map((p) => p.text)).toEqual([expect.stringMatching(/^insert into/)]);
    const later = await parsesDuring(async () => {
      for (let n = 1; n <= 4; n++) await runJob(keys, `once-${n}`);
    });
    expect(later.filter((p) => p.name !== '')).toEqual([]);
    for (let n = 0; n <= 4; n++) {
      expect(await effectsOf(env.db, env.schema, scope, `once-${n}`)).toHaveLength(1);
      expect((await keys.get(scope, `once-${n}`))?.status).toBe('completed');
    }
  });

  it('a statement that failed right after its Parse (a completion whose lease was lost) is closed and parsed again: the next job completes', async () => {
    const keys = new IdempotencyKeys({ db: onePostgresConnection(), schema: env.schema, leaseMs: 30_000 });
    // The first completion on this connection parses complete_key and fails: the key was taken over.
    const claim = await keys.claim(scope, 'lost-1', fingerprint('lost-1'));
    if (!isHeld(claim)) throw new Error('expected to hold lost-1');
    await expireLease(env.db, env.schema, scope, 'lost-1');
    const other = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000 });
    expect((await other.claim(scope, 'lost-1', fingerprint('lost-1'))).kind).toBe('taken-over');
    await expect(keys.runEffect(claim, (tx) => insertEffect(tx, env.schema, { scope, key: 'lost-1', fence: claim.fence, worker: 'zombie' }))).rejects.toBeInstanceOf(LeaseLostError);
    // The next completion on the same connection: complete_key's name may exist there or not.
    await runJob(keys, 'lost-2');
    expect(await effectsOf(env.db, env.schema, scope, 'lost-1')).toHaveLength(0);
    expect(await effectsOf(env.db, env.schema, scope, 'lost-2')).toHaveLength(1);
    expect((await keys.get(scope, 'lost-2'))?.status).toBe('completed');
  });

  it('a prepared statement found gone (deallocated on the connection) is a store fault, nothing of it ran, and the pool names no statement from then on', async () => {
    const db = onePostgresConnection();
    const keys = new IdempotencyKeys({ db, schema: env.schema, leaseMs: 30_000 });
    await runJob(keys, 'gone-1');
    await sql`deallocate all`.execute(db);
    const error = await keys.claim(scope, 'gone-2', fingerprint('gone-2')).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(StoreUnavailableError);
    expect(((error as Error).cause as Error).name).toBe('PreparedStatementLostError');
    expect(await keys.get(scope, 'gone-2')).toBeUndefined();
    const after = await parsesDuring(() => runJob(keys, 'gone-2'));
    expect(after.length).toBeGreaterThan(0);
    expect(after.filter((p) => p.name !== '')).toEqual([]);
    expect(await effectsOf(env.db, env.schema, scope, 'gone-2')).toHaveLength(1);
  });

  it('preparedStatements: false sends every statement unnamed', async () => {
    const keys = new IdempotencyKeys({ db: onePostgresConnection(false), schema: env.schema, leaseMs: 30_000 });
    const parses = await parsesDuring(async () => {
      await runJob(keys, 'unnamed-1');
      await runJob(keys, 'unnamed-2');
    });
    expect(parses.length).toBeGreaterThanOrEqual(8);
    expect(parses.filter((p) => p.name !== '')).toEqual([]);
  });

  it('PG_PREPARED_STATEMENTS: as set; unset, on unless DATABASE_DIRECT_URL names another server (a pooler at DATABASE_URL)', () => {
    const postgres = 'postgres://postgres@127.0.0.1:5432/app';
    const pooler = 'postgres://postgres@127.0.0.1:6432/app';
    expect(preparedStatementsOverDatabaseUrl({ DATABASE_URL: postgres, DATABASE_DIRECT_URL: undefined, PG_PREPARED_STATEMENTS: undefined })).toBe(true);
    expect(preparedStatementsOverDatabaseUrl({ DATABASE_URL: postgres, DATABASE_DIRECT_URL: postgres, PG_PREPARED_STATEMENTS: undefined })).toBe(true);
    expect(preparedStatementsOverDatabaseUrl({ DATABASE_URL: pooler, DATABASE_DIRECT_URL: postgres, PG_PREPARED_STATEMENTS: undefined })).toBe(false);
    expect(preparedStatementsOverDatabaseUrl({ DATABASE_URL: pooler, DATABASE_DIRECT_URL: postgres, PG_PREPARED_STATEMENTS: true })).toBe(true);
    expect(preparedStatementsOverDatabaseUrl({ DATABASE_URL: postgres, DATABASE_DIRECT_URL: undefined, PG_PREPARED_STATEMENTS: false })).toBe(false);
  });
});
