import { CompiledQuery, sql, type Kysely, type RawBuilder } from 'kysely';
import pg from 'pg';
import { groupPrelude } from '../gathering-connection.js';
import { executePrepared, prepared } from '../named-statements.js';
import { oldestWaitersWoken, wokenNotified } from './concurrency-slot-wakes.js';
import { freeSlotWalk } from './concurrency-slots.js';

/** What `takeConcurrencySlotsInTransaction` answered. */
export interface SlotsInTransactionAnswer {
  /** The first concurrency key at its limit (no slot is held for it: those of the keys before it were given back); undefined: a slot of each is held. */
  readonly refusedGroup: string | undefined;
  /** The slots were taken by a key recorded as a waiter of some of them: forget it now, apart from the transaction (`KeyStore.forgetSlotWaiter`). */
  readonly wasWaiting: boolean;
}

/** One take of slots inside a transaction: the job's concurrency keys, sorted, with their limits. */
export interface SlotsInTransactionRequest {
  /** The concurrency keys, in the order every job takes them (`concurrencyLimitsOf`). */
  readonly groups: readonly string[];
  /** Each key's limit, in the same order. */
  readonly limits: readonly number[];
  /** The scope of the key that runs in the slots. */
  readonly scope: string;
  /** The key that runs in the slots. */
  readonly key: string;
  /** The starvation bound (see `acquireConcurrencySlot`). */
  readonly starvationMs: number;
}

/**
 * Takes a slot of each of a job's concurrency keys for as long as the open transaction `tx`
 * lasts, or names the first key at its limit: one statement, a call of
 * `take_concurrency_slots_in_shared_transaction` ({@link concurrencySlotsInTransactionDdl}), in
 * a transaction of the job's own or one it shares with its group.
 *
 * *Why:* a job whose whole run is one transaction (the fast path) needs no slot row: the slot's
 * transaction-scoped advisory lock (the lock a row's acquisition takes too, `sql/concurrency-slots.ts`)
 * is held until that transaction commits or rolls back, and freed by Postgres if its connection
 * dies. So the slot costs neither a commit to take nor one to free, nor a heartbeat to keep: it
 * is as long as the run, exactly. Acquisitions of a row skip a slot whose lock is held, and this
 * one skips a slot whose row is live, so the two kinds of holder share one count.
 *
 * Refused, it holds nothing: the slots of the job's keys before the refused one are given back
 * (a subtransaction of the take's own), so a transaction the job shares with its group goes on
 * without them, and one of its own rolls back. The job then asks for a slot row
 * (`acquireConcurrencySlot`), which records it as a waiter or takes a slot freed meanwhile. A
 * starving waiter goes first here as there. The answer names the lock keys of the slots taken
 * (`lock_keys`), for diagnosis (`pg_locks`).
 */
export async function takeConcurrencySlotsInTransaction(tx: Kysely<any>, schema: string, request: SlotsInTransactionRequest): Promise<SlotsInTransactionAnswer> {
  const { rows } = await tx.executeQuery<{ refused_group: string | null; was_waiting: boolean }>(
    groupPrelude(
      prepared(
        CompiledQuery.raw(`select * from ${pg.escapeIdentifier(schema)}.${SHARED_TRANSACTION_TAKE}($1::text[], $2::int[], $3::text, $4::text, $5::int)`, [
          request.groups,
          request.limits,
          request.scope,
          request.key,
          request.starvationMs,
        ]),
      ),
    ),
  );
  const row = rows[0]!;
  return { refusedGroup: row.refused_group ?? undefined, wasWaiting: row.was_waiting };
}

/**
 * The take a worker calls: safe in a transaction several jobs share (migration
 * `034_concurrency_slots_in_groups`). Its text marks it a group's prelude: it reads and writes
 * only the library's tables, locks and settings.
 */
const SHARED_TRANSACTION_TAKE = 'take_concurrency_slots_in_shared_transaction';

