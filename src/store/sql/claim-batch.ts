import { CompiledQuery, sql, type Kysely } from 'kysely';
import pg from 'pg';
import { prepared } from '../named-statements.js';
import { keySettledChannel } from '../channels.js';
import { concurrencyRecordsText } from './claim.js';
import type { BatchClaimRow, ClaimStatementInput } from '../records.js';

/**
 * Several leased claims in ONE statement, one round trip and one commit: `claim_keys` claims
 * each input exactly as `claim_key` (see `claim.ts`) would, in the order given. They commit
 * together, which is only a group commit: each claim is the same independent claim as alone.
 * Two claims of the same key in one batch see each other (the second finds the first's live
 * lease: in progress).
 *
 * The caller sorts the inputs by (scope, key), so two batches that share keys lock them in the
 * same order. Any error (a `lock_timeout` on one key, a deadlock) aborts the whole statement
 * and nothing of it commits; the caller then claims each key alone. An input that returns no
 * row, or a row that needs another look, is claimed again alone as well.
 *
 * All inputs must be `'lease'` claims; `synchronousCommit: false` applies when every input asks
 * for it.
 */
export async function claimKeysBatch(db: Kysely<any>, schema: string, inputs: readonly ClaimStatementInput[]): Promise<BatchClaimRow[]> {
  const column = <T>(pick: (input: ClaimStatementInput) => T) => inputs.map(pick);
  const asyncCommit = inputs.every((input) => input.synchronousCommit === false);
  const records = inputs.flatMap((input) => (input.concurrency ?? []).map((record) => ({ input, record })));
  const parameters: unknown[] = [
    column((i) => i.scope),
    column((i) => i.key),
    column((i) => i.fingerprint),
    column((i) => i.owner),
    column((i) => i.leaseMs),
    column((i) => i.retentionMs),
    column((i) => i.lockTimeoutMs),
    asyncCommit,
    column((i) => i.jobId ?? null),
    column((i) => i.queue ?? null),
    column((i) => i.jobName ?? null),
    column((i) => i.payloadJson ?? null),
    keySettledChannel(schema),
  ];
  if (records.length > 0) {
    parameters.push(
      records.map((r) => r.input.scope),
      records.map((r) => r.input.key),
      records.map((r) => r.record.key),
      records.map((r) => r.record.limit),
    );
  }
  const { rows } = await db.executeQuery<BatchClaimRow>(prepared(CompiledQuery.raw(claimKeysText(schema, records.length > 0), parameters)));
  return rows;
}

/** The batch claim's texts per schema (and whether it records concurrency): one string each, so that each is one named prepared statement (see `named-statements.ts`). */
const claimKeysTexts = new Map<string, string>();

function claimKeysText(schema: string, recordsConcurrency: boolean): string {
  const textKey = recordsConcurrency ? `${schema}\u0000records` : schema;
  let text = claimKeysTexts.get(textKey);
  if (text === undefined) {
    const call =
      `select * from ${pg.escapeIdentifier(schema)}."claim_keys"($1::text[], $2::text[], $3::text[], $4::uuid[], $5::int[], $6::bigint[], ` +
      `$7::int[], $8::boolean, $9::text[], $10::text[], $11::text[], $12::jsonb[], $13::text)`;
    const wanted = 'select * from unnest($14::text[], $15::text[], $16::text[], $17::int[]) as w(scope, key, group_key, concurrency_limit)';
    text = recordsConcurrency ? `${concurrencyRecordsText(schema, wanted)} ${call}` : call;
    claimKeysTexts.set(textKey, text);
  }
  return text;
}

