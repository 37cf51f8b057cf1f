import { sql, type Kysely } from 'kysely';
import type { Logger } from 'pino';
import { defaultLogger } from '../default-logger.js';
import { shownAddress, startupWaitMs, waitForService } from '../service-unreachable.js';
import { isTransientStoreError } from './pg-errors.js';

/** Where each database made by `createPostgresDb` connects, as an error may show it (no password). */
const addresses = new WeakMap<Kysely<any>, string>();

/** Records where `db` connects, for the start's error. */
export function rememberAddress(db: Kysely<any>, connectionString: string): void {
  addresses.set(db, shownAddress(connectionString));
}

/**
 * Resolves once Postgres answers on `db`. A server that refuses connections or is starting up
 * is waited for, one warning line per try, for `STARTUP_WAIT_MS` (default 60 s); then a
 * `ServiceUnreachableError` naming Postgres and its address. Any other error (a wrong password,
 * a missing database) is thrown at once: waiting cannot fix it.
 */
export async function waitForPostgres(db: Kysely<any>, logger: Logger = defaultLogger()): Promise<void> {
  await waitForService(() => sql`select 1`.execute(db), {
    service: 'Postgres',
    address: addresses.get(db) ?? 'the database given',
    deadline: Date.now() + startupWaitMs(),
    logger,
    retryable: isTransientStoreError,
  });
}
