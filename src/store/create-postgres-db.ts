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
 * A Kysely instance over a node-postgres pool. Idle-connection errors (a terminated backend,
 * a restarted server) are logged by the pool's owner rather than crashing the process: the
 * pool drops the client and opens a new one on the next query.
 */
export function createPostgresDb(options: PostgresDbOptions, onPoolError?: (error: Error) => void): Kysely<any> {
  const pool = new pg.Pool({
    connectionString: options.connectionString,
    max: options.maxConnections ?? 10,
    application_name: options.applicationName ?? 'idempotent-jobs',
  });
  pool.on('error', (error) => onPoolError?.(error));
  return new Kysely<any>({ dialect: new PostgresDialect({ pool }) });
}
