import { sql, type Kysely } from 'kysely';
import type { Claim } from '../claim-outcome.js';

/**
 * Heartbeat: pushes the lease to `now() + leaseMs` (database clock) if this claim still owns
 * the key. Returns the new expiry, or null when the claim was taken over, released or finished
 * (the lease is lost and the caller must stop and not complete).
 */
export async function extendLease(db: Kysely<any>, schema: string, claim: Claim, leaseMs: number): Promise<Date | null> {
  const { rows } = await sql<{ locked_until: Date }>`
    update ${sql.id(schema, 'idempotency_keys')}
       set locked_until = now() + ${leaseMs}::int * interval '1 millisecond',
           updated_at = now()
     where scope = ${claim.scope} and key = ${claim.key}
       and owner = ${claim.owner}::uuid and fence = ${claim.fence}
       and status = 'processing'
    returning locked_until`.execute(db);
  return rows[0]?.locked_until ?? null;
}
