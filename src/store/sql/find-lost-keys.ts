import { sql, type Kysely } from 'kysely';
import type { LostKeyCandidate, LostKeyCursor } from '../records.js';

/**
 * Lists up to `limit` keys still `processing` whose lease ended more than `sweepAfterMs` ago
 * (crashed owners and released keys that nobody claimed again), oldest lease first, after
 * `cursor`. A plain read: the sweeper decides per key (it asks BullMQ whether the job still
 * exists) and then acts with a conditional statement that re-checks the row, so no lock is
 * held while Redis is consulted. Keyset pagination on (locked_until, scope, key) walks past
 * keys whose jobs are alive instead of reading them again; the partial index on
 * `locked_until` where `status = 'processing'` serves it; the cursor carries `locked_until` as
 * text because a JavaScript Date would round its microseconds away and re-read the last page.
 * `payload is not null` tells a stored
 * JSON `null` (jsonb 'null') from no payload stored (SQL NULL).
 *
 * What the job said beyond its name and payload comes along, so that a job added again is the
 * job that was lost: the concurrency keys and limits it took slots under (`key_concurrency_limits`),
 * and, for a run of a coalescing key (`<key>#<generation>`, the generation that key's
 * `coalescing_keys` row hands to this very job), the coalescing key and that run's payload.
 * Each is a primary-key probe, made only for the page's rows.
 */
export async function findLostKeyCandidates(
  db: Kysely<any>,
  schema: string,
  sweepAfterMs: number,
  limit: number,
  cursor?: LostKeyCursor,
  /** Only keys of these queues; `'*'`: every key (including keys with no queue recorded). */
  queues: readonly string[] | '*' = '*',
): Promise<LostKeyCandidate[]> {
  const ofQueues = queues === '*' ? sql`` : sql`and queue = any(${queues}::text[])`;
  const after = cursor
    ? sql`and (locked_until, scope, key) > (${cursor.lockedUntil}::timestamptz, ${cursor.scope}::text, ${cursor.key}::text)`
    : sql``;
  const { rows } = await sql<{
    scope: string;
    key: string;
    fence: string;
    owner: string | null;
    locked_until: Date;
    locked_until_exact: string;
    job_id: string | null;
    queue: string | null;
    job_name: string | null;
    has_payload: boolean;
    payload: unknown;
    concurrency_limits: Array<{ key: string; limit: number }> | null;
    coalescing_key: string | null;
    coalescing_payload: unknown;
  }>`
    with page as (
      select scope, key, fence, owner, locked_until, locked_until::text as locked_until_exact, job_id, queue, job_name,
             payload is not null as has_payload, payload
        from ${sql.id(schema, 'idempotency_keys')}
       where status = 'processing'
         and locked_until <= now() - ${sweepAfterMs}::bigint * interval '1 millisecond'
         ${after}
         ${ofQueues}
       order by locked_until, scope, key
       limit ${limit}
    )
    select p.*,
           (select json_agg(json_build_object('key', l.group_key, 'limit', l.concurrency_limit) order by l.group_key)
              from ${sql.id(schema, 'key_concurrency_limits')} as l
             where l.scope = p.scope and l.key = p.key) as concurrency_limits,
           c.key as coalescing_key, c.running_payload as coalescing_payload
      from page as p
      left join ${sql.id(schema, 'coalescing_keys')} as c
        on c.scope = p.scope and p.key = c.key || '#' || c.generation and c.running_job = p.job_id
     order by p.locked_until, p.scope, p.key`.execute(db);
  return rows.map((r) => ({
    scope: r.scope,
    key: r.key,
    fence: Number(r.fence),
    owner: r.owner,
    lockedUntil: r.locked_until,
    lockedUntilExact: r.locked_until_exact,
    jobId: r.job_id,
    queue: r.queue,
    jobName: r.job_name,
    hasPayload: r.has_payload,
    payload: r.payload,
    // One limit keeps the form a job with one names; several, the list.
    concurrency: r.concurrency_limits === null ? undefined : r.concurrency_limits.length === 1 ? r.concurrency_limits[0] : r.concurrency_limits,
    coalescing: r.coalescing_key !== null ? { key: r.coalescing_key, payload: r.coalescing_payload } : undefined,
  }));
}
