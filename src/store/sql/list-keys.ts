import { sql, type Kysely } from 'kysely';
import { toKeyRecord, type IdempotencyKeysTable, type KeyRecord, type ListKeysFilter } from '../records.js';

/**
 * Lists keys for operators, most recently updated first. An ad-hoc read for the CLI, not a hot
 * path: filters are optional, so the planner picks the primary key (scope given), the partial
 * indexes (expired) or a scan with a top-N sort bounded by `limit`.
 */
export async function listKeys(db: Kysely<any>, schema: string, filter: ListKeysFilter): Promise<KeyRecord[]> {
  const conditions = [sql`true`];
  if (filter.status) conditions.push(sql`status = ${filter.status}`);
  if (filter.scope) conditions.push(sql`scope = ${filter.scope}`);
  if (filter.expired) {
    conditions.push(sql`(expires_at <= now() or (status = 'processing' and locked_until <= now()))`);
  }
  const { rows } = await sql<IdempotencyKeysTable>`
    select *
      from ${sql.id(schema, 'idempotency_keys')}
     where ${sql.join(conditions, sql` and `)}
     order by updated_at desc, scope, key
     limit ${filter.limit}`.execute(db);
  return rows.map(toKeyRecord);
}
