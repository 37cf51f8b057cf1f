import type { Kysely } from 'kysely';
import { loadEnvConfig, preparedStatementsOverDatabaseUrl } from '../runtime/env-config.js';
import { explainDatabaseError } from '../runtime/database-problems.js';
import { createPostgresDb } from '../store/create-postgres-db.js';
import { PostgresOperatorStore, type OperatorStore } from '../store/operator-store.js';

/**
 * Opens a one-connection pool on $DATABASE_URL, runs `fn` with the operator store of $SCHEMA on
 * it (and the pool and schema, for the other stores), closes it. A
 * server that does not answer, a missing database or a schema never migrated fails with a
 * message naming the variable and the fix, not the driver's error.
 */
export async function withDatabase<T>(fn: (store: OperatorStore, db: Kysely<any>, schema: string) => Promise<T>): Promise<T> {
  const config = loadEnvConfig();
  const db = createPostgresDb({
    connectionString: config.DATABASE_URL,
    maxConnections: 1,
    applicationName: 'idempotent-jobs:cli',
    preparedStatements: preparedStatementsOverDatabaseUrl(config),
  });
  try {
    return await fn(new PostgresOperatorStore(db, config.SCHEMA), db, config.SCHEMA);
  } catch (error) {
    throw explainDatabaseError(error, { variable: 'DATABASE_URL', url: config.DATABASE_URL, schema: config.SCHEMA });
  } finally {
    await db.destroy();
  }
}
