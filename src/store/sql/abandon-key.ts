import { sql, type Kysely } from 'kysely';
import { notifyWaitersOf } from './notify-waiters.js';
import type { AbandonKeyInput } from '../records.js';

/**
 * Marks a lost key failed for good with error code `ABANDONED`, so duplicates replay the
 * failure (and operators can `keys release` it) instead of the key staying `processing` with
 * nobody to finish it. Conditional on the state the sweeper saw: still `processing`, same
 * owner token and fence, lease still over for `sweepAfterMs`. The sweeper decides between its
 * read and this statement (it asks BullMQ, holding no lock); a worker that claimed, took over,
 * extended or released the key in the meantime changed one of those, so the update matches
 * nothing and returns false.
 * Waiters that asked are notified as for any failure.
 */
export async function abandonKey(db: Kysely<any>, schema: string, input: AbandonKeyInput): Promise<boolean> {
  const { rows } = await sql`
    with abandoned as (
      update ${sql.id(schema, 'idempotency_keys')}
         set status = 'failed',
             error = jsonb_build_object(
               'name', 'KeyAbandonedError',
               'code', 'ABANDONED',
               'message', ${input.reason}::text,
               'abandoned_by_sweeper', true,
               'at', now(),
               'previous_error', error),
             owner = null,
             locked_until = null,
             completed_at = now(),
             updated_at = now(),
             expires_at = now() + ${input.retentionMs}::bigint * interval '1 millisecond'
       where scope = ${input.scope} and key = ${input.key}
         and status = 'processing'
         and fence = ${input.fence}
         and owner is not distinct from ${input.owner}::uuid
         and locked_until <= now() - ${input.sweepAfterMs}::bigint * interval '1 millisecond'
      returning scope, key, has_waiters
    ),
    ${notifyWaitersOf(schema, 'abandoned')}`.execute(db);
  return rows.length === 1;
}
