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

/** 23505: a unique index refused a row. */
export const isUniqueViolation = (error: unknown) => sqlStateOf(error) === '23505';

/**
 * JSON that Postgres `jsonb` refuses although JavaScript accepted it: `\u0000` in a string
 * (22P05 untranslatable_character) or other invalid text (22021, 22P02).
 */
export const isUnstorableJson = (error: unknown) => ['22P05', '22021', '22P02'].includes(sqlStateOf(error) ?? '');

/**
 * Why a store error is transient, if it is:
 * - `'connection'`: the connection was refused, reset or terminated (a restart, a failover, an
 *   administrator's `pg_terminate_backend`), or the server was out of connections or resources;
 * - `'conflict'`: a serialization failure or a deadlock (the transaction may simply run again);
 * - `'timeout'`: a lock or statement timeout.
 */
export type TransientFault = 'connection' | 'conflict' | 'timeout';

// Driver errors without a SQLSTATE: node's socket errors (their `code`) and node-postgres's own
// messages when a connection breaks, cannot be made, or is used after it broke.
const NETWORK_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN', 'ENOTFOUND']);
const CONNECTION_MESSAGES =
  /Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error|Client was closed and is not queryable|Connection (?:ended|closed) unexpectedly|terminating connection|Query read timeout/i;

/**
 * Classifies a store error: after a transient one the same call may succeed on another
 * connection or later, and nothing about the key or the job is wrong. SQLSTATEs: 08xxx
 * (connection exception), 53xxx (insufficient resources, e.g. too many connections), 57P01-57P03
 * (admin shutdown, crash shutdown, cannot connect now), 40001/40P01 (serialization failure,
 * deadlock), 55P03/57014 (lock timeout, statement timeout or cancel). Undefined: not transient.
 */
export function transientStoreFault(error: unknown): TransientFault | undefined {
  const code = error && typeof error === 'object' && 'code' in error ? (error as { code: unknown }).code : undefined;
  if (typeof code === 'string' && NETWORK_CODES.has(code)) return 'connection';
  const state = sqlStateOf(error);
  if (state === undefined) {
    return error instanceof Error && CONNECTION_MESSAGES.test(error.message) ? 'connection' : undefined;
  }
  if (state.startsWith('08') || state.startsWith('53') || ['57P01', '57P02', '57P03'].includes(state)) return 'connection';
  if (state === '40001' || state === '40P01') return 'conflict';
  if (state === '55P03' || state === '57014') return 'timeout';
  return undefined;
}

/** True when {@link transientStoreFault} classifies `error` as transient (any kind). */
export const isTransientStoreError = (error: unknown): boolean => transientStoreFault(error) !== undefined;
