import { sql, type Kysely, type RawBuilder } from 'kysely';
import { concurrencySlotFreedChannel } from '../channels.js';
import { compareStrings } from '../lock-order.js';
import { executePrepared } from '../named-statements.js';
import { acquireConcurrencySlotFunctionDdl, slotLockKey } from './concurrency-slots.js';

/**
 * Frees a slot when its run ended (completed, failed, released or deferred); false when it was
 * no longer held. In the same statement, when the freed slot's concurrency key has a waiter
 * whose job is known, the oldest one (the first the starvation rule lets in) is named on
 * `<schema>_slot_freed` ({@link concurrencySlotFreedChannel}), delivered at commit: the worker
 * that deferred that job promotes it, so the slot is taken again as soon as it frees, instead of
 * when a waiter's backoff happens to end.
 *
 * *Why only with a waiter:* NOTIFY takes a database-wide lock at commit (see
 * `KeySettledListener`); a key running below its limit frees its slots without one. *Why one
 * waiter:* one slot freed lets one job in; waking every waiter would have all but one deferred
 * again. *Why the woken one is marked:* two slots freed at once must wake two waiters, not the
 * oldest one twice (its row is there until it takes a slot), so a waiter woken within
 * `wakeAgainAfterMs` (the lease: it comes back in moments, unless its worker is gone) is passed
 * over. One that is woken and finds the slot taken (a newcomer got there first) is deferred as
 * before, unmarked, and the next freed slot wakes the oldest waiter again.
 *
 * *Why its commit does not wait for the WAL flush* (`synchronous_commit = off` for this statement
 * only): a release that a Postgres crash loses is a release that never happened, and a slot that
 * is not freed frees itself when its time is up (never later than the run's lease), as when the
 * release cannot reach Postgres at all. So durability buys the release nothing, and the flush was
 * half of what a concurrency key added to a job's commits (the slot's acquisition, which a crash
 * must not lose, stays synchronous).
 */
export async function releaseConcurrencySlot(db: Kysely<any>, schema: string, group: string, slot: number, owner: string, wakeAgainAfterMs: number): Promise<boolean> {
  const { rows } = await executePrepared(db, sql<{ freed: number }>`
    with freed as (
      delete from ${sql.id(schema, 'concurrency_slots')}
       where group_key = ${group} and slot = ${slot} and owner = ${owner}::uuid
      returning group_key
    ), ${oldestWaitersWoken(schema, sql`array[${group}::text]`, sql`${wakeAgainAfterMs}::int`, sql`exists (select 1 from freed)`)}
    select set_config('synchronous_commit', 'off', true) as async_commit,
           (select count(*) from freed)::int as freed,
           ${wokenNotified(schema)} as woken`);
  return rows[0]?.freed === 1;
}

/**
 * Frees several runs' slots in one statement and one commit, as {@link releaseConcurrencySlot}
 * frees one: each slot its owner still holds is deleted, and each concurrency key wakes as many
 * of its oldest waiters as slots of it were freed. Which of `slots` were still held, in order.
 * The caller sorts them by concurrency key and slot (the rows' order), so two batches lock in one
 * order.
 */
