import { sql, type Kysely } from 'kysely';
import { toKeyRecord, type IdempotencyKeysTable, type KeyRecord } from '../records.js';

/** Reads one key's row, or undefined. */
export async function getKey(db: Kysely<any>, schema: string, scope: string, key: string): Promise<KeyRecord | undefined> {
  const { rows } = await sql<IdempotencyKeysTable>`
    select * from ${sql.id(schema, 'idempotency_keys')} where scope = ${scope} and key = ${key}`.execute(db);
  return rows[0] ? toKeyRecord(rows[0]) : undefined;
}
