import { sql, type Kysely } from 'kysely';
import { keySettledChannel } from '../channels.js';
import type { Claim } from '../claim-outcome.js';

/**
 * Fenced completion, run inside the effect's transaction: the key becomes `completed` with its
 * result only if this claim still owns it (owner token and fence match, still `processing`).
 * Deliberately no clock check: a worker whose lease expired but was not taken over still owns
 * the key and may complete; fencing is by token, not by time.
 *
 * Returns false when no row matched; the caller throws `LeaseLostError` so the whole
 * transaction, effect included, rolls back.
 */
export async function completeKey(
  tx: Kysely<any>,
  schema: string,
  claim: Claim,
  resultJson: string,
  retentionMs: number,
): Promise<boolean> {
  // The notification is transactional: waiters hear of the completion only once it commits. It
  // goes out only when a waiter asked (has_waiters): NOTIFY serializes commits database-wide.
  const { rows } = await sql`
    with completed as (
    update ${sql.id(schema, 'idempotency_keys')}
       set status = 'completed',
           result = ${resultJson}::jsonb,
           locked_until = null,
           completed_at = now(),
           updated_at = now(),
           expires_at = now() + ${retentionMs}::bigint * interval '1 millisecond'
     where scope = ${claim.scope} and key = ${claim.key}
       and owner = ${claim.owner}::uuid and fence = ${claim.fence}
       and status = 'processing'
    returning scope, key, has_waiters
    ),
    notified as (
      select pg_notify(${keySettledChannel(schema)}, json_build_object('scope', scope, 'key', key)::text)
        from completed where has_waiters
    )
    select (select count(*) from notified) as notified from completed`.execute(tx);
  return rows.length === 1;
}

/**
 * Stores the effect's result on a key the fast path already claimed as `completed` in this same
 * transaction. The row is locked by this transaction since the claim, so nobody else can have
 * changed it; the owner condition only documents whose row this is.
 */
export async function storeFastPathResult(tx: Kysely<any>, schema: string, claim: Claim, resultJson: string): Promise<void> {
  await sql`
    update ${sql.id(schema, 'idempotency_keys')}
       set result = ${resultJson}::jsonb
     where scope = ${claim.scope} and key = ${claim.key} and owner = ${claim.owner}::uuid`.execute(tx);
}
