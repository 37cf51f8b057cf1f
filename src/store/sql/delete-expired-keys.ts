import { sql, type Kysely } from 'kysely';
import type { DeletedKey } from '../records.js';
import { recordEndedGenerations } from './coalescing-janitor.js';

/**
 * Deletes up to `limit` completed or failed keys whose retention has run out
 * (`expires_at <= now()`), oldest first, and returns them; and, in the same batches, released
 * keys whose expiry has passed: `processing` with no owner and an `expires_at`, which only a
 * release of a claim that asked for it writes (an HTTP request's key that nobody retried). A
 * key with an owner is never deleted, whatever its lease and `expires_at` say: its claim may
 * still complete it (fencing is by token), until another claim takes it over.
 *
 * Written as a `FOR UPDATE SKIP LOCKED` select feeding a delete so that many janitors can run
 * at once: each locks a disjoint batch, never waits on another janitor (or on a claim holding
 * the row), and a row is deleted by exactly one of them. Postgres re-checks the select's WHERE
 * on the newest row version when it locks a row, so a key released by an operator between the
 * snapshot and the lock (status back to `processing`, `expires_at` null), or a released key
 * taken over by a claim (owner set, `expires_at` null), is skipped, never deleted. Small
 * batches keep each transaction short: no long locks and no table rewrite; the space is reused
 * after autovacuum. The partial index on `expires_at` serves the scan.
 *
 * Each deleted finished key may leave a tombstone (see `tombstones.ts`) in the same statement, so
 * no moment exists in which the key is gone and its tombstone not yet there. Its window is the
 * key's own (`tombstone_ms`, which its job asked for) or else `tombstoneMs`, counted from when
 * the key finished; a key whose window is 0 or has already passed leaves none. So a key that
 * asked for a tombstone keeps it even under a janitor with no window of its own (`tombstoneMs`
 * 0), and a key that asked for none (0) leaves none under one that has. A tombstone left by an
 * earlier life of the key (expired but not yet deleted) is replaced. A released key leaves none:
 * it never answered, so there is nothing for a tombstone to stand for, and its request (or a
 * corrected one) is free to run once it is gone. `key_window` records that the window was the
 * key's own, so that a janitor without a window can tell another janitor's tombstones (a
 * configuration to warn about) from the ones keys asked for.
 *
 * A deleted key that is a coalescing key's current generation records on its row that the
 * generation ended, in the same statement (see `coalescing-janitor.ts`).
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
  const { rows } = await sql<DeletedKey>`
    with doomed as (
      select scope, key
        from ${keys}
       where expires_at <= now()
         and (status in ('completed', 'failed') or (status = 'processing' and owner is null))
       order by expires_at
       limit ${limit}
         for update skip locked
    ),
    gone as (
      delete from ${keys} as k
       using doomed as d
       where k.scope = d.scope and k.key = d.key
      returning k.scope, k.key, k.fingerprint, k.status, k.status <> 'processing' as finished, coalesce(k.completed_at, k.updated_at) as finished_at,
                coalesce(k.tombstone_ms, ${tombstoneMs}::bigint) as window_ms, k.tombstone_ms is not null as key_window
    ),
    entombed as (
      insert into ${sql.id(schema, 'key_tombstones')} as t (scope, key_hash, fingerprint_hash, failed, finished_at, expires_at, key_window)
      select g.scope, sha256(convert_to(g.key, 'UTF8')), sha256(convert_to(g.fingerprint, 'UTF8')), g.status = 'failed',
             g.finished_at, g.finished_at + g.window_ms * interval '1 millisecond', g.key_window
        from gone as g
       where g.finished and g.window_ms > 0 and g.finished_at + g.window_ms * interval '1 millisecond' > now()
      on conflict (scope, key_hash) do update
         set fingerprint_hash = excluded.fingerprint_hash, failed = excluded.failed,
             finished_at = excluded.finished_at, expires_at = excluded.expires_at, key_window = excluded.key_window
    ),
    generations_ended as (${recordEndedGenerations(schema, 'gone')})
    select scope, key, finished from gone`.execute(db);
  return rows;
}
