import { sql, type Kysely } from 'kysely';
import type { Claim } from '../claim-outcome.js';
import { isDiskFull } from '../pg-errors.js';

/**
 * Retryable failure: gives the key up so the next claim takes it over at once (owner null,
 * lease ended now). Status stays `processing`; attempts and the last error are kept for
 * operators. Fenced like completion, so a zombie cannot release its successor's claim.
 * Returns false when this claim no longer owned the key.
 *
 * `expiresInMs` (a claim that asked to expire when released: an HTTP request's) sets
 * `expires_at`, by the database clock, in the same statement: the janitor deletes the key once
 * it passes, unless a claim took it over (which clears it). Null leaves `expires_at` null, as
 * every held key has it.
 *
 * On a full disk (53100) that UPDATE may not fit: it changes `locked_until`, which an index
 * holds, so it needs a new index entry in every index and, when the row's page has no room for
 * the bigger version with the error, a page found through the free-space map, whose file must
 * grow. A key left as it is would stay held until its lease ends, while its job waits. So the
 * release is sent again writing less ({@link releaseOnFullDisk}), which fits where the first
 * did not.
 */
export async function releaseKey(db: Kysely<any>, schema: string, claim: Claim, errorJson: string | null, expiresInMs: number | null = null): Promise<boolean> {
  try {
    return await releaseWithError(db, schema, claim, errorJson, expiresInMs);
  } catch (error) {
    if (!isDiskFull(error)) throw error;
    return releaseOnFullDisk(db, schema, claim);
  }
}

async function releaseWithError(db: Kysely<any>, schema: string, claim: Claim, errorJson: string | null, expiresInMs: number | null): Promise<boolean> {
  const { numAffectedRows } = await sql`
    update ${sql.id(schema, 'idempotency_keys')}
       set owner = null,
           locked_until = now(),
           error = ${errorJson}::jsonb,
           expires_at = now() + ${expiresInMs}::bigint * interval '1 millisecond',
           updated_at = now()
     where scope = ${claim.scope} and key = ${claim.key}
       and owner = ${claim.owner}::uuid and fence = ${claim.fence}
       and status = 'processing'`.execute(db);
  return numAffectedRows === 1n;
}

/**
 * The release that a full disk still takes: the owner token cleared, nothing else that grows or
 * is indexed. No indexed column changes, so the new row version is a heap-only tuple on the
 * row's own page (which the keys table's fillfactor keeps room on, and which Postgres prunes of
 * dead versions as it reads it): no index entry, no free-space map, no file that must grow. A
 * key with no owner is taken over by the next claim whatever its `locked_until` says (see
 * `claim.ts`), so the lease's end is left as it was, and so is the error of an earlier attempt,
 * and no expiry is set (`expires_at` is indexed): a key released so is kept until a claim takes
 * it over, even one whose claim asked to expire when released.
 */
async function releaseOnFullDisk(db: Kysely<any>, schema: string, claim: Claim): Promise<boolean> {
  const { numAffectedRows } = await sql`
    update ${sql.id(schema, 'idempotency_keys')}
       set owner = null,
           updated_at = now()
     where scope = ${claim.scope} and key = ${claim.key}
       and owner = ${claim.owner}::uuid and fence = ${claim.fence}
       and status = 'processing'`.execute(db);
  return numAffectedRows === 1n;
}