/**
 * Forgets a key as a waiter of `groups` once it runs in their slots (a statement of its own,
 * committed at once: see `take_concurrency_slots_in_transaction`). Its commit does not wait for
 * the flush: a row a crash keeps is a waiter that stops counting once it is not seen again.
 */
export async function forgetConcurrencyWaiter(db: Kysely<any>, schema: string, groups: readonly string[], scope: string, key: string): Promise<void> {
  await executePrepared(db, sql`
    with forgotten as (
      delete from ${sql.id(schema, 'concurrency_waiters')} as w
       where w.group_key = any(${groups}::text[]) and w.scope = ${scope} and w.key = ${key}
    )
    select set_config('synchronous_commit', 'off', true)`);
}

/**
 * Wakes the oldest waiters of each of `groups` not woken within `wakeAgainAfterMs`, as many as
 * the key's `counts` says (the slots freed), as a slot row's release does
 * (`releaseConcurrencySlot`): after runs whose slots were held by their transaction ended. Every
 * such run asks for it (the wakes of a group's jobs go as one: `WakeBatcher`): a waiter is
 * recorded by a refusal while the run goes on, which the run cannot see. With no waiter it writes
 * nothing, so it costs a round trip and no commit. Its commit does not wait for the flush: a wake
 * lost is a waiter that asks again when its deferral ends.
 */
export async function wakeConcurrencyWaiters(db: Kysely<any>, schema: string, groups: readonly string[], counts: readonly number[], wakeAgainAfterMs: number): Promise<number> {
  const { rows } = await executePrepared(db, sql<{ woken: number }>`
    select ${sql.id(schema, 'wake_concurrency_waiters')}(${groups}::text[], ${counts}::int[], ${wakeAgainAfterMs}::int) as woken`);
  return rows[0]?.woken ?? 0;
}

/**
 * DDL of `wake_concurrency_waiters` (see {@link wakeConcurrencyWaiters}): a function, so that
 * its plans are kept by the session and a call that finds no waiter (the common case: every run
 * below its limit sends it) reads one index entry and returns, writing nothing. Migration
 * `033_concurrency_slots_in_transaction` installed it with one waiter per key; `034_concurrency_slots_in_groups`
 * adds the form with a count per key (`counted`), which workers call.
 */
export function wakeConcurrencyWaitersDdl(schema: string, options: { readonly counted?: boolean } = {}) {
  const waiters = sql.id(schema, 'concurrency_waiters');
  const counts = options.counted ? sql`p_counts int[], ` : sql``;
  return sql`
      create or replace function ${sql.id(schema, 'wake_concurrency_waiters')}(p_groups text[], ${counts}p_wake_again_after_ms int)
      returns int
      language plpgsql volatile as $wake$
      declare
        v_woken int;
      begin
        perform 1 from ${waiters} as w where w.group_key = any(p_groups) and w.job_id is not null limit 1;
        if not found then
          return 0;
        end if;
        -- A wake lost to a crash is a waiter that asks again when its deferral ends: no flush waited for.
        perform set_config('synchronous_commit', 'off', true);
        with ${oldestWaitersWoken(schema, sql.raw('p_groups'), sql.raw('p_wake_again_after_ms'), sql`true`, options.counted ? sql.raw('p_counts') : undefined)}
        select ${wokenNotified(schema)} into v_woken;
        return v_woken;
      end;
      $wake$`;
}

/**
 * DDL of the function that takes a run's slots in its transaction (see
 * {@link takeConcurrencySlotsInTransaction}): `take_concurrency_slots_in_transaction`, for
 * migration `033_concurrency_slots_in_transaction`, which a transaction of one job only may call
 * (workers of that release call it); and `take_concurrency_slots_in_shared_transaction`, for
 * migration `034_concurrency_slots_in_groups`, the same but for a transaction several jobs share
 * (a group's): it skips the slots its transaction already took (`HELD_BY_THIS_TRANSACTION`, `sql/concurrency-slots.ts`).
 * The walk is `acquire_concurrency_slot`'s, the same text ({@link freeSlotWalk}): its locks are
 * never waited for. Migrations `035_concurrency_slot_walk_from_random` and
 * `037_concurrency_takes_without_waiters` (a key with no waiter at all reads one index entry
 * instead of its waiters twice) install both again.
 */
