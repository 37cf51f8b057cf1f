import { sql, type Kysely, type RawBuilder } from 'kysely';

/**
 * The part of a statement that deletes finished keys which records, on the coalescing rows, the
 * generations among them: a key `<key>#<generation>` whose row's current generation is that
 * one gets `finished_generation` set, in the deleting statement itself (a data-modifying CTE
 * over `deleted`, a CTE of the caller that returns the deleted keys' `scope` and `key`).
 *
 * *Why here, and not at the hand-over:* `coalesce_arrive` tells that a generation has ended from
 * its key (completed or failed). A key kept briefly (a job's `retention.resultMs`) can be
 * deleted before anyone asks: before the next arrival, or before the redelivery of a job that
 * crashed between its generation's commit and the hand-over. A missing key would then read as a
 * generation handed out and not yet claimed, in flight, and the next arrival would wait as a
 * successor nobody runs. Recorded by the deletion, in the same transaction, there is no moment in
 * which the key is gone and its end not recorded; and the completion, on every path (alone,
 * grouped, fast path, a failure, the sweeper's abandon), needs nothing of its own. Every
 * statement that deletes finished keys includes this (`delete-expired-keys.ts`, `purge-keys.ts`).
 *
 * A key of that form that is no coalescing generation (an idempotency key that happens to end
 * in `#` and digits) matches no row, or a row whose current generation it is not: nothing is
 * written.
 */
export function recordEndedGenerations(schema: string, deleted: string): RawBuilder<unknown> {
  return sql`
    update ${sql.id(schema, 'coalescing_keys')} as c
       set finished_generation = g.generation
      from (select d.scope, substring(d.key from '^(.*)#[0-9]{1,18}$') as key, substring(d.key from '#([0-9]{1,18})$')::bigint as generation
              from ${sql.id(deleted)} as d
             where d.key ~ '#[0-9]{1,18}$') as g
     where c.scope = g.scope and c.key = g.key and c.generation = g.generation`;
}

/**
 * Deletes up to `limit` coalescing rows idle for longer than `idleMs`, and returns how many: no
 * successor pending, no generation handed out for `idleMs` (`assigned_at`), and no run in flight
 * (the current generation's key is not `processing`: it finished, was deleted after it finished,
 * or was never claimed in all that time).
 *
 * *What a deleted row loses:* the send time of the newest payload the key took. A delivery sent
 * before that payload and arriving after the deletion runs as the key's newest. It arrives more
 * than `idleMs` after that payload was sent (sent times count at most as the database's clock at
 * arrival, and the row was idle for `idleMs` since), so `idleMs` must be longer than any delivery
 * is held back: the janitor passes its retention, which its retry-horizon check already holds
 * above the queues' retries, the same window within which a key's duplicates are refused.
 *
 * *What it must not lose:* the generations run. The floor (`coalescing_generation_floor`) is
 * raised to the highest generation deleted, in the same statement, and a key's new row starts
 * past it (`coalesce_arrive`), so a generation number is never used twice for a key, whatever
 * keys or tombstones of the old generations are still kept.
 *
 * `FOR UPDATE SKIP LOCKED` as in `deleteExpiredKeys`: janitors running at once take disjoint
 * batches, and a row an arrival holds locked is left for the next run. Postgres re-checks the
 * row's conditions on its newest version when it locks it, so a row that an arrival changed
 * meanwhile (a successor pending, a generation handed out) is skipped.
 */
export async function deleteIdleCoalescingKeys(db: Kysely<any>, schema: string, idleMs: number, limit: number): Promise<number> {
  const table = sql.id(schema, 'coalescing_keys');
  const { rows } = await sql<{ deleted: string }>`
    with doomed as (
      select c.scope, c.key
        from ${table} as c
       where c.assigned_at < now() - ${idleMs}::bigint * interval '1 millisecond'
         and c.pending_payload is null
         and not exists (
           select 1 from ${sql.id(schema, 'idempotency_keys')} as k
            where k.scope = c.scope and k.key = c.key || '#' || c.generation and k.status = 'processing')
       order by c.assigned_at
       limit ${limit}
         for update of c skip locked
    ),
    deleted as (
      delete from ${table} as c using doomed as d
       where c.scope = d.scope and c.key = d.key
      returning c.generation
    ),
    raised as (
      update ${sql.id(schema, 'coalescing_generation_floor')} as f
         set generation = (select max(generation) from deleted)
       where f.generation < (select max(generation) from deleted)
    )
    select count(*) as deleted from deleted`.execute(db);
  return Number(rows[0]?.deleted ?? 0);
}

/**
 * Deletes up to `limit` remembered arrivals (`coalescing_arrivals`: the send time a job without a
 * trustworthy one was given at its first arrival) older than `olderThanMs`, and returns how many.
 * A job delivered again after its record is gone counts as sent at that delivery, so the bound is
 * the one of {@link deleteIdleCoalescingKeys}: the janitor's retention, longer than any delivery
 * is held back.
 */
export async function deleteOldCoalescingArrivals(db: Kysely<any>, schema: string, olderThanMs: number, limit: number): Promise<number> {
  const arrivals = sql.id(schema, 'coalescing_arrivals');
  const { rows } = await sql<{ deleted: string }>`
    with doomed as (
      select a.scope, a.key, a.job_id
        from ${arrivals} as a
       where a.arrived_at < now() - ${olderThanMs}::bigint * interval '1 millisecond'
       order by a.arrived_at
       limit ${limit}
         for update skip locked
    ),
    deleted as (
      delete from ${arrivals} as a using doomed as d
       where a.scope = d.scope and a.key = d.key and a.job_id = d.job_id
      returning 1
    )
    select count(*) as deleted from deleted`.execute(db);
  return Number(rows[0]?.deleted ?? 0);
}
