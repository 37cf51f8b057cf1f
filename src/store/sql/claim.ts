import { sql, type Kysely } from 'kysely';
import { ClaimContendedError } from '../../errors.js';
import { keySettledChannel } from '../channels.js';
import type { ClaimOutcome } from '../claim-outcome.js';
import { isLockTimeout } from '../pg-errors.js';

/** Everything one claim statement needs. */
export interface ClaimStatementInput {
  readonly schema: string;
  readonly scope: string;
  readonly key: string;
  readonly fingerprint: string;
  /** Fresh random token for this claim. */
  readonly owner: string;
  readonly leaseMs: number;
  readonly lockTimeoutMs: number;
  /**
   * `'lease'`: claim as `processing` under a lease (the effect commits later, fenced).
   * `'complete'`: the fast path: claim as `completed` inside the caller's open transaction,
   * so the claim commits, or rolls back, with the effect.
   */
  readonly mode: 'lease' | 'complete';
  /** Used in `'complete'` mode: when the completed key expires. */
  readonly retentionMs: number;
  readonly jobId?: string | null;
  readonly queue?: string | null;
  readonly jobName?: string | null;
  /** JSON text of the payload to keep with the key (lets the sweeper re-enqueue), or null. */
  readonly payloadJson?: string | null;
}

interface ClaimRow {
  outcome: 'claimed' | 'taken-over' | 'existing';
  fence: string;
  attempts: number;
  locked_until: Date | null;
  status: 'processing' | 'completed' | 'failed';
  fingerprint: string;
  claimable: boolean;
  result: unknown;
  error: unknown;
  retry_after_ms: string;
}

// Each retry needs a concurrent writer to have changed the row between two statements; five
// in a row means heavy contention on one key, which the caller treats as "in progress".
const MAX_STATEMENTS = 5;

/**
 * The claim: one statement, one round trip in every uncontended case.
 *
 * 1. `inserted`: `INSERT … ON CONFLICT DO NOTHING`; the primary key (scope, key) is the arbiter,
 *    never a check-then-insert. A concurrent uncommitted insert of the same key makes this wait
 *    (bounded by `lock_timeout`, set first by `settings`) and then do nothing.
 * 2. `taken_over`: if nothing was inserted, one conditional UPDATE takes a `processing` key whose
 *    lease has expired (or which was released: owner null) and whose fingerprint matches:
 *    new owner, fence + 1, a new lease. Concurrent takers serialize on the row lock and
 *    Postgres re-checks the WHERE on the newest row version, so exactly one wins.
 * 3. otherwise the existing row is returned for the caller to classify.
 *
 * All three parts read one snapshot taken when the statement started. A row inserted or taken
 * over by a transaction that committed after that point is invisible to parts 2 and 3, so the
 * statement returns nothing, or a row that looks claimable although the UPDATE lost its race.
 * Both cases mean "someone just changed this key": run the statement again with a fresh
 * snapshot. Read committed makes that also true inside an open transaction (the fast path).
 *
 * `lock_timeout` is set with `set_config(…, true)`: local to the transaction, which for an
 * autocommit claim is the statement itself. Its expiry (55P03) means another transaction
 * holds this key uncommitted, i.e. the key is in progress.
 */
export async function claimKey(db: Kysely<any>, input: ClaimStatementInput): Promise<ClaimOutcome> {
  const { scope, key } = input;
  for (let statement = 1; statement <= MAX_STATEMENTS; statement++) {
    let row: ClaimRow | undefined;
    try {
      row = (await claimStatement(input).execute(db)).rows[0];
    } catch (error) {
      if (isLockTimeout(error)) return { kind: 'in-progress', scope, key, retryAfterMs: input.lockTimeoutMs };
      throw error;
    }
    if (!row) continue; // inserted concurrently after our snapshot: look again
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
    if (row.claimable) continue; // lost the takeover race to a writer our snapshot missed: look again
    return { kind: 'in-progress', scope, key, retryAfterMs: Math.max(1, Number(row.retry_after_ms)) };
  }
  throw new ClaimContendedError(scope, key, MAX_STATEMENTS);
}

function claimStatement(input: ClaimStatementInput) {
  const table = sql.id(input.schema, 'idempotency_keys');
  const completing = input.mode === 'complete';
  const status = completing ? 'completed' : 'processing';
  // A completing (fast-path) claim has no lease: its transaction's row lock is the lease.
  const lockedUntil = completing ? sql`null::timestamptz` : sql`now() + ${input.leaseMs}::int * interval '1 millisecond'`;
  const completedAt = completing ? sql`now()` : sql`null::timestamptz`;
  const expiresAt = completing ? sql`now() + ${input.retentionMs}::bigint * interval '1 millisecond'` : sql`null::timestamptz`;
  const payload = input.payloadJson ?? null;
  // A completing claim commits as completed, so it tells waiters (delivered at commit, and
  // not at all if the effect rolls back).
  const notify = completing
    ? sql`pg_notify(${keySettledChannel(input.schema)}, json_build_object('scope', ${input.scope}::text, 'key', ${input.key}::text)::text)`
    : sql`null`;

  return sql<ClaimRow>`
    with settings as (
      select set_config('lock_timeout', ${String(input.lockTimeoutMs)}, true)
    ),
    inserted as (
      insert into ${table} as k
        (scope, key, fingerprint, status, owner, fence, attempts, locked_until,
         job_id, queue, job_name, payload, completed_at, expires_at)
      select ${input.scope}, ${input.key}, ${input.fingerprint}, ${status}, ${input.owner}::uuid, 1, 1, ${lockedUntil},
             ${input.jobId ?? null}, ${input.queue ?? null}, ${input.jobName ?? null}, ${payload}::jsonb,
             ${completedAt}, ${expiresAt}
      from settings
      on conflict do nothing
      returning k.fence, k.attempts, k.locked_until
    ),
    taken_over as (
      update ${table} as k
         set owner = ${input.owner}::uuid,
             fence = k.fence + 1,
             attempts = k.attempts + 1,
             status = ${status},
             locked_until = ${lockedUntil},
             completed_at = ${completedAt},
             expires_at = ${expiresAt},
             job_id = coalesce(${input.jobId ?? null}, k.job_id),
             updated_at = now()
       where k.scope = ${input.scope} and k.key = ${input.key}
         and k.status = 'processing'
         and k.fingerprint = ${input.fingerprint}
         and (k.owner is null or k.locked_until <= now())
         and not exists (select from inserted)
      returning k.fence, k.attempts, k.locked_until
    )
    select 'claimed' as outcome, fence, attempts, locked_until,
           null as status, null as fingerprint, false as claimable, null::jsonb as result, null::jsonb as error,
           0::bigint as retry_after_ms, ${notify} as notified
      from inserted
    union all
    select 'taken-over', fence, attempts, locked_until, null, null, false, null, null, 0, ${notify}
      from taken_over
    union all
    select 'existing', k.fence, k.attempts, k.locked_until, k.status, k.fingerprint,
           k.status = 'processing' and (k.owner is null or k.locked_until <= now()),
           k.result, k.error,
           ceil(extract(epoch from (k.locked_until - now())) * 1000)::bigint, null
      from ${table} as k
     where k.scope = ${input.scope} and k.key = ${input.key}
       and not exists (select from inserted)
       and not exists (select from taken_over)`;
}
