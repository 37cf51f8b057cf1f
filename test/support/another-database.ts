/**
 * A database of its own on the test's Postgres server, beside the keys' database: where a data
 * layer pointed at the wrong database lands. Created for one body and dropped after it.
 */
import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import type { TestEnv } from './test-env.js';

/** Runs `body` with the connection string of a new, empty database; drops it afterwards. */
export async function withAnotherDatabase(env: TestEnv, body: (databaseUrl: string) => Promise<void>): Promise<void> {
  const database = `ij_other_${randomBytes(4).toString('hex')}`;
  await sql`create database ${sql.id(database)}`.execute(env.db);
  const url = new URL(env.databaseDirectUrl);
  url.pathname = `/${database}`;
  try {
    await body(url.toString());
  } finally {
    await sql`drop database if exists ${sql.id(database)} with (force)`.execute(env.db);
  }
}
