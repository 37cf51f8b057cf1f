/**
 * Kysely over a node-postgres pool whose connections answer a string of several statements with
 * the last statement's result. Kept apart from `create-postgres-db.ts` so that the public
 * declaration files never name `pg`'s types: `pg` ships none, and `@types/pg` is only a
 * development dependency, so a strict consumer without `skipLibCheck` would fail on them.
 */
import { CompiledQuery, Kysely, PostgresDialect, type PostgresPool, type PostgresPoolClient, type QueryResult } from 'kysely';
import type pg from 'pg';
import { transientStoreFault } from './pg-errors.js';

const ROLLBACK = /^\s*rollback\s*;?\s*$/i;

/**
 * Ends a string whose caller wants every statement's result (see {@link everyResultQuery}): a
 * comment after the last statement, which Postgres ignores (it makes no statement of its own).
 */
const EVERY_RESULT = '\n/* idempotent-jobs: every result */';

/** One statement's result in a string of several, as node-postgres gives it. */
export interface StatementResult {
  readonly command: string | null;
  readonly rowCount: number | null;
  readonly rows: unknown[];
}

/**
 * `statements` as one simple-protocol string whose result, on a connection of
 * {@link kyselyOverPool}, carries every statement's result, in order ({@link statementResults}).
 * Only for instances where {@link returnsLastResult} is true.
 */
export function everyResultQuery(statements: readonly string[]): CompiledQuery {
  return CompiledQuery.raw(statements.join(';\n') + EVERY_RESULT);
}

/** The results of an {@link everyResultQuery}, one per statement (a statement that was empty has none). */
export function statementResults(result: QueryResult<unknown>): StatementResult[] {
  return result.rows as StatementResult[];
}

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
          if (text.endsWith(EVERY_RESULT)) {
            // Kysely hands `rows` through as they come: here, every statement's result.
            return client.query(text).then((result: pg.QueryResult | pg.QueryResult[]) => ({
              command: null,
              rowCount: null,
              rows: Array.isArray(result) ? result : [result],
            }));
          }
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
