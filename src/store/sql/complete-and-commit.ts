import { CompiledQuery, sql, type Kysely } from 'kysely';
import pg from 'pg';
import { keySettledChannel } from '../channels.js';
import type { Claim } from '../claim-outcome.js';
import { prepared } from '../named-statements.js';
import { sendStatements, type PipelineReply } from '../pipeline.js';
import { AbortedTransactionError, COMMIT, commitApplied } from '../transaction-control.js';

/**
 * SQLSTATE the `complete_key` function raises when the fenced UPDATE matched no row (the claim
 * no longer owns the key). A class of its own, so it cannot be mistaken for any other error.
 */
export const LEASE_LOST_STATE = 'IJ001';

/**
 * The leased path's fenced completion and the COMMIT, in ONE round trip: the two statements go
 * as one pipeline (see `../pipeline.ts`), each with its own parameters.
 *
 * The completion is a call of the `complete_key` function ({@link completeKeyFunctionDdl}):
 * the same UPDATE as ever (owner token + fence + `processing`, no clock check), planned once
 * per connection. When it matches no row the lease was lost: the function raises
 * {@link LEASE_LOST_STATE}, Postgres skips the rest of the pipeline, so the COMMIT never runs,
 * and the caller rolls the transaction (effect included) back.
 *
 * Returns false when the lease was lost; any other error is thrown as it is (a COMMIT that
 * Postgres answered with ROLLBACK, too: see `commitApplied`).
 */
export async function completeAndCommit(
  tx: Kysely<any>,
  schema: string,
  claim: Claim,
  resultJson: string,
  retentionMs: number,
): Promise<boolean> {
  return endsWell(await sendStatements(tx, [completionStatement(schema, claim, resultJson, retentionMs), COMMIT]));
}

/**
 * Fenced completion, run inside the effect's transaction ({@link completionStatement}): the key
 * becomes `completed` with its result only if this claim still owns it (owner token and fence
 * match, still `processing`). Deliberately no clock check: a worker whose lease expired but was
 * not taken over still owns the key and may complete; fencing is by token, not by time. The
 * notification (when a waiter asked) is transactional: sent only once this commits.
 *
 * Returns false when no row matched (the caller throws `LeaseLostError`, so the whole
 * transaction, effect included, rolls back); any other error is thrown as it is.
 */
export async function completeKey(tx: Kysely<any>, schema: string, claim: Claim, resultJson: string, retentionMs: number): Promise<boolean> {
  return endsWell(await sendStatements(tx, [completionStatement(schema, claim, resultJson, retentionMs)]));
}

/**
 * What a pipeline that ends a key's transaction says: false when a statement raised
 * {@link LEASE_LOST_STATE} (nothing after it ran); any other failure thrown; a COMMIT that
 * Postgres answered with ROLLBACK thrown as {@link AbortedTransactionError}.
 */
function endsWell(reply: PipelineReply): boolean {
  if (reply.failure) {
    if (isLeaseLost(reply.failure.error)) return false;
    throw reply.failure.error;
  }
  if (!reply.results.every(commitApplied)) throw new AbortedTransactionError();
  return true;
}

/** True for the deliberate error of a fenced completion that matched no row (see {@link completionStatement}). */
export function isLeaseLost(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === LEASE_LOST_STATE;
}

/**
 * The fenced completion as one statement, for a pipeline that also carries other statements (the
 * COMMIT here, a group's other jobs in group commit). It fails with {@link LEASE_LOST_STATE} when
 * the claim no longer owns the key, so nothing after it in the pipeline runs.
 */
export function completionStatement(schema: string, claim: Claim, resultJson: string, retentionMs: number): CompiledQuery {
  return prepared(
    CompiledQuery.raw(
      `select ${pg.escapeIdentifier(schema)}.complete_key($1::text, $2::text, $3::uuid, $4::bigint, $5::jsonb, $6::bigint, $7::text, $8::bigint)`,
      [claim.scope, claim.key, claim.owner, claim.fence, resultJson, retentionMs, keySettledChannel(schema), claim.retention?.tombstoneMs ?? null],
    ),
  );
}

/**
 * DDL of `complete_key(scope, key, owner, fence, result, retention_ms, channel, tombstone_ms)`,
 * for the migration that installs it: the fenced completion. Marks the key `completed` with its
 * result if this claim still owns it, and notifies at commit only when a waiter asked
 * (`has_waiters`: NOTIFY serializes commits database-wide); otherwise raises {@link LEASE_LOST_STATE}.
 *
 * The retention window starts at this statement, just before the COMMIT: `clock_timestamp()`,
 * not `now()`, which is the transaction's start, so that a transaction longer than the window
 * does not commit a key already expired (the next janitor pass would delete it, and a
 * redelivery then run the effect again).
 *
 * `tombstone_ms` is the key's own tombstone window (the job's `retention.tombstoneMs`), kept on
 * the row for the janitor; it defaults to null so that a worker of an earlier version, calling
 * with seven arguments during a rolling upgrade, still completes (migration 023 dropped the
 * seven-argument function, which would otherwise make such a call ambiguous).
 */
