import { sql, type Kysely } from 'kysely';
import { toKeyRecord, type IdempotencyKeysTable, type KeyStatus, type OperatorRelease, type OperatorReleaseInput } from '../records.js';

/**
 * Operator unlock (`idempotent-jobs keys release`, the key inspector's release): makes a
 * `processing` or `failed` key claimable again at once, whatever its owner or lease. The key
 * becomes `processing` with no owner and a lease that ended now, exactly like a worker's
 * retryable release, so the next claim takes it over (fence + 1); a worker still holding it is
 * fenced out, because its completion matches the owner token, which is now null. The release
 * is recorded in `error` (`{released_by_operator: true, reason, by, at, previous_status,
 * previous_error}`) and as a `release` row of `key_audit`, in the same statement: there is no
 * release without its record.
 *
 * Completed keys are refused (the WHERE excludes them): releasing one would run a finished
 * effect again. The row is locked in the CTE so the recorded previous status is the one that
 * was replaced. Returns undefined when no row matched (missing or completed).
 */
export async function operatorReleaseKey(db: Kysely<any>, schema: string, input: OperatorReleaseInput): Promise<OperatorRelease | undefined> {
  const { scope, key, reason, actor } = input;
  const table = sql.id(schema, 'idempotency_keys');
  const { rows } = await sql<IdempotencyKeysTable & { previous_status: KeyStatus }>`
    with before as (
      select scope, key, status, error, fence
        from ${table}
       where scope = ${scope} and key = ${key} and status in ('processing', 'failed')
         for update
    ),
    released as (
      update ${table} as k
         set status = 'processing',
             owner = null,
             locked_until = now(),
             result = null,
             completed_at = null,
             expires_at = null,
             updated_at = now(),
             error = jsonb_build_object(
               'released_by_operator', true,
               'reason', ${reason}::text,
               'by', ${actor}::text,
               'at', now(),
               'previous_status', b.status,
               'previous_error', b.error)
        from before as b
       where k.scope = b.scope and k.key = b.key
      returning k.*, b.status as previous_status
    ),
    recorded as (
      insert into ${sql.id(schema, 'key_audit')} (scope, key, action, actor, reason, detail)
      select scope, key, 'release', ${actor}::text, ${reason}::text,
             jsonb_build_object('previous_status', previous_status, 'fence', fence)
        from released
    )
    select * from released`.execute(db);
  const row = rows[0];
  if (!row) return undefined;
  const { previous_status: previousStatus, ...record } = row;
  return { record: toKeyRecord(record), previousStatus };
}
