import { sql, type Kysely } from 'kysely';
import type { TombstoneFound } from '../claim-outcome.js';
import { sqlStateOf } from '../pg-errors.js';
import type { TombstoneRecord } from '../records.js';

/**
 * SQLSTATE the tombstone check raises when a claim inserts a key whose tombstone is live and
 * whose fingerprint matches: the key finished before and its result has expired. A code of the
 * library's own (class `IJ`, no standard class), so nothing else is mistaken for it.
 */
export const TOMBSTONE_MATCHED = 'IJT01';
/** SQLSTATE of a claim inserting a key whose live tombstone has another fingerprint (key reuse). */
export const TOMBSTONE_REUSED = 'IJT02';

/** The tombstone a claim's insert met (the trigger's refusal), or undefined for any other error. */
export function tombstoneOf(error: unknown): TombstoneFound | undefined {
  const state = sqlStateOf(error);
  if (state !== TOMBSTONE_MATCHED && state !== TOMBSTONE_REUSED) return undefined;
  const detail = JSON.parse(String((error as { detail?: unknown }).detail)) as { failed: boolean; finished_at: string; expires_at: string };
  return {
    fingerprintMatches: state === TOMBSTONE_MATCHED,
    failed: detail.failed,
    finishedAt: new Date(detail.finished_at),
    expiresAt: new Date(detail.expires_at),
  };
}

/**
 * DDL of the `key_tombstones` table and of the trigger that makes every insert into the keys
 * table respect it, for migration `017_key_tombstones`.
 *
 * A tombstone is what is left of a finished key once the janitor deleted it after its
 * retention: scope, SHA-256 of the key, SHA-256 of the fingerprint, whether it failed, when it
 * finished and when the tombstone expires. No payload, no result, no job: a fixed ~100 bytes
 * whatever the key's size, so it can be kept far longer than the key.
 *
 * *Why a trigger and not a check in each claim function:* five statements insert keys
 * (`claim_key`, `claim_keys`, `claim_new_key`, `claim_new_keys`, `insert_completed_keys`), and
 * workers of earlier versions call some of them during a rolling upgrade; one row trigger on the
 * table covers them all, old callers included, and a new insert path cannot forget it.
 *
 * *Why AFTER INSERT:* the janitor deletes a key and writes its tombstone in one transaction. A
 * claim racing it waits on the key's index entry until the janitor commits, then inserts the
 * key anew. A check made before the insert would have looked before that commit and found no
 * tombstone; the AFTER trigger's query runs after the insert (with a fresh snapshot under read
 * committed), so it sees the committed tombstone and refuses the insert. A key that had a row
 * inserts nothing, so duplicates of stored keys never reach the trigger, and a brand-new key
 * pays one probe of the tombstones' primary key.
 *
 * The refusal raises {@link TOMBSTONE_MATCHED} or {@link TOMBSTONE_REUSED} with the tombstone
 * as JSON in DETAIL; the statement (and its transaction) is rolled back, the store maps the code
 * to a claim outcome.
 */
export function tombstonesDdl(schema: string) {
  const tombstones = sql.id(schema, 'key_tombstones');
  const keys = sql.id(schema, 'idempotency_keys');
  const fn = sql.id(schema, 'refuse_tombstoned_key');
  return [
    sql`
      create table ${tombstones} (
        scope             text        not null,
        key_hash          bytea       not null,
        fingerprint_hash  bytea       not null,
        failed            boolean     not null,
        finished_at       timestamptz not null,
        expires_at        timestamptz not null,
        primary key (scope, key_hash)
      )`,
    // The janitor: tombstones ordered by expiry.
    sql`create index key_tombstones_expiry on ${tombstones} (expires_at)`,
    sql`
      create or replace function ${fn}() returns trigger
      language plpgsql volatile as $tomb$
      declare
        v_tomb record;
      begin
        select t.fingerprint_hash, t.failed, t.finished_at, t.expires_at into v_tomb
          from ${tombstones} as t
         where t.scope = new.scope and t.key_hash = sha256(convert_to(new.key, 'UTF8'))
           and t.expires_at > now();
        if not found then
          return null;
        end if;
        if v_tomb.fingerprint_hash = sha256(convert_to(new.fingerprint, 'UTF8')) then
          raise exception 'key % of scope % finished before and its result expired', new.key, new.scope
            using errcode = '${sql.raw(TOMBSTONE_MATCHED)}',
                  detail = json_build_object('failed', v_tomb.failed, 'finished_at', v_tomb.finished_at, 'expires_at', v_tomb.expires_at)::text;
        end if;
        raise exception 'key % of scope % was used before with another payload', new.key, new.scope
          using errcode = '${sql.raw(TOMBSTONE_REUSED)}',
                detail = json_build_object('failed', v_tomb.failed, 'finished_at', v_tomb.finished_at, 'expires_at', v_tomb.expires_at)::text;
      end;
      $tomb$`,
    sql`create trigger idempotency_keys_tombstone_check after insert on ${keys}
          for each row execute function ${fn}()`,
  ];
}

