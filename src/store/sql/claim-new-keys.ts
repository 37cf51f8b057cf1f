import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import type { Claim } from '../claim-outcome.js';
import { compareLockOrder, type KeyIdentity } from '../lock-order.js';
import type { ClaimInput } from '../records.js';

/**
 * The fast path's claims for a whole commit group in ONE statement, inside the group's open
 * transaction: every key that has no row yet is inserted as `completed` (fence 1, attempts 1),
 * exactly as `claim_key` in `'complete'` mode would insert it. Returns, for each input, whether
 * it was claimed that way. A key that already has a row is left alone: its job claims it itself
 * with `claim_key`, which knows what to do with an existing row (replay, take over, wait,
 * refuse a reused key). So is the second input of one key: it must see the first one's outcome.
 *
 * Fresh inserts only, because their undo is exact: a job of the group whose effect fails
 * cannot roll back to a savepoint taken before this statement (that would undo every key of
 * the batch), so its claim is undone by deleting the row ({@link unclaimNewKeyText}), which
 * puts the key back as it was: absent. Nothing outside the transaction ever saw the row.
 *
 * Keys are inserted in lock order (`lock-order.ts`), so two groups insert shared keys in one order. A
 * key another transaction holds uncommitted makes the statement wait, bounded by the inputs'
 * `lockTimeoutMs` (set for the statement and put back before it returns, as `claim_key` does);
 * a timeout or any other error fails the whole statement, and the caller, which runs it inside
 * a savepoint, rolls back to that savepoint and lets each job claim its key alone.
 */
export async function claimNewKeys(tx: Kysely<any>, schema: string, inputs: readonly ClaimInput[]): Promise<boolean[]> {
  const identity = (k: KeyIdentity) => `${k.scope}\u0000${k.key}`;
  const firsts: ClaimInput[] = [];
  const seen = new Set<string>();
  for (const input of inputs) {
    if (seen.has(identity(input))) continue;
    seen.add(identity(input));
    firsts.push(input);
  }
  if (firsts.length === 0) return [];
  firsts.sort(compareLockOrder);
  const column = <T>(pick: (input: ClaimInput) => T) => firsts.map(pick);
  const lockTimeoutMs = Math.max(...firsts.map((input) => input.lockTimeoutMs));
  const { rows } = await sql<KeyIdentity>`
    select * from ${sql.id(schema, 'claim_new_keys')}(
      ${column((i) => i.scope)}::text[], ${column((i) => i.key)}::text[], ${column((i) => i.fingerprint)}::text[],
      ${column((i) => i.owner)}::uuid[], ${column((i) => i.retentionMs)}::bigint[], ${lockTimeoutMs}::int,
      ${column((i) => i.jobId ?? null)}::text[], ${column((i) => i.queue ?? null)}::text[], ${column((i) => i.jobName ?? null)}::text[],
      ${column((i) => i.payloadJson ?? null)}::jsonb[])`.execute(tx);
  const claimed = new Set(rows.map(identity));
  const first = new Set(firsts);
  return inputs.map((input) => first.has(input) && claimed.has(identity(input)));
}

/**
 * Undoes one claim of {@link claimNewKeys} inside the same transaction, as literal SQL (it
 * travels with the group's next statement): deletes the row this claim inserted (matched by
 * its owner token, so nobody else's row can go).
 */
export function unclaimNewKeyText(schema: string, claim: Claim): string {
  return `delete from ${pg.escapeIdentifier(schema)}.idempotency_keys where scope = ${pg.escapeLiteral(claim.scope)} and key = ${pg.escapeLiteral(claim.key)} and owner = ${pg.escapeLiteral(claim.owner)}::uuid`;
}

/**
 * DDL of `claim_new_keys` (see {@link claimNewKeys}), for the migration that installs it. The
 * schema is baked in; changing the body needs a new migration that replaces the function.
 * Inserted in input order (`with ordinality`), so row locks are taken in the caller's order.
 */
export function claimNewKeysFunctionDdl(schema: string) {
  const table = sql.id(schema, 'idempotency_keys');
  return sql`
    create or replace function ${sql.id(schema, 'claim_new_keys')}(
      p_scopes text[], p_keys text[], p_fingerprints text[], p_owners uuid[], p_retention_ms bigint[],
      p_lock_timeout_ms int, p_job_ids text[], p_queues text[], p_job_names text[], p_payloads jsonb[])
    returns table (scope text, key text)
    language plpgsql volatile as $claim_new_keys$
    #variable_conflict use_column
    declare
      v_prior_lock_timeout text := current_setting('lock_timeout');
    begin
      perform set_config('lock_timeout', p_lock_timeout_ms::text, true);
      return query
        insert into ${table} as k
          (scope, key, fingerprint, status, owner, fence, attempts, locked_until,
           job_id, queue, job_name, payload, completed_at, expires_at)
        select u.scope, u.key, u.fingerprint, 'completed', u.owner, 1, 1, null,
               u.job_id, u.queue, u.job_name, u.payload, now(), now() + u.retention_ms * interval '1 millisecond'
          from unnest(p_scopes, p_keys, p_fingerprints, p_owners, p_retention_ms, p_job_ids, p_queues, p_job_names, p_payloads)
               with ordinality as u(scope, key, fingerprint, owner, retention_ms, job_id, queue, job_name, payload, position)
         order by u.position
        on conflict do nothing
        returning k.scope, k.key;
      perform set_config('lock_timeout', v_prior_lock_timeout, true);
    end;
    $claim_new_keys$`;
}
