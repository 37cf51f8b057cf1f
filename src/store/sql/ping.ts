import { sql, type Kysely } from 'kysely';

/** The health check's round trip: the cheapest statement that proves a pooled connection works. */
export async function pingDatabase(db: Kysely<any>): Promise<void> {
  await sql`select 1`.execute(db);
}
