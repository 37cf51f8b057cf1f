/**
 * A Postgres connection that dies while it is lent out (its backend terminated in the middle of
 * a transaction) must fail that transaction, not the process: `pg_terminate_backend` between
 * two statements of a transaction makes node-postgres emit 'error' on a Client, and one nobody
 * listens to crashes the worker process (the chaos suite's `pg-terminate` fault, docs/chaos.md).
 */
import { sql, type Kysely } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresDb } from '../src/index.js';
import { transientStoreFault } from '../src/store/pg-errors.js';
import { waitFor } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let db: Kysely<any>;

beforeAll(async () => {
  env = await createTestEnv('pgdb');
});
afterAll(async () => {
  await db?.destroy();
  await env?.teardown();
});

it('survives a backend terminated between two statements of a transaction, and keeps working', async () => {
  const poolErrors: Error[] = [];
  db = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 2, applicationName: 'test:pgdb' }, (e) => poolErrors.push(e));
  const uncaught: unknown[] = [];
  const onUncaught = (error: unknown) => uncaught.push(error);
  process.on('uncaughtException', onUncaught);
  try {
    const failed = db.transaction().execute(async (tx) => {
      const { rows } = await sql<{ pid: number }>`select pg_backend_pid() as pid`.execute(tx);
      const pid = rows[0]!.pid;
      await sql`select pg_terminate_backend(${pid}::int)`.execute(env.db);
      // Let the backend's FATAL message and the socket's end arrive while no statement runs.
      await waitFor('the backend to be gone', async () => {
        const { rows: left } = await sql`select 1 from pg_stat_activity where pid = ${pid}::int`.execute(env.db);
        return left.length === 0;
      });
      await new Promise((resolve) => setTimeout(resolve, 100));
      await sql`select 1`.execute(tx);
    });
    await expect(failed).rejects.toThrow();
    expect(uncaught).toEqual([]);
    // The broken client was discarded: the next statement gets a fresh connection.
    const { rows } = await sql<{ one: number }>`select 1 as one`.execute(db);
    expect(rows[0]!.one).toBe(1);
  } finally {
    process.off('uncaughtException', onUncaught);
  }
});

describe('a transaction whose connection broke', () => {
  let brokenDb: Kysely<any>;
  beforeAll(() => {
    brokenDb = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 2, applicationName: 'test:pgdb-broken' }, () => {});
  });
  afterAll(async () => {
    await brokenDb?.destroy();
  });

  /** Runs `body` in `db.transaction()` after this transaction's own backend was terminated and is gone. */
  function afterOwnBackendTerminated(body: (tx: Kysely<any>) => Promise<void>): Promise<void> {
    return brokenDb.transaction().execute(async (tx) => {
      const { rows } = await sql<{ pid: number }>`select pg_backend_pid() as pid`.execute(tx);
      const pid = rows[0]!.pid;
      await sql`select pg_terminate_backend(${pid}::int)`.execute(env.db);
      await waitFor('the backend to be gone', async () => {
        const { rows: left } = await sql`select 1 from pg_stat_activity where pid = ${pid}::int`.execute(env.db);
        return left.length === 0;
      });
      await new Promise((resolve) => setTimeout(resolve, 100)); // the FATAL message and the socket's end arrive
      await body(tx);
    });
  }

  it('fails its next statement with an error classified as a transient connection fault', async () => {
    const failure = afterOwnBackendTerminated(async (tx) => {
      await sql`select 1`.execute(tx);
    });
    const error = await failure.then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(String(error)).toMatch(/Client has encountered a connection error and is not queryable/);
    expect(transientStoreFault(error)).toBe('connection');
  });

  it("throws the error that ended it, not the failed ROLLBACK's, and the pool recovers", async () => {
    class HandlerError extends Error {}
    const thrown = new HandlerError('the handler gave up');
    await expect(
      afterOwnBackendTerminated(async () => {
        throw thrown;
      }),
    ).rejects.toBe(thrown);
    const { rows } = await sql<{ one: number }>`select 1 as one`.execute(brokenDb);
    expect(rows[0]!.one).toBe(1);
  });
});

describe('option values', () => {
  it('refuses a value of the wrong kind, naming the option (node-postgres left queries waiting for ever under a negative or fractional pool size, put no bound under a string, and took NaN or 0 for 10)', () => {
    const connectionString = env.databaseUrl;
    for (const maxConnections of [Number.NaN, 0, -1, 1.5, Infinity, '4']) {
      expect(() => createPostgresDb({ connectionString, maxConnections: maxConnections as number }), String(maxConnections)).toThrow(
        expect.objectContaining({ name: 'ValidationError', field: 'maxConnections' }),
      );
    }
    for (const bad of [undefined, '', '  ', 42]) {
      expect(() => createPostgresDb({ connectionString: bad as string }), String(bad)).toThrow(expect.objectContaining({ name: 'ValidationError', field: 'connectionString' }));
    }
    expect(() => createPostgresDb({ connectionString, applicationName: 7 as unknown as string })).toThrow(expect.objectContaining({ field: 'applicationName' }));
    expect(() => createPostgresDb({ connectionString, preparedStatements: 'false' as unknown as boolean })).toThrow(expect.objectContaining({ field: 'preparedStatements' }));
  });

  it('takes every well-formed value', async () => {
    const db = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 1, applicationName: 'options-test', preparedStatements: false });
    try {
      expect((await sql<{ one: number }>`select 1 as one`.execute(db)).rows).toEqual([{ one: 1 }]);
    } finally {
      await db.destroy();
    }
  });
});
