import { CompiledQuery } from 'kysely';
import pg from 'pg';

/**
 * Which server, database and keys table a connection reaches, for the check that a data layer's
 * transaction and the keys meet in one database (`../foreign-transaction.ts`). The server is
 * told by its system identifier where the role may read it (`pg_control_system()` is granted
 * to superusers and `pg_monitor` by default; the CASE keeps others from an error that would
 * abort the transaction), else by its start time; the database by its oid; the keys'
 * table by the oid its qualified name resolves to (null when the table cannot be seen). One
 * read of catalogs, no lock taken.
 */
export function databaseIdentityStatement(schema: string): CompiledQuery {
  return CompiledQuery.raw(
    `select case when has_function_privilege('pg_control_system()', 'execute')
                 then (select system_identifier::text from pg_control_system()) end as system_identifier,
            pg_postmaster_start_time()::text as started_at,
            current_database() as database,
            (select oid::text from pg_database where datname = current_database()) as database_oid,
            to_regclass($1)::oid::text as keys_table`,
    [`${pg.escapeIdentifier(schema)}.idempotency_keys`],
  );
}

/** A row of {@link databaseIdentityStatement}. */
export interface DatabaseIdentity {
  readonly system_identifier: string | null;
  readonly started_at: string;
  readonly database: string;
  readonly database_oid: string;
  readonly keys_table: string | null;
}
