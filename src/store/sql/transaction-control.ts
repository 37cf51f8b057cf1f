import { sql, type Kysely } from 'kysely';

/*
 * COMMIT and ROLLBACK for transactions the store drives by hand (see `../one-trip-commit.ts`;
 * BEGIN is deferred there, to ride with the first statement). No parameters, so node-postgres
 * sends them as simple queries.
 */

/** COMMIT on its own, for a transaction with nothing left to write. */
export async function commitTransaction(tx: Kysely<any>): Promise<void> {
  await sql`commit`.execute(tx);
}

/**
 * ROLLBACK. After a failed final `…; commit` there is no transaction left and Postgres only
 * warns, so this is safe to send whatever state the transaction is in.
 */
export async function rollbackTransaction(tx: Kysely<any>): Promise<void> {
  await sql`rollback`.execute(tx);
}
