/**
 * Kysely over a node-postgres pool whose connections answer a string of several statements with
 * the last statement's result. Kept apart from `create-postgres-db.ts` so that the public
 * declaration files never name `pg`'s types: `pg` ships none, and `@types/pg` is only a
 * development dependency, so a strict consumer without `skipLibCheck` would fail on them.
 */
import { Kysely, PostgresDialect, type PostgresPool, type PostgresPoolClient } from 'kysely';
import type pg from 'pg';
import { transientStoreFault } from './pg-errors.js';

const ROLLBACK = /^\s*rollback\s*;?\s*$/i;

/** Kysely instances made by {@link kyselyOverPool} (so by `createPostgresDb`): their connections answer multi-statement strings with the last statement's result. */
const lastResultDbs = new WeakSet<Kysely<any>>();

/**
 * True when `db` was made by {@link kyselyOverPool} (as `createPostgresDb` does), so a simple-protocol string of several
 * statements returns the LAST statement's rows through Kysely (as psql shows them). Group
 * commit then sends a job's SAVEPOINT in the same round trip as the job's first statement;
 * with any other Kysely instance it sends them one after the other.
 */
export function returnsLastResult(db: Kysely<any>): boolean {
  return lastResultDbs.has(db);
}

/**
 * A Kysely instance over an existing node-postgres pool whose connections answer a string of
 * statements with the last statement's result (see {@link returnsLastResult}).
 */
export function kyselyOverPool(pool: pg.Pool): Kysely<any> {
  const db = new Kysely<any>({ dialect: new PostgresDialect({ pool: lastResultPool(pool) }) });
  lastResultDbs.add(db);
  return db;
}

/**
 * The pool as Kysely sees it, except that a string of several statements resolves with the last
 * statement's result (node-postgres resolves with an array of them, which Kysely would read as
 * no rows). A single statement's result is untouched.
 */
function lastResultPool(pool: pg.Pool): PostgresPool {
  return {
    async connect(): Promise<PostgresPoolClient> {
      const client = await pool.connect();
      let broken = false;
      return {
        query: ((text: unknown, parameters?: readonly unknown[]) => {
          if (typeof text !== 'string') return client.query(text as any);
          const sent = client.query(text, parameters as unknown[]).then((result: pg.QueryResult | pg.QueryResult[]) =>
            Array.isArray(result) ? result[result.length - 1] : result,
          );
          if (!ROLLBACK.test(text)) return sent;
          // A ROLLBACK on a connection that broke fails with "Client has encountered a
          // connection error and is not queryable", and Kysely's `db.transaction()` would throw
          // that instead of the error that ended the transaction (the handler's own, or the
          // statement's 57P01). There is nothing left to roll back: the server aborts a
          // transaction whose session ends. So it counts as done, and the client is destroyed.
          return sent.catch((error: unknown) => {
            if (transientStoreFault(error) !== 'connection') throw error;
            broken = true;
            return { command: 'ROLLBACK', rowCount: null, rows: [] };
          });
        }) as PostgresPoolClient['query'],
        release: (destroy?: boolean) => client.release(destroy || broken),
      };
    },
    end: () => pool.end(),
  };
}