export function concurrencySlotsInTransactionDdl(schema: string, options: { readonly sharedTransaction?: boolean } = {}) {
  const waiters = sql.id(schema, 'concurrency_waiters');
  const shared = options.sharedTransaction === true;
  const name = shared ? SHARED_TRANSACTION_TAKE : 'take_concurrency_slots_in_transaction';
  // The walk over the job's keys, refusing as `refuse` says at the first key with no free slot.
  const keysWalk = (refuse: RawBuilder<unknown>) => sql`
        for v_index in 1 .. coalesce(cardinality(p_groups), 0) loop
          v_group := p_groups[v_index];
          v_limit := coalesce(p_limits[v_index], 0);
          -- As in acquire_concurrency_slot: a starving waiter older than this key, still coming
          -- back, goes first; a key with no waiter at all skips the two reads.
          v_since := null;
          v_starving := false;
          perform 1 from ${waiters} as w where w.group_key = v_group limit 1;
          if found then
            select w.since into v_since from ${waiters} as w
             where w.group_key = v_group and w.scope = p_scope and w.key = p_key
               and w.seen_at >= now() - 2 * p_starvation_ms * interval '1 millisecond';
            was_waiting := was_waiting or v_since is not null;
            select exists (
                     select 1 from ${waiters} as w
                      where w.group_key = v_group and not (w.scope = p_scope and w.key = p_key)
                        and w.since < now() - p_starvation_ms * interval '1 millisecond'
                        and w.seen_at >= now() - p_starvation_ms * interval '1 millisecond'
                        and w.since < coalesce(v_since, now()))
              into v_starving;
          end if;
          v_slot := null;
          if not v_starving then
            ${freeSlotWalk(schema, 'v_group', 'v_limit', options)}
          end if;
          if v_slot is null then
            ${refuse}
          end if;
        end loop;`;
  const body = shared
    ? sql`
        if coalesce(cardinality(p_groups), 0) > 1 then
          -- Refused a later key, the slots of the keys before it are given back with this block's
          -- subtransaction (their locks and their place in the transaction's list): the group
          -- whose transaction this is goes on without the job, and must not keep them.
          begin
            ${keysWalk(sql`v_refused := v_group;
            raise exception 'concurrency key % is at its limit', v_group using errcode = ${sql.lit(REFUSED_IN_SUBTRANSACTION)};`)}
          exception when sqlstate ${sql.lit(REFUSED_IN_SUBTRANSACTION)} then
            refused_group := v_refused;
            return next;
            return;
          end;
        else
          ${keysWalk(sql`refused_group := v_group;
            return next;
            return;`)}
        end if;
        lock_keys := v_taken;`
    : keysWalk(sql`refused_group := v_group;
            return next;
            return;`);
  return sql`
      create or replace function ${sql.id(schema, name)}(
        p_groups text[], p_limits int[], p_scope text, p_key text, p_starvation_ms int)
      returns table (refused_group text, was_waiting boolean${shared ? sql`, lock_keys bigint[]` : sql``})
      language plpgsql volatile as $slots$
      #variable_conflict use_column
      declare
        v_lock bigint;
        v_taken bigint[] := '{}';
        v_refused text;
        v_index int;
        v_group text;
        v_limit int;
        v_live int[];
        v_first int;
        v_next_live int;
        v_candidate int;
        v_slot int;
        v_since timestamptz;
        v_starving boolean;
      begin
        was_waiting := false;
        ${body}
        -- A waiter row of this key is not deleted here: uncommitted until the run ends, it would
        -- stay visible to every other taker as a (starving) waiter, and its row lock would hold
        -- their stale-waiter deletes for as long. The caller deletes it apart, at once.
        refused_group := null;
        return next;
      end;
      $slots$`;
}

/** The SQLSTATE the shared take raises inside its own block to give back a refused job's slots (never seen outside it). */
const REFUSED_IN_SUBTRANSACTION = 'IJ004';
