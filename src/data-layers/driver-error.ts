/**
 * The driver's error inside a data layer's: ORMs wrap the error of node-postgres or postgres.js
 * (Drizzle's `DrizzleQueryError`, TypeORM's `QueryFailedError`, Prisma's driver-adapter errors)
 * and keep it in `cause`, `driverError` or `meta`. The first error along those links that
 * carries a SQLSTATE (`code` of five characters) or a socket error code (`ECONNRESET`, …) is the
 * driver's; when none does, `error` itself.
 */
export function unwrapDriverError(error: unknown): unknown {
  let current: unknown = error;
  for (let depth = 0; depth < 8 && current !== null && typeof current === 'object'; depth++) {
    if (carriesCode(current)) return current;
    const next = linkOf(current);
    if (next === undefined) break;
    current = next;
  }
  return error;
}

/**
 * A SQLSTATE (`57P01`), one of node's socket error codes (`ECONNRESET`) or one of postgres.js's
 * connection codes (`CONNECTION_CLOSED`). Prisma's own codes (`P2010`, "raw query failed") look
 * like a SQLSTATE but are not one (Postgres's only P class is P0, PL/pgSQL's): the driver's
 * error is further in.
 */
function carriesCode(error: object): boolean {
  const code = (error as { code?: unknown }).code;
  if (typeof code !== 'string' || /^P[1-9][0-9]{3}$/.test(code)) return false;
  return /^[0-9A-Z]{5}$/.test(code) || /^E[A-Z_]+$/.test(code) || /^CONNECT(ION)?_[A-Z_]+$/.test(code);
}

/** The wrapped error, by the name each data layer gives it. */
function linkOf(error: object): unknown {
  for (const name of ['driverError', 'cause', 'originalError']) {
    const value = (error as Record<string, unknown>)[name];
    if (value !== null && typeof value === 'object') return value;
  }
  return undefined;
}
