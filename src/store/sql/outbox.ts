import { sql, type Kysely } from 'kysely';
import type { OutboxEntry, OutboxRow } from '../records.js';

/**
 * Writes jobs into the outbox inside the caller's transaction: they exist if and only if the
 * business transaction commits.
 */
export async function insertOutboxRows(tx: Kysely<any>, schema: string, entries: readonly OutboxEntry[]): Promise<void> {
  if (entries.length === 0) return;
  const values = entries.map(
    (e) => sql`(${e.queue}, ${e.jobName}, ${e.jobId}, ${JSON.stringify(e.data)}::jsonb, ${JSON.stringify(e.opts)}::jsonb)`,
  );
  await sql`
    insert into ${sql.id(schema, 'outbox')} (queue, job_name, job_id, data, opts)
    values ${sql.join(values)}`.execute(tx);
}

/**
 * Takes the oldest unsent rows for this relay, except `excludedIds` (rows the relay holds back
 * for a while, so that they do not block the rows behind them). `FOR UPDATE SKIP LOCKED` lets
 * several relays run at once without handing the same row to two of them; the lock lasts
 * until the caller's transaction marks them sent (or crashes, and the rows are picked up again).
 */
export async function lockUnsentOutboxRows(
  tx: Kysely<any>,
  schema: string,
  limit: number,
  excludedIds: readonly string[] = [],
): Promise<OutboxRow[]> {
  const { rows } = await sql<{ id: string; queue: string; job_name: string; job_id: string; data: unknown; opts: Record<string, unknown>; created_at: Date }>`
    select id, queue, job_name, job_id, data, opts, created_at
      from ${sql.id(schema, 'outbox')}
     where sent_at is null
       and id <> all(${excludedIds}::bigint[])
     order by id
     limit ${limit}
       for update skip locked`.execute(tx);
  return rows.map((r) => ({ id: String(r.id), queue: r.queue, jobName: r.job_name, jobId: r.job_id, data: r.data, opts: r.opts, createdAtMs: r.created_at.getTime() }));
}

/** Marks rows delivered to BullMQ. */
export async function markOutboxRowsSent(tx: Kysely<any>, schema: string, ids: readonly string[]): Promise<void> {
  if (ids.length === 0) return;
  await sql`update ${sql.id(schema, 'outbox')} set sent_at = now() where id = any(${ids}::bigint[])`.execute(tx);
}
