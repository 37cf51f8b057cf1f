import { sql, type Kysely } from 'kysely';
import { keySettledChannel } from '../channels.js';
import type { Claim } from '../claim-outcome.js';
import { isLeaseLost } from './complete-and-commit.js';

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
  // The notification (when a waiter asked) is transactional: sent only once this commits.
  try {
    await sql`select ${sql.id(schema, 'complete_key')}(
      ${claim.scope}::text, ${claim.key}::text, ${claim.owner}::uuid, ${claim.fence}::bigint,
      ${resultJson}::jsonb, ${retentionMs}::bigint, ${keySettledChannel(schema)}::text)`.execute(tx);
    return true;
  } catch (error) {
    if (isLeaseLost(error)) return false;
    throw error;
  }
}

/**
 * Stores the effect's result on a key the fast path already claimed as `completed` in this same
 * transaction (the `store_fast_path_result` function; see `complete-and-commit.ts`).
 */
export async function storeFastPathResult(tx: Kysely<any>, schema: string, claim: Claim, resultJson: string): Promise<void> {
  await sql`select ${sql.id(schema, 'store_fast_path_result')}(${claim.scope}::text, ${claim.key}::text, ${claim.owner}::uuid, ${resultJson}::jsonb)`.execute(tx);
}
