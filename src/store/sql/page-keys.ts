import { sql, type Kysely } from 'kysely';
import { toKeyRecord, type IdempotencyKeysTable, type KeyPage, type KeyPageRequest } from '../records.js';

/**
 * Keyset paging over the keys for the key inspector: (scope, key) order, the primary key's, so
 * a page is one index range scan that starts where the last one ended, at any depth (OFFSET
 * would read and discard every row before the page). That order never changes under a key, so
 * keys that are claimed, completed or released while someone pages are neither skipped nor
 * shown twice, which an order by `updated_at` could not promise (and no index on `updated_at`
 * is kept: it would make every completion's update non-HOT). The status filter is checked on
 * the rows the range scan reads. One row more than the page is read to tell whether more
 * follow.
 */
export async function pageKeys(db: Kysely<any>, schema: string, request: KeyPageRequest): Promise<KeyPage> {
  const conditions = [sql`true`];
  if (request.status) conditions.push(sql`status = ${request.status}`);
  if (request.scope !== undefined) conditions.push(sql`scope = ${request.scope}`);
  const backward = request.before !== undefined && request.after === undefined;
  if (request.after) conditions.push(sql`(scope, key) > (${request.after.scope}, ${request.after.key})`);
  if (backward) conditions.push(sql`(scope, key) < (${request.before!.scope}, ${request.before!.key})`);
  const direction = backward ? sql`desc` : sql`asc`;
  const { rows } = await sql<IdempotencyKeysTable>`
    select *
      from ${sql.id(schema, 'idempotency_keys')}
     where ${sql.join(conditions, sql` and `)}
     order by scope ${direction}, key ${direction}
     limit ${request.limit + 1}`.execute(db);
  const more = rows.length > request.limit;
  const page = rows.slice(0, request.limit).map(toKeyRecord);
  return { records: backward ? page.reverse() : page, more };
}
