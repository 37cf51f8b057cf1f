import { sql, type Kysely } from 'kysely';
import type { KeyStats, KeyStatsOptions } from '../records.js';

/**
 * Counts keys by status and reports the oldest processing key, in one statement (one
 * snapshot, so the numbers agree with each other). The counts scan the whole table: exact
 * numbers are what an operator asks for, and the cost (measured in docs/operations.md) is paid
 * only by `stats` and by the one maintenance leader per refresh interval, never per scrape.
 * The processing-only parts read the partial `processing` index; the outbox backlog reads the
 * partial `outbox_unsent` index; the live tombstones are counted over their table (a
 * tombstone is ~100 bytes, so a count of 10 M of them reads about a gigabyte). Ages use the
 * database clock.
 */
export async function keyStats(db: Kysely<any>, schema: string, options: KeyStatsOptions = {}): Promise<KeyStats> {
  const sweepAfterMs = options.sweepAfterMs ?? 900_000;
  const keys = sql.id(schema, 'idempotency_keys');
  const outbox = sql.id(schema, 'outbox');
  const { rows } = await sql<{
    processing: string;
    completed: string;
    failed: string;
    expired_leases: string;
    past_sweep_horizon: string;
    expired_keys: string;
    tombstones: string;
    oldest_scope: string | null;
    oldest_key: string | null;
    oldest_created_at: Date | null;
    oldest_age_ms: string | null;
    outbox_unsent: string;
    oldest_unsent_age_ms: string | null;
  }>`
    with counts as (
      select count(*) filter (where status = 'processing') as processing,
             count(*) filter (where status = 'completed') as completed,
             count(*) filter (where status = 'failed') as failed,
             count(*) filter (where status = 'processing' and locked_until <= now()) as expired_leases,
             count(*) filter (where status = 'processing'
                                and locked_until <= now() - make_interval(secs => ${sweepAfterMs / 1000})) as past_sweep_horizon,
             count(*) filter (where expires_at <= now()) as expired_keys
        from ${keys}
    ),
    oldest as (
      select scope, key, created_at
        from ${keys}
       where status = 'processing'
       order by created_at
       limit 1
    ),
    tombs as (
      select count(*) as tombstones from ${sql.id(schema, 'key_tombstones')} where expires_at > now()
    ),
    unsent as (
      select count(*) as outbox_unsent, min(created_at) as oldest_unsent
        from ${outbox}
       where sent_at is null
    )
    select c.*, t.tombstones, o.scope as oldest_scope, o.key as oldest_key, o.created_at as oldest_created_at,
           floor(extract(epoch from now() - o.created_at) * 1000)::bigint as oldest_age_ms,
           u.outbox_unsent,
           floor(extract(epoch from now() - u.oldest_unsent) * 1000)::bigint as oldest_unsent_age_ms
      from counts as c
      cross join unsent as u
      cross join tombs as t
      left join oldest as o on true`.execute(db);
  const r = rows[0]!;
  return {
    processing: Number(r.processing),
    completed: Number(r.completed),
    failed: Number(r.failed),
    expiredLeases: Number(r.expired_leases),
    pastSweepHorizon: Number(r.past_sweep_horizon),
    expiredKeys: Number(r.expired_keys),
    tombstones: Number(r.tombstones),
    oldestProcessing:
      r.oldest_scope !== null && r.oldest_key !== null && r.oldest_created_at !== null
        ? { scope: r.oldest_scope, key: r.oldest_key, createdAt: r.oldest_created_at, ageMs: Number(r.oldest_age_ms) }
        : null,
    outboxUnsent: Number(r.outbox_unsent),
    oldestUnsentAgeMs: r.oldest_unsent_age_ms === null ? null : Number(r.oldest_unsent_age_ms),
  };
}
