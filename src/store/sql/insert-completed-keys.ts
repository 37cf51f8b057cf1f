import { CompiledQuery, sql } from 'kysely';
import pg from 'pg';
import { compareLockOrder } from '../lock-order.js';
import type { CompletedKeyRow } from '../records.js';

/**
 * SQLSTATE `insert_completed_keys` raises when some of its keys already have a row; the
 * error's `detail` lists their positions (1-based, in the order the statement was given them).
 */
export const KEYS_HAVE_ROWS_STATE = 'IJ002';

/**
 * A group's fast-path keys, written once each at the group's end, in the pipeline of its COMMIT:
 * every key inserted as `completed` with its result, as the fast path's claim followed by its
 * result would leave it (fence 1, attempts 1, owner the claim's token). One call of
 * `insert_completed_keys` ({@link insertCompletedKeysFunctionDdl}).
 *
 * A key that has a row (settled, leased, or inserted by a transaction that committed while the
 * group ran) is not inserted, and the function then raises {@link KEYS_HAVE_ROWS_STATE} naming
 * those keys: the COMMIT after it never runs, the group rolls back, and exactly those keys' jobs
 * run alone (claim first), the others together again. Writing the key after the effect is
 * invisible to every other transaction, since both commit together: a concurrent duplicate that
 * inserted the key first wins, and this group's insert waits on its index entry, then finds it.
 *
 * The wait is bounded by `lockTimeoutMs`. Rows go in lock order (`lock-order.ts`), so two groups
 * that share keys wait in one order; `rows` says which row each position of the error's detail is.
 */
export function insertCompletedKeysStatement(
  schema: string,
  rows: readonly CompletedKeyRow[],
  lockTimeoutMs: number,
): { readonly statement: CompiledQuery; readonly rows: readonly CompletedKeyRow[] } {
  const ordered = [...rows].sort((a, b) => compareLockOrder(a.input, b.input));
  const column = <T>(pick: (row: CompletedKeyRow) => T) => ordered.map(pick);
  const statement = CompiledQuery.raw(
    `select ${pg.escapeIdentifier(schema)}.insert_completed_keys($1::text[], $2::text[], $3::text[], $4::uuid[], $5::bigint[], $6::int, $7::text[], $8::text[], $9::text[], $10::jsonb[], $11::jsonb[], $12::bigint[])`,
    [
      column((r) => r.input.scope),
      column((r) => r.input.key),
      column((r) => r.input.fingerprint),
      column((r) => r.input.owner),
      column((r) => r.input.retentionMs),
      lockTimeoutMs,
      column((r) => r.input.jobId ?? null),
      column((r) => r.input.queue ?? null),
      column((r) => r.input.jobName ?? null),
      column((r) => r.input.payloadJson ?? null),
      column((r) => r.resultJson),
      column((r) => r.input.tombstoneMs ?? null),
    ],
  );
  return { statement, rows: ordered };
}

/** The rows (of `rows`, as {@link insertCompletedKeysStatement} ordered them) that a {@link KEYS_HAVE_ROWS_STATE} error names. */
export function rowsThatHadKeys<R>(error: unknown, rows: readonly R[]): R[] | undefined {
  const { code, detail } = (error ?? {}) as { code?: unknown; detail?: unknown };
  if (code !== KEYS_HAVE_ROWS_STATE || typeof detail !== 'string') return undefined;
  const named = detail.split(',').map((position) => rows[Number(position) - 1]);
  return named.every((row) => row !== undefined) ? (named as R[]) : undefined;
}

/**
 * DDL of `insert_completed_keys` (see {@link insertCompletedKeysStatement}), for the migration that
 * installs it. `on conflict do nothing`, then the positions whose key was not inserted (it has a
 * row): raised, so nothing of the group commits. Each key's retention window starts here, at the
 * group's end (`clock_timestamp()`), not at the group transaction's start (`now()`): a group
 * that ran longer than a window would otherwise commit keys already expired. `lock_timeout` is set for the insert and put back
 * before it returns, as `claim_key` does. `p_tombstone_ms`, the keys' own tombstone windows,
 * defaults to null for callers of an earlier version: `unnest` pads a missing array with nulls.
 */
export function insertCompletedKeysFunctionDdl(schema: string) {
  const table = sql.id(schema, 'idempotency_keys');
  return sql`
    create or replace function ${sql.id(schema, 'insert_completed_keys')}(
      p_scopes text[], p_keys text[], p_fingerprints text[], p_owners uuid[], p_retention_ms bigint[],
      p_lock_timeout_ms int, p_job_ids text[], p_queues text[], p_job_names text[], p_payloads jsonb[], p_results jsonb[],
      p_tombstone_ms bigint[] default null)
    returns void
    language plpgsql volatile as $insert_completed_keys$
    declare
      v_prior_lock_timeout text := current_setting('lock_timeout');
      v_had_rows int[];
    begin
      perform set_config('lock_timeout', p_lock_timeout_ms::text, true);
      with inserted as (
        insert into ${table} as k
          (scope, key, fingerprint, status, owner, fence, attempts, job_id, queue, job_name, payload, result, completed_at, expires_at, tombstone_ms)
        select u.scope, u.key, u.fingerprint, 'completed', u.owner, 1, 1, u.job_id, u.queue, u.job_name, u.payload, u.result,
               clock_timestamp(), clock_timestamp() + u.retention_ms * interval '1 millisecond', u.tombstone_ms
          from unnest(p_scopes, p_keys, p_fingerprints, p_owners, p_retention_ms, p_job_ids, p_queues, p_job_names, p_payloads, p_results, p_tombstone_ms)
               with ordinality as u(scope, key, fingerprint, owner, retention_ms, job_id, queue, job_name, payload, result, tombstone_ms, position)
         order by u.position
        on conflict do nothing
        returning k.scope, k.key)
      select array_agg(u.position order by u.position) into v_had_rows
        from unnest(p_scopes, p_keys) with ordinality as u(scope, key, position)
       where not exists (select 1 from inserted i where i.scope = u.scope and i.key = u.key);
      perform set_config('lock_timeout', v_prior_lock_timeout, true);
      if v_had_rows is not null then
        raise exception 'keys at positions % already have rows', v_had_rows
          using errcode = ${sql.lit(KEYS_HAVE_ROWS_STATE)}, detail = array_to_string(v_had_rows, ',');
      end if;
    end;
    $insert_completed_keys$`;
}
