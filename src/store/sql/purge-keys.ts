import { sql, type Kysely } from 'kysely';
import { recordEndedGenerations } from './coalescing-janitor.js';

/**
 * Deletes up to `limit` completed or failed keys that finished more than `olderThanMs` ago,
 * whatever their `expires_at` (an operator shortening retention, e.g. to free space), and
 * returns how many. `processing` keys are never purged: deleting one would let its job run
 * a second time while the first may still be running. Same batch shape as the janitor
 * (`FOR UPDATE SKIP LOCKED` select feeding a delete) so a purge can run beside janitors and
 * workers, holding row locks only for one short batch; the caller loops until a batch comes
 * back short. `completed_at` is set on every finished key (also by the sweeper's abandon).
 * `table` is the keys table or one of its partitions, as for the janitor's deleteExpiredKeys. A
 * purged coalescing generation records its end on its coalescing row (see `coalescing-janitor.ts`).
 */
export async function purgeKeys(db: Kysely<any>, schema: string, olderThanMs: number, limit: number, tableName = 'idempotency_keys'): Promise<number> {
  const table = sql.id(schema, tableName);
  const { rows } = await sql<{ deleted: string }>`
    with doomed as (
      select scope, key
        from ${table}
       where status in ('completed', 'failed')
         and completed_at < now() - ${olderThanMs}::bigint * interval '1 millisecond'
       limit ${limit}
         for update skip locked
    ),
    deleted as (
      delete from ${table} as k using doomed as d
       where k.scope = d.scope and k.key = d.key
      returning k.scope, k.key
    ),
    generations_ended as (${recordEndedGenerations(schema, 'deleted')})
    select count(*) as deleted from deleted`.execute(db);
  return Number(rows[0]?.deleted ?? 0);
}
