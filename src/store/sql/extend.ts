import { sql, type Kysely } from 'kysely';
import type { Claim } from '../claim-outcome.js';
import type { LeaseExtension } from '../records.js';

/**
 * Heartbeat: pushes the lease to `now() + leaseMs` (database clock) if this claim still owns
 * the key, in one statement calling the `extend_lease` function ({@link extendLeaseFunctionDdl}).
 *
 * Why a function: the UPDATE may wait on the key's row lock, which a transaction that is
 * completing the key holds until it commits (a group commit's shared transaction holds it for
 * the whole group). The wait is bounded by `lockTimeoutMs`, set local to the statement as the
 * claim does; on expiry the statement fails with a lock timeout (55P03), which means "not
 * known yet": the caller tries again at its next beat, and never reads it as a lost lease.
 * When the wait ends because that transaction committed this claim's completion, the UPDATE
 * matches nothing, and the function tells that apart from a loss by reading the row again
 * (a fresh snapshot): completed under the same owner and fence is `'completed'`.
 */
export async function extendLease(
  db: Kysely<any>,
  schema: string,
  claim: Claim,
  leaseMs: number,
  lockTimeoutMs: number,
): Promise<LeaseExtension> {
  const { rows } = await sql<{ outcome: 'extended' | 'completed' | 'lost'; locked_until: Date | null }>`
    select * from ${sql.id(schema, 'extend_lease')}(
      ${claim.scope}::text, ${claim.key}::text, ${claim.owner}::uuid, ${claim.fence}::bigint,
      ${leaseMs}::int, ${lockTimeoutMs}::int)`.execute(db);
  const row = rows[0];
  if (row?.outcome === 'extended' && row.locked_until) return row.locked_until;
  if (row?.outcome === 'completed') return 'completed';
  return null;
}

/**
 * DDL of `extend_lease` (see {@link extendLease}), for the migration that installs it. The
 * schema is baked in; changing the body needs a new migration that replaces the function.
 */
export function extendLeaseFunctionDdl(schema: string) {
  const table = sql.id(schema, 'idempotency_keys');
  return sql`
    create or replace function ${sql.id(schema, 'extend_lease')}(
      p_scope text, p_key text, p_owner uuid, p_fence bigint, p_lease_ms int, p_lock_timeout_ms int)
    returns table (outcome text, locked_until timestamptz)
    language plpgsql volatile as $extend_lease$
    #variable_conflict use_column
    declare
      v_prior_lock_timeout text := current_setting('lock_timeout');
      v_locked_until timestamptz;
    begin
      perform set_config('lock_timeout', p_lock_timeout_ms::text, true);
      update ${table} as k
         set locked_until = now() + p_lease_ms * interval '1 millisecond',
             updated_at = now()
       where k.scope = p_scope and k.key = p_key
         and k.owner = p_owner and k.fence = p_fence
         and k.status = 'processing'
      returning k.locked_until into v_locked_until;
      perform set_config('lock_timeout', v_prior_lock_timeout, true);
      if v_locked_until is not null then
        return query select 'extended'::text, v_locked_until;
        return;
      end if;
      return query
        select case when exists (
                 select 1 from ${table} as k
                  where k.scope = p_scope and k.key = p_key
                    and k.owner = p_owner and k.fence = p_fence
                    and k.status = 'completed')
               then 'completed' else 'lost' end,
               null::timestamptz;
    end;
    $extend_lease$`;
}