/**
 * DDL of `claim_keys` (see {@link claimKeysBatch}), for the migrations that install it. The
 * schema is baked in; changing the body needs a new migration that replaces the function.
 *
 * Set-based since migration 010: every key without a row is inserted by ONE `INSERT … SELECT
 * FROM unnest … ON CONFLICT DO NOTHING` (input order, so row locks are taken in the caller's
 * order), exactly as `claim_key` would insert it; only the others (an existing row: replay,
 * takeover, live lease, reused key; or the second input of one key) go through `claim_key`,
 * one call each. The loop of `claim_key` calls it replaces cost a function call, two
 * `set_config`s and a statement per key: in pgbench (bench/postgres-side.sh's leased shape with
 * 8 claims a batch, old and new side by side) this ran the leased path's Postgres side 1–26%
 * faster, 12% at the median of 4 repetitions.
 *
 * An inserted row is told apart by its owner token, which is fresh for every input. The insert
 * waits on a key another transaction holds uncommitted for at most the largest of the inputs'
 * lock timeouts (they are normally one setting), then `lock_timeout` is put back, as `claim_key`
 * does; each `claim_key` call bounds its own waits.
 */
export function claimKeysFunctionDdl(schema: string) {
  const table = sql.id(schema, 'idempotency_keys');
  return sql`
    create or replace function ${sql.id(schema, 'claim_keys')}(
      p_scopes text[], p_keys text[], p_fingerprints text[], p_owners uuid[], p_lease_ms int[],
      p_retention_ms bigint[], p_lock_timeout_ms int[], p_async_commit boolean,
      p_job_ids text[], p_queues text[], p_job_names text[], p_payloads jsonb[], p_channel text)
    returns table (idx int, outcome text, fence bigint, attempts int, locked_until timestamptz, status text,
                   fingerprint text, claimable boolean, result jsonb, error jsonb, retry_after_ms bigint)
    language plpgsql volatile as $claim_keys$
    #variable_conflict use_column
    declare
      v_prior_lock_timeout text := current_setting('lock_timeout');
      v_inserted_owners uuid[];
      v_inserted_leases timestamptz[];
      v_position int;
    begin
      perform set_config('lock_timeout', (select max(t) from unnest(p_lock_timeout_ms) as t)::text, true);
      if p_async_commit then
        perform set_config('synchronous_commit', 'off', true);
      end if;
      with inserted as (
        insert into ${table} as k
          (scope, key, fingerprint, status, owner, fence, attempts, locked_until, job_id, queue, job_name, payload)
        select u.scope, u.key, u.fingerprint, 'processing', u.owner, 1, 1, now() + u.lease_ms * interval '1 millisecond',
               u.job_id, u.queue, u.job_name, u.payload
          from unnest(p_scopes, p_keys, p_fingerprints, p_owners, p_lease_ms, p_job_ids, p_queues, p_job_names, p_payloads)
               with ordinality as u(scope, key, fingerprint, owner, lease_ms, job_id, queue, job_name, payload, position)
         order by u.position
        on conflict do nothing
        returning k.owner, k.locked_until
      )
      select array_agg(inserted.owner), array_agg(inserted.locked_until) into v_inserted_owners, v_inserted_leases from inserted;
      perform set_config('lock_timeout', v_prior_lock_timeout, true);

      for i in 1 .. coalesce(array_length(p_keys, 1), 0) loop
        v_position := array_position(v_inserted_owners, p_owners[i]);
        if v_position is not null then
          -- The row claim_key returns for a fresh insert.
          return query select i, 'claimed'::text, 1::bigint, 1, v_inserted_leases[v_position],
                              null::text, null::text, false, null::jsonb, null::jsonb, 0::bigint;
        else
          return query
            select i, c.*
              from ${sql.id(schema, 'claim_key')}(
                     p_scopes[i], p_keys[i], p_fingerprints[i], p_owners[i], 'lease',
                     p_lease_ms[i], p_retention_ms[i], p_lock_timeout_ms[i], p_async_commit,
                     p_job_ids[i], p_queues[i], p_job_names[i], p_payloads[i], p_channel) as c;
        end if;
      end loop;
    end;
    $claim_keys$`;
}
