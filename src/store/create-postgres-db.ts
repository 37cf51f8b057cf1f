import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';

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
 * A Kysely instance over a node-postgres pool. Connection errors (a terminated backend, a
 * restarted server) never crash the process: on an idle connection they are logged by the
 * pool's owner; on a lent-out one they fail its statement. Either way the pool drops the
 * client and opens a new one on the next query.
 */
export function createPostgresDb(options: PostgresDbOptions, onPoolError?: (error: Error) => void): Kysely<any> {
  const pool = new pg.Pool({
    connectionString: options.connectionString,
    max: options.maxConnections ?? 10,
    application_name: options.applicationName ?? 'idempotent-jobs',
  });
  pool.on('error', (error) => onPoolError?.(error));
  // While a client is lent out (a transaction, a query), the pool has no 'error' listener on
  // it: a backend terminated between two statements would emit an unheard 'error' and crash
  // the process. The error also fails the client's current or next statement, which the
  // caller sees, and the pool discards the broken client when it is released.
  pool.on('connect', (client) => client.on('error', () => {}));
  return new Kysely<any>({ dialect: new PostgresDialect({ pool }) });
}
