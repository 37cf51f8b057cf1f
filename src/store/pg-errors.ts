/**
 * SQLSTATE handling: the only place that knows Postgres error codes. Everything above the
 * store sees the library's typed errors instead.
 */

/** The SQLSTATE of a node-postgres error, if it is one. */
export function sqlStateOf(error: unknown): string | undefined {
  if (error && typeof error === 'object' && 'code' in error) {
    const code = (error as { code: unknown }).code;
    if (typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) return code;
  }
  return undefined;
}

/** 55P03: `lock_timeout` expired while waiting on another transaction's row or index entry. */
export const isLockTimeout = (error: unknown) => sqlStateOf(error) === '55P03';

/**
 * 25P02 in_failed_sql_transaction: a statement of the transaction failed earlier (and its error
 * was caught), so Postgres refuses every later one and rolls the transaction back at COMMIT.
 */
export const isInFailedTransaction = (error: unknown) => sqlStateOf(error) === '25P02';

/**
 * 53100 disk_full: a file of the database could not grow ("could not extend file", "No space
 * left on device"). Reads still work, and so does a write that fits in pages already there.
 */
export const isDiskFull = (error: unknown) => sqlStateOf(error) === '53100';

/** 23505: a unique index refused a row. */
export const isUniqueViolation = (error: unknown) => sqlStateOf(error) === '23505';

/**
 * JSON that Postgres `jsonb` refuses although JavaScript accepted it: `\u0000` in a string
 * (22P05 untranslatable_character) or other invalid text (22021, 22P02).
 */
export const isUnstorableJson = (error: unknown) => ['22P05', '22021', '22P02'].includes(sqlStateOf(error) ?? '');

/**
 * 25006 read_only_sql_transaction: a write reached a server that takes none — a standby, or a
 * primary that a failover demoted while connections to it stayed open. The connection will
 * answer the same until it is replaced: the pool destroys it (see `createPostgresDb`).
 */
export const isReadOnlyServer = (error: unknown) => sqlStateOf(error) === '25006';

/**
 * Why a store error is transient, if it is:
 * - `'connection'`: the connection was refused, reset or terminated (a restart, a failover, an
 *   administrator's `pg_terminate_backend`), the server was out of connections or resources, or
 *   it took no writes (a failover still routing to the demoted primary);
 * - `'conflict'`: a serialization failure or a deadlock (the transaction may simply run again);
 * - `'timeout'`: a lock or statement timeout.
 */
export type TransientFault = 'connection' | 'conflict' | 'timeout';

// Driver errors without a SQLSTATE: node's socket errors (their `code`), postgres.js's codes for a
// connection that closed, ended, was destroyed or could not be made in time (a data layer's
// driver, see `data-layer.ts`), and node-postgres's own messages when a connection breaks,
// cannot be made, or is used after it broke.
const NETWORK_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EPIPE',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EAI_AGAIN',
  'ENOTFOUND',
  'CONNECTION_CLOSED',
  'CONNECTION_ENDED',
  'CONNECTION_DESTROYED',
  'CONNECT_TIMEOUT',
]);
const CONNECTION_MESSAGES =
  /Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error|Client was closed and is not queryable|Connection (?:ended|closed) unexpectedly|terminating connection|Query read timeout/i;

/**
 * Class 53, insufficient resources, decided code by code: the server ran out of something that
 * comes back (53000 insufficient_resources, 53100 disk_full, 53200 out_of_memory, 53300
 * too_many_connections). 53400 configuration_limit_exceeded is not among them: a statement over
 * a configured limit meets it again on every run, so it is the job's error.
 */
const RESOURCE_FAULTS = new Set(['53000', '53100', '53200', '53300']);

/** Severities with which the server ends the session after its error message. */
const SESSION_ENDING = new Set(['FATAL', 'PANIC']);

