import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { keySettledChannel } from '../channels.js';
import type { Claim } from '../claim-outcome.js';

/**
 * SQLSTATE the `complete_key` function raises when the fenced UPDATE matched no row (the claim
 * no longer owns the key). A class of its own, so it cannot be mistaken for any other error.
 */
export const LEASE_LOST_STATE = 'IJ001';

/**
 * The leased path's fenced completion and the COMMIT, in ONE round trip: the two statements go
 * as one simple-protocol query string (`…; commit`), which node-postgres sends as one message.
 * The simple protocol takes no bind parameters, so the values are inlined as literals escaped
 * by node-postgres (`escapeLiteral`); numbers are checked to be integers.
 *
 * The completion is a call of the `complete_key` function ({@link completeKeyFunctionDdl}):
 * the same UPDATE as ever (owner token + fence + `processing`, no clock check), planned once
 * per connection instead of parsed and planned from literal text on every job. When it matches
 * no row the lease was lost: the function raises {@link LEASE_LOST_STATE}, Postgres skips the
 * rest of the string, so the COMMIT never runs, and the caller rolls the transaction (effect
 * included) back.
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
  return completeKey(tx, schema, claim, resultJson, retentionMs, '; commit');
}

/**
 * Fenced completion, run inside the effect's transaction ({@link fencedCompletionText}),
 * followed in the same string by `then` (`'; commit'` for {@link completeAndCommit}): the key
 * becomes `completed` with its result only if this claim still owns it (owner token and fence
 * match, still `processing`). Deliberately no clock check: a worker whose lease expired but was
 * not taken over still owns the key and may complete; fencing is by token, not by time. The
 * notification (when a waiter asked) is transactional: sent only once this commits.
 *
 * Returns false when no row matched (the caller throws `LeaseLostError`, so the whole
 * transaction, effect included, rolls back); any other error is thrown as it is.
 */
export async function completeKey(
  tx: Kysely<any>,
  schema: string,
  claim: Claim,
  resultJson: string,
  retentionMs: number,
  then = '',
): Promise<boolean> {
  try {
    await sql.raw(`${fencedCompletionText(schema, claim, resultJson, retentionMs)}${then}`).execute(tx);
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
 * after it in the string runs.
 */
export function fencedCompletionText(schema: string, claim: Claim, resultJson: string, retentionMs: number): string {
  return `select ${pg.escapeIdentifier(schema)}.complete_key(${pg.escapeLiteral(claim.scope)}, ${pg.escapeLiteral(claim.key)}, ${pg.escapeLiteral(claim.owner)}::uuid, ${integer(claim.fence, 'fence')}, ${pg.escapeLiteral(resultJson)}::jsonb, ${integer(retentionMs, 'retentionMs')}, ${pg.escapeLiteral(keySettledChannel(schema))})`;
}

/**
 * DDL of `complete_key(scope, key, owner, fence, result, retention_ms, channel)`, for the
 * migration that installs it: the fenced completion. Marks the key `completed` with its result
 * if this claim still owns it, and notifies at commit only when a waiter asked (`has_waiters`:
 * NOTIFY serializes commits database-wide); otherwise raises {@link LEASE_LOST_STATE}.
 */
export function completeKeyFunctionDdl(schema: string) {
  return sql`
    create or replace function ${sql.id(schema, 'complete_key')}(
      p_scope text, p_key text, p_owner uuid, p_fence bigint, p_result jsonb, p_retention_ms bigint, p_channel text)
    returns void
    language plpgsql volatile as $complete_key$
    declare
      v_has_waiters boolean;
    begin
      update ${sql.id(schema, 'idempotency_keys')} as k
         set status = 'completed',
             result = p_result,
             locked_until = null,
             completed_at = now(),
             updated_at = now(),
             expires_at = now() + p_retention_ms * interval '1 millisecond'
       where k.scope = p_scope and k.key = p_key
         and k.owner = p_owner and k.fence = p_fence
         and k.status = 'processing'
      returning k.has_waiters into v_has_waiters;
      if not found then
        raise exception 'lease lost: key % in scope % is no longer owned by this claim (fence %)', p_key, p_scope, p_fence
          using errcode = ${sql.lit(LEASE_LOST_STATE)};
      end if;
      if v_has_waiters then
        perform pg_notify(p_channel, json_build_object('scope', p_scope, 'key', p_key)::text);
      end if;
    end;
    $complete_key$`;
}

/**
 * The fast path's result and the COMMIT in one round trip (same simple-protocol technique as
 * {@link completeAndCommit}).
 */
export function storeResultAndCommit(tx: Kysely<any>, schema: string, claim: Claim, resultJson: string): Promise<void> {
  return storeFastPathResult(tx, schema, claim, resultJson, '; commit');
}

/**
 * Stores the effect's result on a key the fast path already claimed as `completed` in this same
 * transaction ({@link fastPathResultText}), followed in the same string by `then`.
 */
export async function storeFastPathResult(tx: Kysely<any>, schema: string, claim: Claim, resultJson: string, then = ''): Promise<void> {
  await sql.raw(`${fastPathResultText(schema, claim, resultJson)}${then}`).execute(tx);
}

/**
 * The fast path's result as one statement of literal SQL: a call of `store_fast_path_result`
 * ({@link storeFastPathResultFunctionDdl}), planned once per connection.
 */
export function fastPathResultText(schema: string, claim: Claim, resultJson: string): string {
  return `select ${pg.escapeIdentifier(schema)}.store_fast_path_result(${pg.escapeLiteral(claim.scope)}, ${pg.escapeLiteral(claim.key)}, ${pg.escapeLiteral(claim.owner)}::uuid, ${pg.escapeLiteral(resultJson)}::jsonb)`;
}

/**
 * DDL of `store_fast_path_result(scope, key, owner, result)`: stores the effect's result on a
 * key the fast path claimed as `completed` in this same transaction. Its row is locked by the
 * transaction since the claim, so the UPDATE cannot miss; the owner condition only documents
 * whose row this is. Only `result` changes, which no index covers, so with the table's spare
 * room per page (fillfactor, migration 007) this is a HOT update: no index entries.
 *
 * PL/pgSQL, not SQL: Postgres caches a PL/pgSQL function's plans for the session, while a
 * `language sql` function's body is parsed and planned again on every call (migration 007
 * installed it so: 7% of the machine's CPU in a fast-path drain went to `fmgr_sql`; migration
 * 009 replaced it).
 */
export function storeFastPathResultFunctionDdl(schema: string) {
  return sql`
    create or replace function ${sql.id(schema, 'store_fast_path_result')}(p_scope text, p_key text, p_owner uuid, p_result jsonb)
    returns void
    language plpgsql volatile as $store_result$
    begin
      update ${sql.id(schema, 'idempotency_keys')} as k set result = p_result
       where k.scope = p_scope and k.key = p_key and k.owner = p_owner;
    end;
    $store_result$`;
}

function integer(value: number, name: string): string {
  if (!Number.isSafeInteger(value)) throw new TypeError(`${name} must be a safe integer to be inlined into SQL (got ${value}).`);
  return String(value);
}
