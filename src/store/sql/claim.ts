import { CompiledQuery, sql, type Kysely } from 'kysely';
import pg from 'pg';
import { ClaimContendedError } from '../../errors.js';
import { keySettledChannel } from '../channels.js';
import { lockWaitTimedOut, tombstoneOutcome, type ClaimOutcome } from '../claim-outcome.js';
import { isLockTimeout, outcomeUnknown } from '../pg-errors.js';
import type { ClaimRow, ClaimStatementInput } from '../records.js';
import { prepared } from '../named-statements.js';
import { tombstoneOf } from './tombstones.js';

// Each retry needs a concurrent writer to have changed the row between two statements; five
// in a row means heavy contention on one key, which the caller treats as "in progress".
const MAX_STATEMENTS = 5;

/**
 * The claim: one statement, one round trip in every uncontended case. The statement calls the
 * `claim_key` function that {@link claimKeyFunctionDdl} defines (migration
 * `003_claim_key_function`): a PL/pgSQL function keeps its plans per session, so the claim is
 * parsed and planned once per connection instead of once per job (a single-statement CTE doing
 * the same spends more time in the planner than in execution), and its text on the wire is short.
 *
 * Inside the function:
 * 1. `INSERT … ON CONFLICT DO NOTHING`; the primary key (scope, key) is the arbiter, never a
 *    check-then-insert. A concurrent uncommitted insert of the same key makes this wait
 *    (bounded by `lock_timeout`, set first) and then do nothing.
 * 2. if nothing was inserted, one conditional UPDATE takes a `processing` key whose lease has
 *    expired (or which was released: owner null) and whose fingerprint matches: new owner,
 *    fence + 1, a new lease. Concurrent takers serialize on the row lock and Postgres re-checks
 *    the WHERE on the newest row version, so exactly one wins. The job that takes over is now
 *    the key's job: its id, queue and name replace the old job's (the sweeper asks that queue
 *    about that job), unless it names no job (a claim made outside BullMQ keeps the old ones).
 * 3. otherwise the existing row is returned for the caller to classify. A `processing` row
 *    held under this very owner token is this claim's own: an earlier run of the same claim
 *    committed but its reply was lost (the claim batcher then claims each input again alone,
 *    with the same token), so it is returned as `claimed` (or `taken-over`) with the row's
 *    fence, not as another owner's key in progress.
 *
 * A new key whose tombstone is live (it finished before and the janitor has deleted it) is
 * refused by the keys table's trigger (`sql/tombstones.ts`): the outcome is `completed` or
 * `failed` with `resultExpired`, or `key-reused` for another fingerprint, and nothing is inserted.
 *
 * Each step takes a fresh snapshot (read committed), so a row committed by someone else between
 * steps is seen by the next one. What remains racy: the row can be deleted (janitor) between
 * 1 and 3 (no row), or taken over between 2 and 3 (a row that looks claimable although the
 * UPDATE lost its race). Both mean "someone just changed this key": run the statement again.
 *
 * `lock_timeout` is set local to the transaction (for an autocommit claim, the statement) and
 * put back to its previous value before the function returns, so inside the fast path's
 * transaction the effect runs under the session's usual `lock_timeout` with no extra round
 * trip. Its expiry (55P03) means another transaction holds this key uncommitted, i.e. the key
 * is in progress.
 *
 * With `synchronousCommit: false`, a leased claim (an autocommit statement) also sets
 * `synchronous_commit` to off for itself: its commit is visible to every other session at once,
 * as always, but does not wait for the WAL flush (about 2 ms per commit on this kind of disk).
 * Only a Postgres crash can lose such a claim, and only one that nothing durable has followed:
 * WAL is flushed in order, so the effect's synchronous commit makes the claim durable too. A
 * worker whose claim was lost finds no matching row at completion (fenced by owner token), so
 * its effect rolls back; the key is claimed again. The price: after such a crash a fence
 * number may be handed out twice, so downstream systems fencing on `ctx.fence` alone lose
 * that guarantee across a database crash (the owner token still fences this database).
 */
export async function claimKey(db: Kysely<any>, input: ClaimStatementInput): Promise<ClaimOutcome> {
  const { scope, key } = input;
  let askedAgain = false;
  for (let statement = 1; statement <= MAX_STATEMENTS; statement++) {
    let row: ClaimRow | undefined;
    try {
      row = (await db.executeQuery<ClaimRow>(claimStatement(input))).rows[0];
    } catch (error) {
      if (isLockTimeout(error)) return lockWaitTimedOut(input);
      const tombstone = tombstoneOf(error);
      if (tombstone) return tombstoneOutcome(input, tombstone);
      // The connection failed: the claim may have committed with its reply lost, leaving the key
      // held by a claim nobody knows of until its lease ends. Asked once more with the same
      // owner token (on another connection), the function finds such a row to be this claim's
      // own and returns it, or claims the key if the first did not.
      if (!askedAgain && outcomeUnknown(error)) {
        askedAgain = true;
        statement--;
        continue;
      }
      throw error;
    }
    const outcome = classifyClaimRow(input, row);
    if (outcome !== 'again') return outcome;
  }
  throw new ClaimContendedError(scope, key, MAX_STATEMENTS);
}