/**
 * DDL of what per-key retention adds, for migration `023_per_key_retention`: the key's own
 * tombstone window on the keys table (null: the janitor's), whether a tombstone's window was its
 * key's own, and the index that finds live tombstones of a janitor's window (see
 * {@link anyLiveTombstone}). Adding a nullable column without a default rewrites nothing, on a
 * plain table or on every partition of a partitioned one.
 */
export function perKeyRetentionDdl(schema: string) {
  return [
    sql`alter table ${sql.id(schema, 'idempotency_keys')} add column tombstone_ms bigint`,
    sql`alter table ${sql.id(schema, 'key_tombstones')} add column key_window boolean not null default false`,
    sql`create index key_tombstones_janitor_expiry on ${sql.id(schema, 'key_tombstones')} (expires_at) where not key_window`,
  ];
}

/**
 * Deletes up to `limit` expired tombstones, oldest first; how many. `FOR UPDATE SKIP LOCKED`
 * for the same reason as `deleteExpiredKeys`: janitors running at once take disjoint batches.
 */
export async function deleteExpiredTombstones(db: Kysely<any>, schema: string, limit: number): Promise<number> {
  const tombstones = sql.id(schema, 'key_tombstones');
  const result = await sql`
    with doomed as (
      select scope, key_hash
        from ${tombstones}
       where expires_at <= now()
       order by expires_at
       limit ${limit}
         for update skip locked
    )
    delete from ${tombstones} as t
     using doomed as d
     where t.scope = d.scope and t.key_hash = d.key_hash`.execute(db);
  return Number(result.numAffectedRows ?? 0n);
}

/** The live tombstone of a key, if any (the CLI's, the HTTP API's and the inspector's read). */
export async function getTombstone(db: Kysely<any>, schema: string, scope: string, key: string): Promise<TombstoneRecord | undefined> {
  const { rows } = await sql<{ failed: boolean; finished_at: Date; expires_at: Date; fingerprint_hash: Buffer }>`
    select failed, finished_at, expires_at, fingerprint_hash
      from ${sql.id(schema, 'key_tombstones')}
     where scope = ${scope} and key_hash = sha256(convert_to(${key}::text, 'UTF8'))
       and expires_at > now()`.execute(db);
  const row = rows[0];
  if (!row) return undefined;
  return {
    scope,
    key,
    outcome: row.failed ? 'failed' : 'completed',
    finishedAt: row.finished_at,
    expiresAt: row.expires_at,
    fingerprintHash: row.fingerprint_hash.toString('hex'),
  };
}

/**
 * Whether any live tombstone exists that a janitor's window made (not one a key asked for
 * itself: `key_window`): one probe of the partial index `key_tombstones_janitor_expiry`, however
 * many there are (a janitor without a tombstone window asks, to warn that it deletes keys others
 * would keep as tombstones).
 */
export async function anyLiveTombstone(db: Kysely<any>, schema: string): Promise<boolean> {
  const { rows } = await sql<{ found: boolean }>`
    select exists (select 1 from ${sql.id(schema, 'key_tombstones')} where expires_at > now() and not key_window) as found`.execute(db);
  return rows[0]?.found === true;
}

/** How many live tombstones there are (`stats`, metrics). */
export async function countTombstones(db: Kysely<any>, schema: string): Promise<number> {
  const { rows } = await sql<{ n: string }>`
    select count(*)::text as n from ${sql.id(schema, 'key_tombstones')} where expires_at > now()`.execute(db);
  return Number(rows[0]?.n ?? 0);
}
