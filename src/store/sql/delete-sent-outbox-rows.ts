import { sql, type Kysely } from 'kysely';

/**
 * Deletes up to `limit` outbox rows that were sent to BullMQ more than `olderThanMs` ago and
 * returns how many. Unsent rows are never touched. `FOR UPDATE SKIP LOCKED` in the select lets
 * several janitors (and the relay, which locks unsent rows only) run at once without waiting
 * on each other; the batch keeps each transaction short.
 */
export async function deleteSentOutboxRows(db: Kysely<any>, schema: string, olderThanMs: number, limit: number): Promise<number> {
  const table = sql.id(schema, 'outbox');
  const { rows } = await sql<{ deleted: string }>`
    with doomed as (
      select id
        from ${table}
       where sent_at < now() - ${olderThanMs}::bigint * interval '1 millisecond'
       order by id
       limit ${limit}
         for update skip locked
    ),
    deleted as (
      delete from ${table} as o using doomed as d where o.id = d.id returning 1
    )
    select count(*) as deleted from deleted`.execute(db);
  return Number(rows[0]?.deleted ?? 0);
}