/**
 * Classifies a store error: after a transient one the same call may succeed on another
 * connection or later, and nothing about the key or the job is wrong. SQLSTATEs: 08xxx
 * (connection exception; 08P01 protocol violation only when the server ended the session for
 * it, see below), 53000-53300 (out of resources, disk, memory or connections; not 53400),
 * 57P01-57P03 (admin shutdown, crash shutdown, cannot connect now), 25006 (a server taking no
 * writes), 40001/40P01 (serialization failure, deadlock), 55P03/57014 (lock timeout, statement
 * timeout or cancel). Undefined: not transient.
 *
 * 08P01 with severity ERROR leaves the connection as it was: the server refused one message (a
 * NUL inside a simple-protocol string is one) and would refuse it again, so it is the statement's
 * error, never a fault to wait out. With FATAL (a broken message stream, PgBouncer dropping a
 * client) the session is gone, and a new connection may well succeed.
 */
export function transientStoreFault(error: unknown): TransientFault | undefined {
  if (error instanceof PreparedStatementLostError) return 'connection';
  const code = error && typeof error === 'object' && 'code' in error ? (error as { code: unknown }).code : undefined;
  if (typeof code === 'string' && NETWORK_CODES.has(code)) return 'connection';
  const state = sqlStateOf(error);
  if (state === undefined) {
    return error instanceof Error && CONNECTION_MESSAGES.test(error.message) ? 'connection' : undefined;
  }
  if (state === '08P01') return endsSession(error) ? 'connection' : undefined;
  if (state.startsWith('08') || RESOURCE_FAULTS.has(state) || ['57P01', '57P02', '57P03', '25006'].includes(state)) return 'connection';
  if (state === '40001' || state === '40P01') return 'conflict';
  if (state === '55P03' || state === '57014') return 'timeout';
  return undefined;
}

/**
 * A named prepared statement of the store's (see `named-statements.ts`) that its connection had
 * prepared was not there when used (26000 invalid_sql_statement_name), or one it was preparing
 * was there already (42P05 duplicate_prepared_statement): the server connection is not the
 * session this connection prepared on. A pooler in transaction mode that does not keep prepared
 * statements moved the client to another server connection, or shares one between clients; or
 * a statement of the job's deallocated it. Nothing of the statement ran. A fault of the
 * connection, not of the job: the job is deferred, the connection is not lent out again, and its
 * pool sends the store's statements unnamed from then on.
 */
export class PreparedStatementLostError extends Error {
  constructor(statementName: string, options: { cause: unknown }) {
    super(
      `the server connection did not hold the prepared statement ${statementName} as this connection had prepared it (${(options.cause as Error | undefined)?.message ?? 'no message'}): ` +
        'behind a pooler in transaction mode without prepared-statement support, turn prepared statements off (createPostgresDb preparedStatements: false, PG_PREPARED_STATEMENTS=false)',
      options,
    );
    this.name = 'PreparedStatementLostError';
  }
}

/** 26000 invalid_sql_statement_name: a Bind named a prepared statement the server connection does not have. */
export const isMissingPreparedStatement = (error: unknown) => sqlStateOf(error) === '26000';

/** 42P05 duplicate_prepared_statement: a Parse named a prepared statement the server connection has already. */
export const isDuplicatePreparedStatement = (error: unknown) => sqlStateOf(error) === '42P05';

/** True when the server sent `error` as FATAL or PANIC: it closes the session after it. */
export function endsSession(error: unknown): boolean {
  const severity = error && typeof error === 'object' && 'severity' in error ? (error as { severity: unknown }).severity : undefined;
  return typeof severity === 'string' && SESSION_ENDING.has(severity);
}

/**
 * True when a statement that failed with `error` may nonetheless have committed: the connection
 * broke before its reply arrived (a driver error without a SQLSTATE), or the server ended the
 * session (FATAL, PANIC), which it may do after the commit. A {@link PreparedStatementLostError}
 * never ran. An error the server answered with
 * severity ERROR (25006, 40001, 53100…) says the statement failed and kept nothing.
 */
export function outcomeUnknown(error: unknown): boolean {
  // A statement its connection no longer held as prepared never ran: known not to have committed.
  if (error instanceof PreparedStatementLostError) return false;
  if (transientStoreFault(error) !== 'connection') return false;
  return sqlStateOf(error) === undefined || endsSession(error);
}

/** True when {@link transientStoreFault} classifies `error` as transient (any kind). */
export const isTransientStoreError = (error: unknown): boolean => transientStoreFault(error) !== undefined;
