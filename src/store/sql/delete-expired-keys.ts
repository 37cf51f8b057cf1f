import { sql, type Kysely } from 'kysely';
import type { DeletedKey } from '../records.js';

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
 * With `tombstoneMs` > 0, each deleted key leaves a tombstone (see `tombstones.ts`) in the same
 * statement, so no moment exists in which the key is gone and its tombstone not yet there: the
 * tombstone lasts `tombstoneMs` from when the key finished, and a key whose window has already
 * passed leaves none. A tombstone left by an earlier life of the key (expired but not yet
 * deleted) is replaced.
 *
 * `table` is the keys table, or one partition of a partitioned keys table: the delete's join
 * by (scope, key) cannot be pruned to one partition when planned on the parent, and Postgres
 * then plans a scan of every partition for it (a hash join over the whole table); run on a
 * partition, the statement is the plain table's, on a table a partition's size.
 */
export async function deleteExpiredKeys(
  db: Kysely<any>,
  schema: string,
  limit: number,
  table = 'idempotency_keys',
  tombstoneMs = 0,
): Promise<DeletedKey[]> {
  const keys = sql.id(schema, table);
  if (tombstoneMs > 0) return (await deleteLeavingTombstones(db, schema, keys, limit, tombstoneMs)).rows;
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

function deleteLeavingTombstones(db: Kysely<any>, schema: string, keys: ReturnType<typeof sql.id>, limit: number, tombstoneMs: number) {
  return sql<DeletedKey>`
    with doomed as (
      select scope, key
        from ${keys}
       where expires_at <= now()
         and status in ('completed', 'failed')
       order by expires_at
       limit ${limit}
         for update skip locked
    ),
    gone as (
      delete from ${keys} as k
       using doomed as d
       where k.scope = d.scope and k.key = d.key
      returning k.scope, k.key, k.fingerprint, k.status, coalesce(k.completed_at, k.updated_at) as finished_at
    ),
    entombed as (
      insert into ${sql.id(schema, 'key_tombstones')} as t (scope, key_hash, fingerprint_hash, failed, finished_at, expires_at)
      select g.scope, sha256(convert_to(g.key, 'UTF8')), sha256(convert_to(g.fingerprint, 'UTF8')), g.status = 'failed',
             g.finished_at, g.finished_at + ${tombstoneMs}::bigint * interval '1 millisecond'
        from gone as g
       where g.finished_at + ${tombstoneMs}::bigint * interval '1 millisecond' > now()
      on conflict (scope, key_hash) do update
         set fingerprint_hash = excluded.fingerprint_hash, failed = excluded.failed,
             finished_at = excluded.finished_at, expires_at = excluded.expires_at
    )
    select scope, key from gone`.execute(db);
}
