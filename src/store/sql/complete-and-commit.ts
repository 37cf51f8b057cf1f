import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { keySettledChannel } from '../channels.js';
import type { Claim } from '../claim-outcome.js';

/**
 * SQLSTATE raised on purpose by {@link completeAndCommit} when the fenced UPDATE matched no row.
 * 22012 (division by zero) cannot otherwise come out of that statement.
 */
export const LEASE_LOST_STATE = '22012';

/**
 * The leased path's fenced completion and the COMMIT, in ONE round trip: the two statements go
 * as one simple-protocol query string (`…; commit`), which node-postgres sends as one message.
 * The simple protocol takes no bind parameters, so the values are inlined as literals escaped
 * by node-postgres (`escapeLiteral`, `escapeIdentifier`); numbers are checked to be integers.
 *
 * The completion is the same UPDATE as `complete.ts` (owner token + fence + `processing`, no
 * clock check). When it matches no row the lease was lost: the statement then divides by zero
 * on purpose (22012, {@link LEASE_LOST_STATE}), Postgres skips the rest of the string, so the
 * COMMIT never runs, and the caller rolls the transaction (effect included) back. A CASE on
 * the counted rows makes that error data-dependent, so the planner cannot fold it early.
 *
 * Returns false when the lease was lost; any other error is thrown as it is.
 */
export async function completeAndCommit(
  tx: Kysely<any>,
  schema: string,
  claim: Claim,
  resultJson: string,
  retentionMs: number,
): Promise<boolean> {
  try {
    await sql.raw(`${fencedCompletionText(schema, claim, resultJson, retentionMs)}; commit`).execute(tx);
    return true;
  } catch (error) {
    if (isLeaseLost(error)) return false;
    throw error;
  }
}

/** True for the deliberate error of a fenced completion that matched no row (see {@link fencedCompletionText}). */
export function isLeaseLost(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === LEASE_LOST_STATE;
}

/**
 * The fenced completion as one self-contained statement of literal SQL, for a simple-protocol
 * string that also carries other statements (`…; commit` here, savepoints in group commit).
 * It fails with {@link LEASE_LOST_STATE} when the claim no longer owns the key, so nothing
 * after it in the string runs. Notifies at commit only when a waiter asked (`has_waiters`).
 */
export function fencedCompletionText(schema: string, claim: Claim, resultJson: string, retentionMs: number): string {
  const table = `${pg.escapeIdentifier(schema)}.idempotency_keys`;
  return `
    with completed as (
      update ${table}
         set status = 'completed',
             result = ${pg.escapeLiteral(resultJson)}::jsonb,
             locked_until = null,
             completed_at = now(),
             updated_at = now(),
             expires_at = now() + ${integer(retentionMs, 'retentionMs')}::bigint * interval '1 millisecond'
       where scope = ${pg.escapeLiteral(claim.scope)} and key = ${pg.escapeLiteral(claim.key)}
         and owner = ${pg.escapeLiteral(claim.owner)}::uuid and fence = ${integer(claim.fence, 'fence')}
         and status = 'processing'
      returning scope, key, has_waiters
    ),
    notified as (
      select pg_notify(${pg.escapeLiteral(keySettledChannel(schema))}, json_build_object('scope', scope, 'key', key)::text)
        from completed where has_waiters
    )
    select case when c.n = 1 then (select count(*) from notified) else 1 / (c.n - c.n) end as completed
      from (select count(*) as n from completed) as c`;
}

/**
 * The fast path's result and the COMMIT in one round trip (same simple-protocol technique as
 * {@link completeAndCommit}).
 */
export async function storeResultAndCommit(tx: Kysely<any>, schema: string, claim: Claim, resultJson: string): Promise<void> {
  await sql.raw(`${fastPathResultText(schema, claim, resultJson)}; commit`).execute(tx);
}

/**
 * The fast path's result as one statement of literal SQL. The key was claimed as `completed` in
 * this transaction and its row is locked by it, so the UPDATE cannot miss; the owner condition
 * only documents whose row this is.
 */
export function fastPathResultText(schema: string, claim: Claim, resultJson: string): string {
  return `
    update ${pg.escapeIdentifier(schema)}.idempotency_keys
       set result = ${pg.escapeLiteral(resultJson)}::jsonb
     where scope = ${pg.escapeLiteral(claim.scope)} and key = ${pg.escapeLiteral(claim.key)}
       and owner = ${pg.escapeLiteral(claim.owner)}::uuid`;
}

function integer(value: number, name: string): string {
  if (!Number.isSafeInteger(value)) throw new TypeError(`${name} must be a safe integer to be inlined into SQL (got ${value}).`);
  return String(value);
}
