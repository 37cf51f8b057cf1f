/**
 * The SQLSTATEs of a database set up wrong (beside pg-errors.ts, which classifies faults): a
 * database, a schema or a table that is not there, a login refused. The runnable processes and
 * the command line read them to say which variable to fix and what to run.
 */
import { sqlStateOf } from './pg-errors.js';

/**
 * The database a connection asked for and Postgres does not have (SQLSTATE 3D000,
 * invalid_catalog_name: `database "x" does not exist`), read from the error; else undefined.
 */
export function missingDatabaseOf(error: unknown): string | undefined {
  if (sqlStateOf(error) !== '3D000') return undefined;
  return /database "(.*)" does not exist/.exec((error as Error).message)?.[1] ?? '';
}

/**
 * True when a statement named a schema or table that is not there: 3F000 (invalid_schema_name)
 * or 42P01 (undefined_table), as a statement on the keys of a schema never migrated meets.
 */
export function isMissingRelation(error: unknown): boolean {
  const state = sqlStateOf(error);
  return state === '3F000' || state === '42P01';
}

/** True when Postgres refused the connection's user or password (28P01, 28000). */
export function isLoginRefused(error: unknown): boolean {
  const state = sqlStateOf(error);
  return state === '28P01' || state === '28000';
}
