import { sql, type Kysely } from 'kysely';
import type { Claim } from '../claim-outcome.js';

/**
 * Retryable failure: gives the key up so the next claim takes it over at once (owner null,
 * lease ended now). Status stays `processing`; attempts and the last error are kept for
 * operators. Fenced like completion, so a zombie cannot release its successor's claim.
 * Returns false when this claim no longer owned the key.
 */
export async function releaseKey(db: Kysely<any>, schema: string, claim: Claim, errorJson: string | null): Promise<boolean> {
  const { numAffectedRows } = await sql`
    update ${sql.id(schema, 'idempotency_keys')}
       set owner = null,
           locked_until = now(),
           error = ${errorJson}::jsonb,
           updated_at = now()
     where scope = ${claim.scope} and key = ${claim.key}
       and owner = ${claim.owner}::uuid and fence = ${claim.fence}
       and status = 'processing'`.execute(db);
  return numAffectedRows === 1n;
}