export async function releaseConcurrencySlots(db: Kysely<any>, schema: string, slots: readonly HeldSlot[], wakeAgainAfterMs: number): Promise<boolean[]> {
  const freedGroups = (column: 'group_key' | 'n') => sql`(select coalesce(array_agg(fg.${sql.raw(column)} order by fg.group_key), '{}') from freed_groups as fg)`;
  // Answered by position: Postgres compares the owners as UUIDs and the keys as it stored them,
  // and a slot named twice is deleted once (its one joined position answers true, the other false).
  const { rows } = await executePrepared(db, sql<{ freed: number[] }>`
    with freed as (
      delete from ${sql.id(schema, 'concurrency_slots')} as s
       using unnest(${slots.map((h) => h.group)}::text[], ${slots.map((h) => h.slot)}::int[], ${slots.map((h) => h.owner)}::uuid[])
             with ordinality as h(group_key, slot, owner, idx)
       where s.group_key = h.group_key and s.slot = h.slot and s.owner = h.owner
      returning s.group_key, h.idx
    ), freed_groups as (
      select f.group_key, count(*)::int as n from freed as f group by f.group_key
    ), ${oldestWaitersWoken(schema, freedGroups('group_key'), sql`${wakeAgainAfterMs}::int`, sql`true`, freedGroups('n'))}
    select set_config('synchronous_commit', 'off', true) as async_commit,
           (select coalesce(array_agg(f.idx::int), '{}') from freed as f) as freed,
           ${wokenNotified(schema)} as woken`);
  const freed = new Set(rows[0]?.freed ?? []);
  return slots.map((_, i) => freed.has(i + 1));
}

/** The order in which a batch frees slots: by concurrency key, then slot (the rows' primary key). */
export function compareHeldSlots(a: HeldSlot, b: HeldSlot): number {
  return compareStrings(a.group, b.group) || a.slot - b.slot;
}

/**
 * The common table expressions `woken` and `marked` of a statement that wakes the oldest waiter
 * of each of `groups` (the `counts` oldest, when given) whose job is known and that was not woken within `wakeAgainAfterMs` (when
 * `when` holds): `woken` the waiters, locked (`skip locked`: two wakes at once wake two
 * waiters), `marked` their `woken_at` set. {@link wokenNotified} names them on the channel. One
 * text for both wakes: a slot row's release and `wake_concurrency_waiters`.
 */
export function oldestWaitersWoken(
  schema: string,
  groups: RawBuilder<unknown>,
  wakeAgainAfterMs: RawBuilder<unknown>,
  when: RawBuilder<unknown> = sql`true`,
  /** How many waiters of each group (an array beside `groups`); unset: one each. */
  counts?: RawBuilder<unknown>,
) {
  const waiters = sql.id(schema, 'concurrency_waiters');
  const each = counts ? sql`unnest(${groups}, ${counts}) as g(group_key, n)` : sql`unnest(${groups}) as g(group_key)`;
  return sql`woken as (
      select w.group_key, w.scope, w.key, w.queue, w.job_id
        from ${each}
       cross join lateral (
         select w.group_key, w.scope, w.key, w.queue, w.job_id from ${waiters} as w
          where w.group_key = g.group_key and w.job_id is not null and ${when}
            and (w.woken_at is null or w.woken_at < now() - ${wakeAgainAfterMs} * interval '1 millisecond')
          order by w.since
          limit ${counts ? sql`g.n` : sql`1`}
            for update skip locked) as w
    ), marked as (
      update ${waiters} as w set woken_at = now()
        from woken where w.group_key = woken.group_key and w.scope = woken.scope and w.key = woken.key
    )`;
}

/**
 * How many waiters `woken` ({@link oldestWaitersWoken}) named on `<schema>_slot_freed`, each
 * notified as it is counted. The channel is a literal, not a parameter: the text goes into a
 * function's body too.
 */
export function wokenNotified(schema: string) {
  return sql`(select count(*) from (
      select pg_notify(${sql.lit(concurrencySlotFreedChannel(schema))}, json_build_object('group', w.group_key, 'queue', w.queue, 'jobId', w.job_id)::text)
        from woken as w) as n)::int`;
}

/** One held slot, as the run that holds it knows it. */
export interface HeldSlot {
  /** The concurrency key. */
  readonly group: string;
  /** Which of its slots (0 … limit − 1). */
  readonly slot: number;
  /** The owner token the run took it under. */
  readonly owner: string;
}

