import { sql, type Kysely } from 'kysely';
import type { ClaimInput } from '../records.js';

/**
 * The fast path's claim of ONE key that has no row yet, inside the caller's open transaction
 * (the fast path without group commit): inserts it as `completed` (fence 1, attempts 1),
 * exactly as `claim_key` in `'complete'` mode would, and returns true; false when the key has a
 * row (or another transaction inserted it and committed meanwhile), and the caller then claims
 * it with `claim_key` in the same transaction, which knows what to do with an existing row.
 *
 * Why a second function: `claim_key` handles every case, and pays for it on every call (a
 * set-returning function with its row materialized, a dozen PL/pgSQL expressions); this is
 * the common case alone, a scalar function around one insert. Replayed by pgbench in the
 * fast path's transaction (bench/postgres-side.sh's shape), it ran Postgres's side 12–32%
 * faster than `claim_key` (4 alternated repetitions). A key with a row costs one more round
 * trip, which the settled-key read spares duplicates in all but all-unique loads.
 *
 * A key another transaction holds uncommitted makes the insert wait, bounded by
 * `lockTimeoutMs` as in `claim_key`; the timeout (55P03) aborts the caller's transaction, and
 * the caller reports the key in progress.
 */
export async function claimNewKey(tx: Kysely<any>, schema: string, input: ClaimInput): Promise<boolean> {
  const { rows } = await sql<{ claimed: boolean }>`
    select ${sql.id(schema, 'claim_new_key')}(
      ${input.scope}::text, ${input.key}::text, ${input.fingerprint}::text, ${input.owner}::uuid, ${input.retentionMs}::bigint,
      ${input.lockTimeoutMs}::int, ${input.jobId ?? null}::text, ${input.queue ?? null}::text, ${input.jobName ?? null}::text,
      ${input.payloadJson ?? null}::jsonb) as claimed`.execute(tx);
  return rows[0]?.claimed === true;
}

/**
 * DDL of `claim_new_key` (see {@link claimNewKey}), for the migration that installs it. The
 * schema is baked in; changing the body needs a new migration that replaces the function. The
 * insert is `claim_key`'s in `'complete'` mode, column for column.
 */
export function claimNewKeyFunctionDdl(schema: string) {
  const table = sql.id(schema, 'idempotency_keys');
  return sql`
    create or replace function ${sql.id(schema, 'claim_new_key')}(
      p_scope text, p_key text, p_fingerprint text, p_owner uuid, p_retention_ms bigint,
      p_lock_timeout_ms int, p_job_id text, p_queue text, p_job_name text, p_payload jsonb)
    returns boolean
    language plpgsql volatile as $claim_new_key$
    declare
      v_prior_lock_timeout text := current_setting('lock_timeout');
      v_claimed boolean;
    begin
      perform set_config('lock_timeout', p_lock_timeout_ms::text, true);
      insert into ${table} as k
        (scope, key, fingerprint, status, owner, fence, attempts, locked_until,
         job_id, queue, job_name, payload, completed_at, expires_at)
      values (p_scope, p_key, p_fingerprint, 'completed', p_owner, 1, 1, null,
              p_job_id, p_queue, p_job_name, p_payload, now(), now() + p_retention_ms * interval '1 millisecond')
      on conflict do nothing
      returning true into v_claimed;
      perform set_config('lock_timeout', v_prior_lock_timeout, true);
      return coalesce(v_claimed, false);
    end;
    $claim_new_key$`;
}
