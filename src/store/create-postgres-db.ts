import type { Kysely } from 'kysely';
import pg from 'pg';
import { kyselyOverPool } from './last-result-pool.js';

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
 * A Kysely instance over a node-postgres pool whose sessions start at read committed (a
 * startup option sets `default_transaction_isolation`, outranking a stricter database or role
 * default): the claim protocol relies on it, since a duplicate claim waits on the key's index
 * entry and then sees the committed row, where serializable would fail it. Connection errors (a
 * terminated backend, a restarted server) never crash the process: on an idle connection they
 * go to `onPoolError`; on a lent-out one they fail its statement. Either way the pool drops the
 * client and opens a new one on the next query. Close it with `db.destroy()`.
 *
 * @param onPoolError - told of errors on idle connections (log them); unset: they are dropped
 *
 * @example
 * ```ts
 * import { IdempotencyKeys, createPostgresDb } from 'idempotent-jobs';
 *
 * const db = createPostgresDb(
 *   { connectionString: 'postgres://app@127.0.0.1:5432/app', maxConnections: 10, applicationName: 'payments-worker' },
 *   (error) => console.warn('idle Postgres connection failed', error),
 * );
 * const keys = new IdempotencyKeys({ db });
 * // … on shutdown
 * await db.destroy();
 * ```
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