/**
 * Renews slots held by a run that is still going: each one's time is `leaseMs` from now again,
 * if its owner still holds it; how many were renewed. A run's slot is otherwise held for
 * `leaseMs` after it was taken: without renewal a run longer than the lease would let another
 * job of the key in. A slot whose time ran out and that nobody took since is renewed too: no one
 * ran in it meanwhile. One taken by another run is not, and the count says so: a row's taker
 * changed its owner; a transaction that holds it (`sql/concurrency-slots-in-transaction.ts`)
 * leaves no row, but holds its lock, which the renewal of a slot whose time ran out tries first.
 */
export async function renewConcurrencySlots(db: Kysely<any>, schema: string, slots: readonly HeldSlot[], leaseMs: number): Promise<number> {
  // The run's own rows first (materialized): the lock is tried for those alone, never for a row
  // of another run that a scan of the table passes on the way.
  const result = await sql`
    with mine as materialized (
      select s.group_key, s.slot, s.owner, s.acquired_until > now() as live
        from ${sql.id(schema, 'concurrency_slots')} as s
        join unnest(${slots.map((h) => h.group)}::text[], ${slots.map((h) => h.slot)}::int[], ${slots.map((h) => h.owner)}::uuid[]) as h(group_key, slot, owner)
          on s.group_key = h.group_key and s.slot = h.slot and s.owner = h.owner
    )
    update ${sql.id(schema, 'concurrency_slots')} as s
       set acquired_until = now() + ${leaseMs}::int * interval '1 millisecond'
      from mine as m
     where s.group_key = m.group_key and s.slot = m.slot and s.owner = m.owner
       and (m.live or pg_try_advisory_xact_lock(${slotLockKey(sql.raw('m.group_key'), sql.raw('m.slot'))}))`.execute(db);
  return Number(result.numAffectedRows ?? 0n);
}

/**
 * Deletes up to `limit` slot rows that hold nothing: their time ran out more than `olderThanMs`
 * ago and their key is not `processing` under a live lease (the run ended without freeing it:
 * its worker died). Such a row is overwritten by the next taker of its slot, but a concurrency key
 * that is not used again (a tenant's, say) would keep its rows for good. `FOR UPDATE SKIP LOCKED`
 * as in `deleteExpiredKeys`.
 */
export async function deleteStaleConcurrencySlots(db: Kysely<any>, schema: string, olderThanMs: number, limit: number): Promise<number> {
  const slots = sql.id(schema, 'concurrency_slots');
  const result = await sql`
    with doomed as (
      select s.group_key, s.slot
        from ${slots} as s
       where s.acquired_until < now() - ${olderThanMs}::bigint * interval '1 millisecond'
         and not exists (
           select 1 from ${sql.id(schema, 'idempotency_keys')} as k
            where k.scope = s.scope and k.key = s.key and k.status = 'processing' and k.owner is not null and k.locked_until > now())
       limit ${limit}
         for update skip locked
    )
    delete from ${slots} as s
     using doomed as d
     where s.group_key = d.group_key and s.slot = d.slot
       and s.acquired_until < now() - ${olderThanMs}::bigint * interval '1 millisecond'`.execute(db);
  return Number(result.numAffectedRows ?? 0n);
}

/**
 * DDL of migration `028_concurrency_slot_wakes`: a waiter's row names its job and queue, so that
 * a freed slot wakes it ({@link releaseConcurrencySlot}), and when it was woken last, and `acquire_concurrency_slot` takes
 * them (`p_job_id`, `p_queue`, both defaulting to null, so a worker of an earlier version calls
 * it as it did). Its previous signature is dropped first, as in `024_concurrency_limit_sets`.
 */
export function concurrencySlotWakesDdl(schema: string) {
  const waiters = sql.id(schema, 'concurrency_waiters');
  return [
    sql`alter table ${waiters} add column if not exists job_id text, add column if not exists queue text, add column if not exists woken_at timestamptz`,
    sql`drop function if exists ${sql.id(schema, 'acquire_concurrency_slot')}(text, int, text, text, uuid, int, int, text[])`,
    acquireConcurrencySlotFunctionDdl(schema),
  ];
}