export function completeKeyFunctionDdl(schema: string) {
  return sql`
    create or replace function ${sql.id(schema, 'complete_key')}(
      p_scope text, p_key text, p_owner uuid, p_fence bigint, p_result jsonb, p_retention_ms bigint, p_channel text,
      p_tombstone_ms bigint default null)
    returns void
    language plpgsql volatile as $complete_key$
    declare
      v_has_waiters boolean;
    begin
      update ${sql.id(schema, 'idempotency_keys')} as k
         set status = 'completed',
             result = p_result,
             locked_until = null,
             completed_at = clock_timestamp(),
             updated_at = clock_timestamp(),
             expires_at = clock_timestamp() + p_retention_ms * interval '1 millisecond',
             tombstone_ms = p_tombstone_ms
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
 * The fast path's result and the COMMIT in one round trip (as {@link completeAndCommit}); with
 * `windowLate`, the move of the key's retention window to the commit first
 * ({@link moveWindowToCommitStatement}), in the same round trip.
 */
export async function storeResultAndCommit(tx: Kysely<any>, schema: string, claim: Claim, resultJson: string | null, windowLate = false): Promise<void> {
  endsWell(await sendStatements(tx, [...windowMove(schema, claim, windowLate), fastPathResultStatement(schema, claim, resultJson), COMMIT]));
}

/** Stores the effect's result on a key the fast path already claimed as `completed` in this same transaction (and, `windowLate`, moves its window as {@link storeResultAndCommit} does). */
export async function storeFastPathResult(tx: Kysely<any>, schema: string, claim: Claim, resultJson: string | null, windowLate = false): Promise<void> {
  endsWell(await sendStatements(tx, [...windowMove(schema, claim, windowLate), fastPathResultStatement(schema, claim, resultJson)]));
}

function windowMove(schema: string, claim: Claim, windowLate: boolean): CompiledQuery[] {
  return windowLate ? [moveWindowToCommitStatement(schema, claim)] : [];
}

/**
 * The fast path's result as one statement: a call of `store_fast_path_result`
 * ({@link storeFastPathResultFunctionDdl}), planned once per connection. With the claim's own
 * tombstone window (`claim.retention.tombstoneMs`), which the row keeps for the janitor; a
 * `null` result leaves the result as the claim wrote it (none), for a run that only has a
 * tombstone window to keep.
 */
export function fastPathResultStatement(schema: string, claim: Claim, resultJson: string | null): CompiledQuery {
  return prepared(
    CompiledQuery.raw(`select ${pg.escapeIdentifier(schema)}.store_fast_path_result($1::text, $2::text, $3::uuid, $4::jsonb, $5::bigint)`, [
      claim.scope,
      claim.key,
      claim.owner,
      resultJson,
      claim.retention?.tombstoneMs ?? null,
    ]),
  );
}

/**
 * Moves a fast-path key's retention window to start now, just before its transaction's COMMIT,
 * its length kept, when the transaction has run longer than `windowStartToleranceMs`
 * (`../retention-window.ts`) since the claim started the window (`now()`, the transaction's
 * start); a shorter one leaves the row as it is. Without it, a transaction longer than the
 * window would commit a key already expired, and a redelivery after the next janitor pass would
 * run the effect again. Sent only for a transaction the caller saw run long: it changes
 * `expires_at`, which an index covers, so it is not a HOT update, and the common short
 * transaction does not pay for the check.
 *
 * The length is taken as elapsed time: `expires_at - completed_at` itself counts whole days, and
 * a day added to a timestamp follows the session's time zone, so a window moved across a
 * daylight-saving change would come out an hour short. Plain SQL, planned on each use: it is rare.
 */
export function moveWindowToCommitStatement(schema: string, claim: Claim): CompiledQuery {
  return CompiledQuery.raw(
    `update ${pg.escapeIdentifier(schema)}.idempotency_keys as k
        set completed_at = c.at, expires_at = c.at + extract(epoch from k.expires_at - k.completed_at) * interval '1 second'
       from (select clock_timestamp() as at) as c
      where k.scope = $1 and k.key = $2 and k.owner = $3::uuid
        and c.at - k.completed_at > least(interval '1 second', (k.expires_at - k.completed_at) / 100)`,
    [claim.scope, claim.key, claim.owner],
  );
}

/**
 * DDL of `store_fast_path_result(scope, key, owner, result, tombstone_ms)`: stores the effect's
 * result (and the key's own tombstone window; null by default, for callers of an earlier
 * version) on a key the fast path claimed as `completed` in this same transaction. Its row is locked by the
 * transaction since the claim, so the UPDATE cannot miss; the owner condition only documents
 * whose row this is. Only `result` and `tombstone_ms` change, which no index covers, so with the table's spare
 * room per page (fillfactor, migration 007) this is a HOT update: no index entries. (A
 * transaction that ran long also moves the key's retention window: {@link moveWindowToCommitStatement}.)
 *
 * PL/pgSQL, not SQL: Postgres caches a PL/pgSQL function's plans for the session, while a
 * `language sql` function's body is parsed and planned again on every call (migration 007
 * installed it so: 7% of the machine's CPU in a fast-path drain went to `fmgr_sql`; migration
 * 009 replaced it).
 */
export function storeFastPathResultFunctionDdl(schema: string) {
  return sql`
    create or replace function ${sql.id(schema, 'store_fast_path_result')}(
      p_scope text, p_key text, p_owner uuid, p_result jsonb, p_tombstone_ms bigint default null)
    returns void
    language plpgsql volatile as $store_result$
    begin
      update ${sql.id(schema, 'idempotency_keys')} as k set result = p_result, tombstone_ms = p_tombstone_ms
       where k.scope = p_scope and k.key = p_key and k.owner = p_owner;
    end;
    $store_result$`;
}