/** What one claim row means for `input`, or `'again'` when the statement must be run again. */
export function classifyClaimRow(input: ClaimStatementInput, row: ClaimRow | undefined): ClaimOutcome | 'again' {
  const { scope, key } = input;
  if (!row) return 'again'; // deleted concurrently between the function's steps: look again
  if (row.outcome === 'claimed' || row.outcome === 'taken-over') {
    return {
      kind: row.outcome,
      scope,
      key,
      owner: input.owner,
      fence: Number(row.fence),
      attempts: row.attempts,
      lockedUntil: row.locked_until,
    };
  }
  if (row.fingerprint !== input.fingerprint) return { kind: 'key-reused', scope, key };
  if (row.status === 'completed') return { kind: 'completed', scope, key, result: row.result };
  if (row.status === 'failed') return { kind: 'failed', scope, key, error: row.error };
  if (row.claimable) return 'again'; // taken over concurrently between the function's steps: look again
  return { kind: 'in-progress', scope, key, retryAfterMs: Math.max(1, Number(row.retry_after_ms)) };
}

/** The claim's texts per schema (and whether it records concurrency): one string each, so that each is one named prepared statement (see `named-statements.ts`). */
const claimTexts = new Map<string, string>();

function claimStatement(input: ClaimStatementInput): CompiledQuery<ClaimRow> {
  const completing = input.mode === 'complete';
  // Never in 'complete' mode: that would make the caller's transaction, effect included, async.
  const asyncCommit = !completing && input.synchronousCommit === false;
  const records = !completing && input.concurrency?.length ? input.concurrency : undefined;
  const textKey = records ? `${input.schema}\u0000records` : input.schema;
  let text = claimTexts.get(textKey);
  if (text === undefined) {
    const call =
      `select * from ${pg.escapeIdentifier(input.schema)}."claim_key"($1::text, $2::text, $3::text, $4::uuid, $5::text, $6::int, $7::bigint, ` +
      `$8::int, $9::boolean, $10::text, $11::text, $12::text, $13::jsonb, $14::text)`;
    const wanted = 'select $1::text as scope, $2::text as key, w.group_key, w.concurrency_limit from unnest($15::text[], $16::int[]) as w(group_key, concurrency_limit)';
    text = records ? `${concurrencyRecordsText(input.schema, wanted)} ${call}` : call;
    claimTexts.set(textKey, text);
  }
  const parameters: unknown[] = [
    input.scope,
    input.key,
    input.fingerprint,
    input.owner,
    input.mode,
    input.leaseMs,
    input.retentionMs,
    input.lockTimeoutMs,
    asyncCommit,
    input.jobId ?? null,
    input.queue ?? null,
    input.jobName ?? null,
    input.payloadJson ?? null,
    keySettledChannel(input.schema),
  ];
  if (records) parameters.push(records.map((r) => r.key), records.map((r) => r.limit));
  return prepared(CompiledQuery.raw(text, parameters)) as CompiledQuery<ClaimRow>;
}

/**
 * The common table expressions that record the concurrency keys a claim's run holds slots of
 * (`ClaimStatementInput.concurrency`), ahead of the claim's call in one statement: each key's
 * records of other concurrency keys dropped, and its records written (its limit and time renewed
 * when already there), as `acquire_concurrency_slot` records the key it takes a slot for. The
 * records are written whatever the claim answers, as a take writes them before its claim is
 * made; a claim that fails (a tombstone, a lock timeout) writes nothing. `wanted`: a query of the
 * records, one row each, with the columns `scope`, `key`, `group_key` and `concurrency_limit`.
 */
export function concurrencyRecordsText(schema: string, wanted: string): string {
  const limits = `${pg.escapeIdentifier(schema)}."key_concurrency_limits"`;
  // Distinct, in the rows' order: a batch may claim one key twice, and two statements that write
  // the same records lock them in one order.
  return (
    `with wanted as (${wanted}), ` +
    `concurrency_dropped as (delete from ${limits} as r using (select scope, key, array_agg(group_key) as group_keys from wanted group by scope, key) as k ` +
    `where r.scope = k.scope and r.key = k.key and r.group_key <> all(k.group_keys)), ` +
    `concurrency_recorded as (insert into ${limits} as r (scope, key, group_key, concurrency_limit) ` +
    `select distinct on (scope, key, group_key) scope, key, group_key, concurrency_limit from wanted order by scope, key, group_key ` +
    `on conflict (scope, key, group_key) do update set concurrency_limit = excluded.concurrency_limit, recorded_at = now())`
  );
}

