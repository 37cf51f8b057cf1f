import type { Kysely } from 'kysely';
import pg from 'pg';
import { kyselyOverPool } from './pipelining-pool.js';
import { isReadOnlyServer } from './pg-errors.js';
import { rememberAddress } from './postgres-start-wait.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';
import { ValidationError } from '../errors.js';

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
  /**
   * Send the store's hot statements (claims, fenced completions, BEGIN and COMMIT of an effect's
   * transaction) as named prepared statements, parsed and planned once per connection instead of
   * once per job. Set false behind a pooler in transaction mode that keeps no prepared
   * statements (PgBouncer before 1.21, or without `max_prepared_statements`). Should one be
   * found gone anyway, its job is deferred (a store fault) and the pool sends them unnamed from
   * then on.
   * @defaultValue `true`
   */
  readonly preparedStatements?: boolean;
}

const POSTGRES_DB_OPTION_NAMES = optionNames<PostgresDbOptions>()(['connectionString', 'maxConnections', 'applicationName', 'preparedStatements']);

/**
 * A Kysely instance over a node-postgres pool whose sessions start at read committed (a
 * startup option sets `default_transaction_isolation`, outranking a stricter database or role
 * default): the claim protocol relies on it, since a duplicate claim waits on the key's index
 * entry and then sees the committed row, where serializable would fail it. Connection errors (a
 * terminated backend, a restarted server) never crash the process: on an idle connection they
 * go to `onPoolError`; on a lent-out one they fail its statement. Either way the pool drops the
 * client and opens a new one on the next query. So does it with a connection whose server
 * refused a write as read-only (25006: a failover demoted it under the open connection), so the
 * next one reaches the new primary. Close it with `db.destroy()`.
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
  refuseUnknownOptions(options, POSTGRES_DB_OPTION_NAMES, 'createPostgresDb(options)');
  assertPostgresDbOptions(options);
  const pool = new PrimaryOnlyPool({
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
  const db = kyselyOverPool(pool, { preparedStatements: options.preparedStatements ?? true });
  rememberAddress(db, options.connectionString);
  return db;
}

/**
 * Refuses option values of the wrong kind with a {@link ValidationError} naming the option.
 * node-postgres takes a `maxConnections` as given: a negative or fractional one leaves queries
 * waiting for ever, a string is no bound at all (30 queries opened 30 connections), and NaN or 0
 * silently became its default of 10.
 */
function assertPostgresDbOptions(options: PostgresDbOptions): void {
  const refuse = (field: string, wanted: string, value: unknown) => {
    throw new ValidationError('INVALID_OPTIONS', field, `createPostgresDb(options): ${field} must be ${wanted}, not ${typeof value === 'string' ? JSON.stringify(value) : String(value)}.`);
  };
  if (typeof options.connectionString !== 'string' || options.connectionString.trim() === '') {
    refuse('connectionString', "a Postgres URL such as 'postgres://app@127.0.0.1:5432/app'", options.connectionString);
  }
  const { maxConnections, applicationName, preparedStatements } = options;
  if (maxConnections !== undefined && !(Number.isInteger(maxConnections) && maxConnections >= 1)) refuse('maxConnections', 'a whole number ≥ 1', maxConnections);
  if (applicationName !== undefined && typeof applicationName !== 'string') refuse('applicationName', 'a string', applicationName);
  if (preparedStatements !== undefined && typeof preparedStatements !== 'boolean') refuse('preparedStatements', 'true or false', preparedStatements);
}

/**
 * Connections whose server answered 25006 read_only_sql_transaction: a standby, or a primary
 * that a failover demoted while the connection stayed open (managed failovers often keep the old
 * primary's sessions alive as a replica's). Such a connection refuses every write until it is
 * replaced; kept in the pool, it would fail one job after another long after the failover ended.
 */
const answeredReadOnly = new WeakSet<pg.Client>();

/**
 * A node-postgres pool that destroys, at its release, a connection that answered 25006, rather
 * than lend it out again: the next connection goes to wherever the address leads now (the new
 * primary). The error itself reaches the caller as usual (a transient store fault: the job is
 * deferred). The answer is read from the protocol's error messages, so every statement counts,
 * whoever sent it.
 */
class PrimaryOnlyPool extends pg.Pool {
  constructor(config: pg.PoolConfig) {
    super(config);
    this.on('connect', (client) => {
      client.connection.on('errorMessage', (message: unknown) => {
        if (isReadOnlyServer(message)) answeredReadOnly.add(client);
      });
    });
  }

  override connect(): Promise<pg.PoolClient>;
  override connect(callback: (err: Error | undefined, client: pg.PoolClient | undefined, done: (release?: any) => void) => void): void;
  override connect(
    callback?: (err: Error | undefined, client: pg.PoolClient | undefined, done: (release?: any) => void) => void,
  ): Promise<pg.PoolClient> | void {
    if (!callback) return super.connect().then(destroyedIfReadOnly);
    super.connect((err, client, done) => {
      if (!client) return callback(err, client, done);
      destroyedIfReadOnly(client);
      callback(err, client, client.release);
    });
  }
}

/** `client`, whose release destroys it once it has answered 25006. */
function destroyedIfReadOnly(client: pg.PoolClient): pg.PoolClient {
  const release = client.release;
  client.release = (destroy?: Error | boolean) => release(destroy || answeredReadOnly.has(client));
  return client;
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
