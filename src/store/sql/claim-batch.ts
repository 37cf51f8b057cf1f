import { sql, type Kysely } from 'kysely';
import { keySettledChannel } from '../channels.js';
import type { ClaimRow, ClaimStatementInput } from './claim.js';

/** A `claim_keys` row: the claim row of input number `idx` (1-based). */
export interface BatchClaimRow extends ClaimRow {
  readonly idx: number;
}

/**
 * Several leased claims in ONE statement, one round trip and one commit: `claim_keys` runs
 * `claim_key` (see `claim.ts`) for each input in the order given. They commit together, which is
 * only a group commit: each claim is the same independent claim as alone. Two claims of the same
 * key in one batch see each other (the second finds the first's live lease: in progress).
 *
 * The caller sorts the inputs by (scope, key), so two batches that share keys lock them in the
 * same order and cannot deadlock. Any error (a `lock_timeout` on one key, say) aborts the whole
 * statement and nothing of it commits; the caller then claims each key alone. An input that
 * returns no row, or a row that needs another look, is claimed again alone as well.
 *
 * All inputs must be `'lease'` claims; `synchronousCommit: false` applies when every input asks
 * for it.
 */
export async function claimKeysBatch(db: Kysely<any>, schema: string, inputs: readonly ClaimStatementInput[]): Promise<BatchClaimRow[]> {
  const column = <T>(pick: (input: ClaimStatementInput) => T) => inputs.map(pick);
  const asyncCommit = inputs.every((input) => input.synchronousCommit === false);
  const { rows } = await sql<BatchClaimRow>`
    select * from ${sql.id(schema, 'claim_keys')}(
      ${column((i) => i.scope)}::text[], ${column((i) => i.key)}::text[], ${column((i) => i.fingerprint)}::text[],
      ${column((i) => i.owner)}::uuid[], ${column((i) => i.leaseMs)}::int[], ${column((i) => i.retentionMs)}::bigint[],
      ${column((i) => i.lockTimeoutMs)}::int[], ${asyncCommit}::boolean,
      ${column((i) => i.jobId ?? null)}::text[], ${column((i) => i.queue ?? null)}::text[], ${column((i) => i.jobName ?? null)}::text[],
      ${column((i) => i.payloadJson ?? null)}::jsonb[], ${keySettledChannel(schema)}::text)`.execute(db);
  return rows;
}

/**
 * DDL of `claim_keys` (see {@link claimKeysBatch}), for the migration that installs it. The
 * schema is baked in; changing the body needs a new migration that replaces the function.
 */
export function claimKeysFunctionDdl(schema: string) {
  return sql`
    create or replace function ${sql.id(schema, 'claim_keys')}(
      p_scopes text[], p_keys text[], p_fingerprints text[], p_owners uuid[], p_lease_ms int[],
      p_retention_ms bigint[], p_lock_timeout_ms int[], p_async_commit boolean,
      p_job_ids text[], p_queues text[], p_job_names text[], p_payloads jsonb[], p_channel text)
    returns table (idx int, outcome text, fence bigint, attempts int, locked_until timestamptz, status text,
                   fingerprint text, claimable boolean, result jsonb, error jsonb, retry_after_ms bigint)
    language plpgsql volatile as $claim_keys$
    #variable_conflict use_column
    begin
      for i in 1 .. coalesce(array_length(p_keys, 1), 0) loop
        return query
          select i, c.*
            from ${sql.id(schema, 'claim_key')}(
                   p_scopes[i], p_keys[i], p_fingerprints[i], p_owners[i], 'lease',
                   p_lease_ms[i], p_retention_ms[i], p_lock_timeout_ms[i], p_async_commit,
                   p_job_ids[i], p_queues[i], p_job_names[i], p_payloads[i], p_channel) as c;
      end loop;
    end;
    $claim_keys$`;
}
