import { sql, type Kysely } from 'kysely';
import { notifyWaitersOf } from './notify-waiters.js';
import type { Claim } from '../claim-outcome.js';

/**
 * Permanent failure: the key becomes `failed` with its error, which later claims replay
 * instead of running the effect. Fenced like completion; keeps the claim's own tombstone
 * window (`claim.retention.tombstoneMs`) as completion does. Returns false when this claim no
 * longer owned the key.
 */
export async function failKey(
  db: Kysely<any>,
  schema: string,
  claim: Claim,
  errorJson: string,
  retentionMs: number,
): Promise<boolean> {
  const { rows } = await sql`
    with failed as (
    update ${sql.id(schema, 'idempotency_keys')}
       set status = 'failed',
           error = ${errorJson}::jsonb,
           locked_until = null,
           completed_at = now(),
           updated_at = now(),
           expires_at = now() + ${retentionMs}::bigint * interval '1 millisecond',
           tombstone_ms = ${claim.retention?.tombstoneMs ?? null}::bigint
     where scope = ${claim.scope} and key = ${claim.key}
       and owner = ${claim.owner}::uuid and fence = ${claim.fence}
       and status = 'processing'
    returning scope, key, has_waiters
    ),
    ${notifyWaitersOf(schema, 'failed')}`.execute(db);
  return rows.length === 1;
}
