import { Migrator, sql, type Kysely, type MigrationResultSet } from 'kysely';
import { migrationsFor } from './migrations.js';

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

/**
 * Creates or upgrades the idempotency tables. Safe when many processes run it at once: they
 * queue on one session-level advisory lock, so `create schema` and Kysely's own migration
 * table setup never race (both can fail with a unique violation when run concurrently).
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
      const resultSet = await migrator.migrateToLatest();
      if (resultSet.error) throw resultSet.error;
      return resultSet;
    } finally {
      await sql`select pg_advisory_unlock(${MIGRATION_LOCK_KEY}, hashtext(${schema}))`.execute(conn);
    }
  });
}
