import { Migrator, sql, type Kysely, type MigrationResultSet } from 'kysely';
import { migrationsFor } from './migrations.js';
import { sqlStateOf } from './pg-errors.js';

/** Options for {@link migrate}. */
export interface MigrateOptions {
  /**
   * Schema to create the tables in.
   * @defaultValue `'idempotent_jobs'`
   */
  readonly schema?: string;
}

// An arbitrary, fixed advisory-lock key ("idem" in ASCII) shared by every process that migrates.
const MIGRATION_LOCK_KEY = 0x6964656d;
const MAX_ATTEMPTS = 5;

/**
 * Kysely's Migrator looks for its tables by listing every table of the database; when another
 * schema is dropped at that moment (another application's, a test's), the listing fails with
 * "schema … does not exist" (3F000) for that other schema. Nothing was applied then: look again.
 */
function isOtherSchemaVanishing(error: unknown, schema: string): boolean {
  return sqlStateOf(error) === '3F000' && !String((error as Error).message).includes(`"${schema}"`);
}

/**
 * Creates or upgrades the idempotency tables. Safe when many processes run it at once: they
 * queue on one session-level advisory lock, so `create schema` and Kysely's own migration
 * table setup never race (both can fail with a unique violation when run concurrently).
 * The lock is a session's, so `db` must reach Postgres itself, not a transaction-mode pooler
 * (the worker processes use `DATABASE_DIRECT_URL` for it).
 *
 * @example
 * ```ts
 * await migrate(db, { schema: 'idempotent_jobs' });
 * ```
 */
export async function migrate(db: Kysely<any>, options: MigrateOptions = {}): Promise<MigrationResultSet> {
  const schema = options.schema ?? 'idempotent_jobs';
  return db.connection().execute(async (conn) => {
    await sql`select pg_advisory_lock(${MIGRATION_LOCK_KEY}, hashtext(${schema}))`.execute(conn);
    try {
      await sql`create schema if not exists ${sql.id(schema)}`.execute(conn);
      const migrator = new Migrator({
        db: conn,
        provider: { getMigrations: async () => migrationsFor(schema) },
        migrationTableSchema: schema,
        migrationTableName: 'idempotent_jobs_migration',
        migrationLockTableName: 'idempotent_jobs_migration_lock',
      });
      for (let attempt = 1; ; attempt++) {
        const resultSet = await migrator.migrateToLatest();
        if (!resultSet.error) return resultSet;
        if (attempt >= MAX_ATTEMPTS || !isOtherSchemaVanishing(resultSet.error, schema)) throw resultSet.error;
      }
    } finally {
      await sql`select pg_advisory_unlock(${MIGRATION_LOCK_KEY}, hashtext(${schema}))`.execute(conn);
    }
  });
}
