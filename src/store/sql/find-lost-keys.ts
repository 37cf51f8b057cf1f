import { sql, type Kysely } from 'kysely';

/** A `processing` key whose lease ended long ago: a candidate for the sweeper. */
export interface LostKeyCandidate {
  readonly scope: string;
  readonly key: string;
  readonly fence: number;
  /** The owner token the key was left under (null once released); the abandon is conditioned on it. */
  readonly owner: string | null;
  readonly lockedUntil: Date;
  /** `locked_until` as Postgres text, exact to the microsecond (a Date keeps milliseconds only); for the cursor. */
  readonly lockedUntilExact: string;
  readonly jobId: string | null;
  readonly queue: string | null;
  readonly jobName: string | null;
  /** True when a payload was stored with the key (even a JSON `null` payload). */
  readonly hasPayload: boolean;
  readonly payload: unknown;
}

/** Where the previous page ended (keyset pagination). */
export interface LostKeyCursor {
  /** {@link LostKeyCandidate.lockedUntilExact} of the last key read. */
  readonly lockedUntil: string;
  readonly scope: string;
  readonly key: string;
}

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
  }>`
    select scope, key, fence, owner, locked_until, locked_until::text as locked_until_exact, job_id, queue, job_name, payload is not null as has_payload, payload
      from ${sql.id(schema, 'idempotency_keys')}
     where status = 'processing'
       and locked_until <= now() - ${sweepAfterMs}::bigint * interval '1 millisecond'
       ${after}
       ${ofQueues}
     order by locked_until, scope, key
     limit ${limit}`.execute(db);
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
  }));
}
