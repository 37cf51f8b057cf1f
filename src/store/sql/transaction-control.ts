import { sql, type Kysely } from 'kysely';

/**
 * BEGIN, COMMIT and ROLLBACK for transactions the store drives by hand (see
 * `../one-trip-commit.ts`). Each is its own round trip; no parameters, so node-postgres sends
 * them as simple queries.
 */
export async function beginTransaction(tx: Kysely<any>): Promise<void> {
  await sql`begin`.execute(tx);
}

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
