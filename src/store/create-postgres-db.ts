import { Kysely, PostgresDialect, type PostgresPool, type PostgresPoolClient } from 'kysely';
import pg from 'pg';
import { transientStoreFault } from './pg-errors.js';

const ROLLBACK = /^\s*rollback\s*;?\s*$/i;

/** Kysely instances made by {@link createPostgresDb}: their connections answer multi-statement strings with the last statement's result. */
const lastResultDbs = new WeakSet<Kysely<any>>();

/**
 * True when `db` was made by {@link createPostgresDb}, so a simple-protocol string of several
 * statements returns the LAST statement's rows through Kysely (as psql shows them). Group
 * commit then sends a job's SAVEPOINT in the same round trip as the job's first statement;
 * with any other Kysely instance it sends them one after the other.
 */
export function returnsLastResult(db: Kysely<any>): boolean {
  return lastResultDbs.has(db);
}

/** Options for {@link createPostgresDb}. */
export interface PostgresDbOptions {
  /** libpq-style URL, e.g. `postgres://user@host:5432/db`. */
  readonly connectionString: string;
  /**
   * Pool size. Size it to the worker's concurrency plus one for heartbeats.
   * @defaultValue `10`
   */
  readonly maxConnections?: number;
  /** Shown in `pg_stat_activity.application_name`. @defaultValue `'idempotent-jobs'` */
  readonly applicationName?: string;
}

/**
 * A Kysely instance over a node-postgres pool whose sessions start at read committed (see
 * {@link READ_COMMITTED_SESSION}). Connection errors (a terminated backend, a
 * restarted server) never crash the process: on an idle connection they are logged by the
 * pool's owner; on a lent-out one they fail its statement. Either way the pool drops the
 * client and opens a new one on the next query.
 */
export function createPostgresDb(options: PostgresDbOptions, onPoolError?: (error: Error) => void): Kysely<any> {
  const pool = new pg.Pool({
    ...pinnedToReadCommitted(options.connectionString),
    max: options.maxConnections ?? 10,
    application_name: options.applicationName ?? 'idempotent-jobs',
  });
  pool.on('error', (error) => onPoolError?.(error));
  // While a client is lent out (a transaction, a query), the pool has no 'error' listener on
  // it: a backend terminated between two statements would emit an unheard 'error' and crash
  // the process. The error also fails the client's current or next statement, which the
  // caller sees, and the pool discards the broken client when it is released.
  pool.on('connect', (client) => client.on('error', () => {}));
  return kyselyOverPool(pool);
}

/**
 * The startup option (libpq's `options`: command-line switches for the server, where a space
 * inside a value is escaped with a backslash) that sets every session's default isolation to
 * read committed. The claim protocol relies on it: a duplicate claim waits on the key's index
 * entry, then sees the committed row, where serializable would fail it with 40001. The store's
 * own transactions say so in their BEGIN; this also covers its single-statement (autocommit)
 * claims and updates, under a server, database or role whose default is stricter, at no extra
 * round trip. A startup option outranks `ALTER DATABASE/ROLE … SET`.
 */
export const READ_COMMITTED_SESSION = '-c default_transaction_isolation=read\\ committed';

/**
 * The connection settings with {@link READ_COMMITTED_SESSION} added. node-postgres lets a
 * connection string's own `options` parameter override the `options` setting, so when the URL
 * has one, the pin is appended to it there (last, so that it wins).
 */
function pinnedToReadCommitted(connectionString: string): { connectionString: string; options?: string } {
  const url = URL.canParse(connectionString) ? new URL(connectionString) : undefined;
  const own = url?.searchParams.get('options');
  if (!url || !own) return { connectionString, options: READ_COMMITTED_SESSION };
  url.searchParams.set('options', `${own} ${READ_COMMITTED_SESSION}`);
  return { connectionString: url.toString() };
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
