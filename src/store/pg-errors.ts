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
 * Errors after which the same call may succeed on another connection or later: the backend
 * was terminated (57P01, 57P02, 57P03), the connection broke (08xxx), a serialization or
 * deadlock failure (40001, 40P01). Plain network errors from the driver have no SQLSTATE.
 */
export function isTransientStoreError(error: unknown): boolean {
  const state = sqlStateOf(error);
  if (state === undefined) {
    return error instanceof Error && /Connection terminated|ECONNRESET|ECONNREFUSED|EPIPE|timeout/i.test(error.message);
  }
  return state.startsWith('08') || ['57P01', '57P02', '57P03', '40001', '40P01'].includes(state);
}