/**
 * DDL of the `claim_key` function (see {@link claimKey}), for the migration that installs it.
 * The schema is baked in. Changing the body needs a new migration that replaces the function.
 *
 * `#variable_conflict use_column`: the output columns share names with table columns; inside
 * queries a bare name always means the column. A completing (fast-path) claim has no lease (its
 * transaction's row lock is the lease) and notifies waiters (only when one asked, `has_waiters`;
 * never for a fresh insert, which nobody could have asked about), delivered at commit, and not at
 * all if the effect rolls back.
 */
export function claimKeyFunctionDdl(schema: string) {
  const fn = sql.id(schema, 'claim_key');
  const table = sql.id(schema, 'idempotency_keys');
  return sql`
    create or replace function ${fn}(
      p_scope text, p_key text, p_fingerprint text, p_owner uuid, p_mode text,
      p_lease_ms int, p_retention_ms bigint, p_lock_timeout_ms int, p_async_commit boolean,
      p_job_id text, p_queue text, p_job_name text, p_payload jsonb, p_channel text)
    returns table (outcome text, fence bigint, attempts int, locked_until timestamptz, status text,
                   fingerprint text, claimable boolean, result jsonb, error jsonb, retry_after_ms bigint)
    language plpgsql volatile as $claim$
    #variable_conflict use_column
    declare
      v_prior_lock_timeout text := current_setting('lock_timeout');
      v_completing boolean := p_mode = 'complete';
      v_status text := case when p_mode = 'complete' then 'completed' else 'processing' end;
      v_locked_until timestamptz := case when p_mode = 'complete' then null else now() + p_lease_ms * interval '1 millisecond' end;
      v_completed_at timestamptz := case when p_mode = 'complete' then now() end;
      v_expires_at timestamptz := case when p_mode = 'complete' then now() + p_retention_ms * interval '1 millisecond' end;
      v_names_job boolean := p_job_id is not null or p_queue is not null;
      v_row record;
    begin
      perform set_config('lock_timeout', p_lock_timeout_ms::text, true);
      if p_async_commit and not v_completing then
        perform set_config('synchronous_commit', 'off', true);
      end if;

      insert into ${table} as k
        (scope, key, fingerprint, status, owner, fence, attempts, locked_until,
         job_id, queue, job_name, payload, completed_at, expires_at)
      values (p_scope, p_key, p_fingerprint, v_status, p_owner, 1, 1, v_locked_until,
              p_job_id, p_queue, p_job_name, p_payload, v_completed_at, v_expires_at)
      on conflict do nothing
      returning k.fence, k.attempts, k.locked_until, k.has_waiters into v_row;
      if found then
        outcome := 'claimed';
      else
        update ${table} as k
           set owner = p_owner,
               fence = k.fence + 1,
               attempts = k.attempts + 1,
               status = v_status,
               locked_until = v_locked_until,
               completed_at = v_completed_at,
               expires_at = v_expires_at,
               job_id = case when v_names_job then p_job_id else k.job_id end,
               queue = case when v_names_job then p_queue else k.queue end,
               job_name = case when v_names_job then p_job_name else k.job_name end,
               payload = coalesce(p_payload, k.payload),
               updated_at = now()
         where k.scope = p_scope and k.key = p_key
           and k.status = 'processing'
           and k.fingerprint = p_fingerprint
           and (k.owner is null or k.locked_until <= now())
        returning k.fence, k.attempts, k.locked_until, k.has_waiters into v_row;
        if found then
          outcome := 'taken-over';
        end if;
      end if;
      perform set_config('lock_timeout', v_prior_lock_timeout, true);

      if outcome is not null then
        fence := v_row.fence;
        attempts := v_row.attempts;
        locked_until := v_row.locked_until;
        claimable := false;
        retry_after_ms := 0;
        if v_completing and v_row.has_waiters then
          perform pg_notify(p_channel, json_build_object('scope', p_scope, 'key', p_key)::text);
        end if;
        return next;
        return;
      end if;

      return query
        select case when k.owner = p_owner and k.status = 'processing' and k.fingerprint = p_fingerprint and not v_completing
                    then case when k.attempts = 1 then 'claimed' else 'taken-over' end
                    else 'existing' end,
               k.fence, k.attempts, k.locked_until, k.status, k.fingerprint,
               k.status = 'processing' and (k.owner is null or k.locked_until <= now()),
               k.result, k.error,
               ceil(extract(epoch from (k.locked_until - now())) * 1000)::bigint
          from ${table} as k
         where k.scope = p_scope and k.key = p_key;
    end;
    $claim$`;
}
