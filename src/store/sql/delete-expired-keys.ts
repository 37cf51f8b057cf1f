import { sql, type Kysely } from 'kysely';

/** One key the janitor deleted. */
export interface DeletedKey {
  readonly scope: string;
  readonly key: string;
}

/**
 * Deletes up to `limit` completed or failed keys whose retention has run out
 * (`expires_at <= now()`), oldest first, and returns them.
 *
 * Written as a `FOR UPDATE SKIP LOCKED` select feeding a delete so that many janitors can run
 * at once: each locks a disjoint batch, never waits on another janitor (or on a claim holding
 * the row), and a row is deleted by exactly one of them. Postgres re-checks the select's WHERE
 * on the newest row version when it locks a row, so a key released by an operator between the
 * snapshot and the lock (status back to `processing`, `expires_at` null) is skipped, never
 * deleted. Small batches keep each transaction short: no long locks and no table rewrite; the
 * space is reused after autovacuum. The partial index on `expires_at` serves the scan.
 *
 * `table` is the keys table, or one partition of a partitioned keys table: the delete's join
 * by (scope, key) cannot be pruned to one partition when planned on the parent, and Postgres
 * then plans a scan of every partition for it (a hash join over the whole table); run on a
 * partition, the statement is the plain table's, on a table a partition's size.
 */
export async function deleteExpiredKeys(db: Kysely<any>, schema: string, limit: number, table = 'idempotency_keys'): Promise<DeletedKey[]> {
  const keys = sql.id(schema, table);
  const { rows } = await sql<DeletedKey>`
    with doomed as (
      select scope, key
        from ${keys}
       where expires_at <= now()
         and status in ('completed', 'failed')
       order by expires_at
       limit ${limit}
         for update skip locked
    )
    delete from ${keys} as k
     using doomed as d
     where k.scope = d.scope and k.key = d.key
    returning k.scope, k.key`.execute(db);
  return rows;
}
