import { Migrator, sql, type Kysely, type MigrationResultSet } from 'kysely';
import { ConfigError } from '../errors.js';
import { migrationsFor } from './migrations.js';
import { sqlStateOf } from './pg-errors.js';
import { keysTableLayout } from './sql/keys-table-layout.js';
import { waitForPostgres } from './postgres-start-wait.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** Options for {@link migrate}. */
export interface MigrateOptions {
  /**
   * Schema to create the tables in.
   * @defaultValue `'idempotent_jobs'`
   */
  readonly schema?: string;
  /**
   * Hash partitions of the keys table (2-1024), or 0 for one plain table. Applies when the
   * migrations create the table; against an existing table it must match that table's layout,
   * else migrate throws a {@link ConfigError} and changes nothing (it never converts a table:
   * see docs/operations.md, "A partitioned keys table"). Unset: a new table is plain, an existing
   * one is used as it is.
   * @defaultValue `undefined`
   */
  readonly keysPartitions?: number;
}

/** Most hash partitions migrate creates: more only adds planning and locking per statement. */
export const MAX_KEYS_PARTITIONS = 1024;

// An arbitrary, fixed advisory-lock key ("idem" in ASCII) shared by every process that migrates.
const MIGRATION_LOCK_KEY = 0x6964656d;
const MAX_ATTEMPTS = 5;

/**
 * Kysely's Migrator looks for its tables by listing every table of the database; when another
 * schema is dropped at that moment (another application's, a test's), the listing fails for
 * that other schema: "schema … does not exist" (3F000), or "relation "<schema>.<table>" does
 * not exist" (42P01, from `pg_get_serial_sequence` on a table dropped under it); and when
 * another schema's table loses a column at that moment (its own migration), `column "…" of
 * relation "…" does not exist` (42703), which names no schema. Nothing was applied then: look
 * again. An error naming our own schema is not this; nor is one that a migration of ours threw
 * (Kysely then reports which migrations ran, `results`).
 */
function isOtherSchemaChanging(resultSet: MigrationResultSet, schema: string): boolean {
  const { error } = resultSet;
  const state = sqlStateOf(error);
  const message = String((error as Error).message);
  const namesOurs = message.includes(`"${schema}"`) || message.includes(`"${schema}.`);
  if (namesOurs) return false;
  return state === '3F000' || state === '42P01' || (state === '42703' && resultSet.results === undefined);
}

/**
 * Creates or upgrades the idempotency tables. Safe when many processes run it at once: they
 * queue on one session-level advisory lock, so `create schema` and Kysely's own migration
 * table setup never race (both can fail with a unique violation when run concurrently).
 * The lock is a session's, so `db` must reach Postgres itself, not a transaction-mode pooler
 * (the worker processes use `DATABASE_DIRECT_URL` for it).
 *
 * Postgres refusing connections or starting up is waited for first, one warning line per try,
 * for `STARTUP_WAIT_MS` (default 60 s); then it throws a `ServiceUnreachableError` naming
 * Postgres and its address (without password).
 *
 * Resolves to Kysely's result set (which migrations ran, none when up to date). Throws the
 * error of a migration that failed, and a {@link ConfigError} for a `keysPartitions` out of
 * range or different from an existing keys table's layout.
 *
 * @example
 * ```ts
 * import { migrate } from 'idempotent-jobs';
 *
 * // At start, on a connection to Postgres itself (the advisory lock needs a session).
 * await migrate(db, { schema: 'idempotent_jobs' });
 * ```
 */
export async function migrate(db: Kysely<any>, options: MigrateOptions = {}): Promise<MigrationResultSet> {
  refuseUnknownOptions(options, optionNames<MigrateOptions>()(['schema', 'keysPartitions']), 'migrate(db, options)');
  await waitForPostgres(db);
  return migrateSchema(db, options);
}

/**
 * {@link migrate} without its wait for Postgres: for the runnables, which wait for every
 * server of their start against one deadline of their own.
 */
export async function migrateSchema(db: Kysely<any>, options: MigrateOptions = {}): Promise<MigrationResultSet> {
  const schema = options.schema ?? 'idempotent_jobs';
  const { keysPartitions } = options;
  if (keysPartitions !== undefined && !isValidPartitionCount(keysPartitions)) {
    throw new ConfigError(`keysPartitions (KEYS_PARTITIONS) must be 0 (one plain keys table) or an integer from 2 to ${MAX_KEYS_PARTITIONS}, got ${keysPartitions}.`);
  }
  return db.connection().execute(async (conn) => {
    await sql`select pg_advisory_lock(${MIGRATION_LOCK_KEY}, hashtext(${schema}))`.execute(conn);
    try {
      await sql`create schema if not exists ${sql.id(schema)}`.execute(conn);
      if (keysPartitions !== undefined) await refuseOtherKeysLayout(conn, schema, keysPartitions);
      const migrator = new Migrator({
        db: conn,
        provider: { getMigrations: async () => migrationsFor(schema, { keysPartitions }) },
        migrationTableSchema: schema,
        migrationTableName: 'idempotent_jobs_migration',
        migrationLockTableName: 'idempotent_jobs_migration_lock',
      });
      for (let attempt = 1; ; attempt++) {
        const resultSet = await migrator.migrateToLatest();
        if (!resultSet.error) return resultSet;
        if (attempt >= MAX_ATTEMPTS || !isOtherSchemaChanging(resultSet, schema)) throw resultSet.error;
      }
    } finally {
      await sql`select pg_advisory_unlock(${MIGRATION_LOCK_KEY}, hashtext(${schema}))`.execute(conn);
    }
  });
}

function isValidPartitionCount(n: number): boolean {
  return Number.isInteger(n) && (n === 0 || (n >= 2 && n <= MAX_KEYS_PARTITIONS));
}

/**
 * Throws when the schema already has a keys table laid out otherwise than `keysPartitions`
 * asks. Converting is left to an operator on purpose: it rewrites every row under an exclusive
 * lock, and migrate runs at every worker's start.
 */
async function refuseOtherKeysLayout(db: Kysely<any>, schema: string, keysPartitions: number): Promise<void> {
  const { exists, partitions } = await keysTableLayout(db, schema);
  if (!exists || partitions.length === keysPartitions) return;
  const has = partitions.length === 0 ? 'one plain (unpartitioned) keys table' : `a keys table in ${partitions.length} hash partitions`;
  const wants = keysPartitions === 0 ? 'one plain table' : `${keysPartitions} hash partitions`;
  throw new ConfigError(
    `Schema "${schema}" has ${has}, but keysPartitions (KEYS_PARTITIONS) asks for ${wants}. ` +
      'Migrations never convert an existing keys table (that rewrites every row under an exclusive lock while workers wait). ' +
      'Unset KEYS_PARTITIONS to use the table as it is, or convert it as docs/operations.md ("A partitioned keys table") describes.',
  );
}
