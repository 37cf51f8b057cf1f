import { sql, type Kysely, type RawBuilder } from 'kysely';
import { compareLockOrder, compareStrings } from '../lock-order.js';
import { executePrepared } from '../named-statements.js';

/** What `acquireConcurrencySlot` answered: the slot taken, or when to ask again. */
export type SlotAnswer =
  | {
      /** Always true: a slot was taken. */
      readonly acquired: true;
      /** Which of the group's slots (0 … limit − 1). */
      readonly slot: number;
      /** Another key of the group is waiting for a slot (seen within twice the starvation bound). */
      readonly othersWaiting: boolean;
    }
  | {
      /** Always false: every slot of the group is held. */
      readonly acquired: false;
      /** When to ask again. */
      readonly retryAfterMs: number;
    };

/** One slot acquisition: the group, its limit, the key that will run in it and the slot's owner token. */
export interface SlotRequest {
  /** The concurrency key: the group whose slots are limited. */
  readonly group: string;
  /** How many of the group's jobs may run at once. */
  readonly limit: number;
  /** The scope of the key that will run in the slot. */
  readonly scope: string;
  /** The key that will run in the slot. */
  readonly key: string;
  /** The slot's owner token (a UUID): only this run frees it. */
  readonly owner: string;
  /** How long the slot is held without its key's lease (the gap before the claim, a fast-path job's run). */
  readonly leaseMs: number;
  /** A waiter deferred this long goes before anyone who has waited less (the starvation bound). */
  readonly starvationMs: number;
  /**
   * Every concurrency key the job names, `group` among them, when it names more than one: what
   * the key's record in `key_concurrency_limits` keeps (records of other keys are dropped).
   * @defaultValue `[group]`
   */
  readonly groups?: readonly string[];
  /** The broker's id of the job asking (kept on its waiter row, so a freed slot can wake it); unset: not woken, it asks again. */
  readonly jobId?: string;
  /** The queue of that job. */
  readonly queue?: string;
}

/**
 * Takes one of a concurrency group's `limit` slots for a key about to run, or says when to ask
 * again: one statement, a call of `acquire_concurrency_slot` ({@link concurrencySlotsDdl}).
 *
 * *Why an advisory lock per slot:* two acquisitions that both see one free slot must not both
 * take it, and a slot is a row that may not exist yet, which no row lock guards. So a slot is
 * taken only under a transaction-scoped advisory lock of its own (`pg_try_advisory_xact_lock` of
 * `concurrency_slot_lock_key`, {@link concurrencySlotLockKeyDdl}, held to the statement's commit: an autocommit call),
 * after a second look in a statement of its own, which sees every run that took the slot and
 * committed before the lock was had. A slot whose lock another acquisition holds is being taken:
 * the next free one is tried, never waited for. So acquisitions of one group take different slots
 * at once instead of one after another (a lock on the whole group was held through each
 * acquisition's commit, its WAL flush included, which capped a group at one acquisition per
 * flush); groups never wait on each other, and no acquisition waits on a lock at all.
 *
 * *Why a slot is held by its time alone:* a slot row is held until `acquired_until` (now +
 * `leaseMs` when taken), which the run's slot heartbeat renews while the run goes on
 * (`renewConcurrencySlots`), and a run that ends frees it at once (`releaseConcurrencySlot`,
 * `sql/concurrency-slot-wakes.ts`). So a worker that dies mid-run frees its slot within a lease,
 * as its key's lease ends. Its key's lease does not hold it: a row an earlier attempt left
 * behind (its release lost) would then be held for as long as the same key's next run lasts, in a
 * slot of its own, and the group would run below its limit for no bounded time. A key taken over by a worker that acquired a slot of its own
 * counts twice until the old slot's time is up: the limit errs on the strict side, never the
 * loose one, and for at most a lease.
 *
 * *Starvation:* an acquisition that finds no free slot records the key as a waiter of the group
 * (since when it waits). A waiter that has waited longer than `starvationMs` goes first: while
 * one exists and keeps coming back (seen within `starvationMs`), free slots go only to the
 * oldest such waiter. So a job waits at most about `starvationMs` plus the runs of the waiters
 * older than it, however many newcomers arrive. A starving waiter that has not come back within
 * `starvationMs` (its job waits behind a long queue, or is gone) holds nothing back: were it to,
 * every job of the group would wait for waiters that are not there, and with a backlog whose
 * jobs come back less often than that, none would ever run.
 */
export async function acquireConcurrencySlot(db: Kysely<any>, schema: string, request: SlotRequest): Promise<SlotAnswer> {
  const { rows } = await executePrepared(db, sql<{ slot: number | null; retry_after_ms: string | null }>`
    select * from ${sql.id(schema, 'acquire_concurrency_slot')}(
      ${request.group}::text, ${request.limit}::int, ${request.scope}::text, ${request.key}::text, ${request.owner}::uuid,
      ${request.leaseMs}::int, ${request.starvationMs}::int, ${request.groups ?? null}::text[],
      ${request.jobId ?? null}::text, ${request.queue ?? null}::text)`);
  return slotAnswerOf(rows[0]!);
}

/**
 * Takes slots for several runs in one statement and one commit: `acquire_concurrency_slot` called
 * for each request in turn, in the order given (the caller sorts them by {@link compareSlotRequests},
 * so two batches that touch the same waiters' and keys' rows lock them in one order). One answer
 * per request, in order.
 *
 * *Why the answers are those of the requests made one by one:* each call is a volatile function's,
 * whose statements see what the calls before it in this statement wrote (its slot's row, a waiter's
 * row), and a slot's advisory lock, which a later call of this transaction would be granted again,
 * is skipped by the row the earlier call wrote first. The batch holds its slots' locks until its
 * commit, as each call alone held its own; a taker elsewhere tries the next slot meanwhile.
 */
export async function acquireConcurrencySlots(db: Kysely<any>, schema: string, requests: readonly SlotRequest[]): Promise<SlotAnswer[]> {
  const column = <T>(pick: (request: SlotRequest) => T) => requests.map(pick);
  // Each request's `groups` as a slice of one flat array (a text[] of text[]s must be
  // rectangular): where it starts in it, and how many (null: none given).
  const allGroups: string[] = [];
  const groupsFrom = column((r) => (r.groups ? allGroups.push(...r.groups) - r.groups.length + 1 : null));
  const { rows } = await executePrepared(db, sql<{ idx: string; slot: number | null; retry_after_ms: string | null }>`
    select r.idx, a.slot, a.retry_after_ms
      from unnest(${column((r) => r.group)}::text[], ${column((r) => r.limit)}::int[], ${column((r) => r.scope)}::text[],
                  ${column((r) => r.key)}::text[], ${column((r) => r.owner)}::uuid[], ${column((r) => r.leaseMs)}::int[],
                  ${column((r) => r.starvationMs)}::int[], ${groupsFrom}::int[], ${column((r) => r.groups?.length ?? null)}::int[],
                  ${column((r) => r.jobId ?? null)}::text[], ${column((r) => r.queue ?? null)}::text[])
           with ordinality as r(group_key, slot_limit, scope, key, owner, lease_ms, starvation_ms, groups_from, groups_count, job_id, queue, idx)
     cross join lateral ${sql.id(schema, 'acquire_concurrency_slot')}(
           r.group_key, r.slot_limit, r.scope, r.key, r.owner, r.lease_ms, r.starvation_ms,
           case when r.groups_from is null then null
                else coalesce((${allGroups}::text[])[r.groups_from : r.groups_from + r.groups_count - 1], '{}') end,
           r.job_id, r.queue) as a
     order by r.idx`);
  if (rows.length !== requests.length) throw new Error(`acquire_concurrency_slot answered ${rows.length} of ${requests.length} requests`);
  return rows.map(slotAnswerOf);
}

/** The order in which a batch takes slots: by concurrency key, then by the key that will run in it. */
export function compareSlotRequests(a: SlotRequest, b: SlotRequest): number {
  return compareStrings(a.group, b.group) || compareLockOrder(a, b);
}

function slotAnswerOf(row: { slot: number | null; retry_after_ms: string | null }): SlotAnswer {
  if (row.slot === null) return { acquired: false, retryAfterMs: Math.max(1, Number(row.retry_after_ms ?? 1)) };
  return { acquired: true, slot: row.slot, othersWaiting: row.retry_after_ms !== null };
}

/**
 * How many jobs each group has running and waiting now (for `stats`, tests and the chaos checker):
 * its slots held by a live row, or by a transaction's lock (`sql/concurrency-slots-in-transaction.ts`).
 */
export async function concurrencyGroupCounts(db: Kysely<any>, schema: string, group: string): Promise<{ running: number; waiting: number }> {
  const { rows } = await sql<{ running: number; waiting: number }>`
    with locked as (
      -- Advisory locks of one bigint key (objsubid 1) show it in two halves.
      select (l.classid::bigint << 32) | l.objid::bigint as lock_key from pg_locks as l
       where l.locktype = 'advisory' and l.granted and l.objsubid = 1
         and l.database = (select d.oid from pg_database as d where d.datname = current_database())
    )
    select (select count(*)::int from (
              select s.slot from ${sql.id(schema, 'concurrency_slots')} as s
               where s.group_key = ${group} and ${slotIsLive('s')}
              union
              select n from generate_series(0, ${HIGHEST_LIMIT - 1}) as n
               where ${slotLockKey(sql`${group}::text`, sql.raw('n'))} in (select lock_key from locked)) as held) as running,
           (select count(*)::int from ${sql.id(schema, 'concurrency_waiters')} as w
             where w.group_key = ${group}) as waiting`.execute(db);
  return rows[0]!;
}

/** The highest limit a job may name (the wire contract's `MAX_CONCURRENCY_LIMIT`): slots are numbered below it. */
const HIGHEST_LIMIT = 10_000;

/**
 * DDL of `concurrency_slot_lock_key(group, slot)`, for migration `033_concurrency_slots_in_transaction`:
 * the key of a slot's advisory lock, one bigint hashed from the concurrency key and the slot's
 * number (`hashtextextended`). Every taker of a slot, of a row or of a lock, takes it under this
 * lock. *Why 64 bits:* a slot held by a transaction keeps its lock for the whole run, so two
 * concurrency keys whose locks collided would hold each other's slots back for as long; with the
 * 32-bit hash of the key (migrations 029–032) a collision among some 77,000 keys was likely.
 */
export function concurrencySlotLockKeyDdl(schema: string) {
  return sql`
      create or replace function ${sql.id(schema, 'concurrency_slot_lock_key')}(p_group text, p_slot int)
      returns bigint
      language sql immutable parallel safe as $key$
        select ${slotLockKey(sql.raw('p_group'), sql.raw('p_slot'))}
      $key$`;
}

/**
 * The key of a slot's advisory lock as an expression (see {@link concurrencySlotLockKeyDdl}), for
 * statements that must not depend on the function (a worker's statements on a schema not yet
 * migrated to 033).
 */
export function slotLockKey(group: RawBuilder<unknown>, slot: RawBuilder<unknown>) {
  // int::text, not text || int (which is only stable): the function stays immutable and inlinable.
  return sql<string>`hashtextextended('idempotent_jobs.concurrency:' || ${group} || ':' || (${slot})::text, 0)`;
}

/**
 * The condition under which the row `row` of `concurrency_slots` holds its slot: its time has not
 * run out (see {@link acquireConcurrencySlot}).
 */
function slotIsLive(row: 's' | 's2') {
  return sql`(${sql.raw(row)}.acquired_until > now())`;
}

/**
 * The walk that takes a free slot of a concurrency key, as PL/pgSQL statements: the key's slots
 * held as far as committed runs show, read once; the others tried in turn from a slot drawn at
 * random, wrapping round, each taken only under its own lock (`concurrency_slot_lock_key`, never
 * waited for), after a second look in a statement of its own, which sees what committed before
 * the lock was had: of two takers of one slot the second finds it locked (and tries the next) or,
 * once the first has committed, taken. *Why at random:* from slot 0 up, every take tried the
 * locks of all the slots in use first (with 32 runs of a key in flight, some 16 tries a take).
 * Sets `v_slot` to the slot taken (left as it was, null, when none is free); uses `v_live`,
 * `v_first`, `v_next_live` and `v_candidate`. The held slots are read in order and passed as the
 * walk goes (a refused take on a full key costs one pass, not one search a candidate). One text
 * for both takers of a slot, `acquire_concurrency_slot` (a row) and
 * `take_concurrency_slots_in_transaction` (a transaction's lock): they must count alike. (A walk
 * in PL/pgSQL, not an anti-join over generate_series: planned afresh at each call, that join cost
 * more than the rest of the acquisition.) A null limit takes nothing.
 *
 * `sharedTransaction`: the walk runs in a transaction several jobs may share (a group's, see
 * {@link HELD_BY_THIS_TRANSACTION}): a slot an earlier take of the same transaction took is
 * skipped, since its lock, already held by this session, would be granted again; the slot taken
 * is added to the transaction's list and to `v_taken`. Uses `v_lock` too.
 */
export function freeSlotWalk(
  schema: string,
  group: 'p_group' | 'v_group',
  limit: 'p_limit' | 'v_limit',
  options: { readonly sharedTransaction?: boolean; readonly rowTaker?: boolean } = {},
) {
  const slots = sql.id(schema, 'concurrency_slots');
  const [g, l] = [sql.raw(group), sql.raw(limit)];
  const lockKey = sql`${sql.id(schema, 'concurrency_slot_lock_key')}(${g}, v_candidate)`;
  const held = sql`coalesce(current_setting(${sql.lit(HELD_BY_THIS_TRANSACTION)}, true), '')`;
  const tryLock = options.sharedTransaction
    ? sql`v_lock := ${lockKey};
            continue when strpos(${held}, ',' || v_lock::text || ',') > 0;
            continue when not pg_try_advisory_xact_lock(v_lock);`
    : sql`continue when not pg_try_advisory_xact_lock(${lockKey});`;
  const taken = options.sharedTransaction
    ? sql`perform set_config(${sql.lit(HELD_BY_THIS_TRANSACTION)}, coalesce(nullif(${held}, ''), ',') || v_lock::text || ',', true);
              v_taken := v_taken || v_lock;`
    : sql``;
  // A lock's taker writes no row: a slot with no live row is free.
  const lockTakerLook = () => sql`if not exists (
              select 1 from ${slots} as s2
               where s2.group_key = ${g} and s2.slot = v_candidate and ${slotIsLive('s2')}) then
              v_slot := v_candidate;
              ${taken}
              exit;
            end if;`;
  // A row's taker writes the slot's row. One whose time ran out may be being freed or renewed by
  // its old owner at this moment (neither takes the slot's lock to free it): taken only if its row
  // lock is had at once, else passed over as a locked slot is, so that a batch of takes and a batch
  // of releases never wait on each other's rows in a cycle. The lock's look checks the row's time
  // again on its latest version (a renewal that committed meanwhile makes it live).
  const rowTakerLook = () => sql`select ${slotIsLive('s2')} into v_row_live from ${slots} as s2
             where s2.group_key = ${g} and s2.slot = v_candidate;
            if not found then
              v_slot := v_candidate;
              exit;
            end if;
            if not v_row_live then
              perform 1 from ${slots} as s2
               where s2.group_key = ${g} and s2.slot = v_candidate and not ${slotIsLive('s2')}
                 for update skip locked;
              if found then
                v_slot := v_candidate;
                exit;
              end if;
            end if;`;
  return sql`select coalesce(array_agg(s2.slot order by s2.slot), '{}') into v_live
            from ${slots} as s2
           where s2.group_key = ${g} and s2.slot >= 0 and s2.slot < ${l} and ${slotIsLive('s2')};
          v_first := floor(random() * greatest(coalesce(${l}, 0), 1))::int;
          -- The held slots are passed in order, as the candidates go: from v_first up, then from 0.
          v_next_live := 1;
          while v_next_live <= cardinality(v_live) and v_live[v_next_live] < v_first loop
            v_next_live := v_next_live + 1;
          end loop;
          for v_step in 0 .. coalesce(${l}, 0) - 1 loop
            v_candidate := (v_first + v_step) % ${l};
            if v_candidate = 0 then
              v_next_live := 1;
            end if;
            if v_next_live <= cardinality(v_live) and v_live[v_next_live] = v_candidate then
              v_next_live := v_next_live + 1;
              continue;
            end if;
            ${tryLock}
            ${options.rowTaker ? rowTakerLook() : lockTakerLook()}
          end loop;`;
}

/**
 * Where a transaction that takes concurrency slots by their locks lists the slots it took (their
 * lock keys, `,1,2,`: a custom setting local to the transaction, gone when it ends). *Why:* the
 * jobs of a group share one transaction, and so one session, whose advisory locks are
 * re-entrant: a job's take would be granted the lock of a slot a group-mate holds, and two runs
 * would share one slot. Named `idempotent_jobs.*`, a setting of the library's, which no group
 * state check watches (see `group-settings.ts`).
 */
export const HELD_BY_THIS_TRANSACTION = 'idempotent_jobs.concurrency_slots_held';

/**
 * DDL of the slots and waiters tables and of `acquire_concurrency_slot`, for migration
 * `018_concurrency_slots`. The schema is baked in; a changed body needs a new migration
 * ({@link acquireConcurrencySlotFunctionDdl}).
 */
export function concurrencySlotsDdl(schema: string) {
  const slots = sql.id(schema, 'concurrency_slots');
  const waiters = sql.id(schema, 'concurrency_waiters');
  return [
    sql`
      create table ${slots} (
        group_key       text        not null,
        slot            int         not null,
        owner           uuid        not null,
        scope           text        not null,
        key             text        not null,
        acquired_until  timestamptz not null,
        primary key (group_key, slot)
      )`,
    sql`
      create table ${waiters} (
        group_key  text        not null,
        scope      text        not null,
        key        text        not null,
        since      timestamptz not null default now(),
        seen_at    timestamptz not null default now(),
        primary key (group_key, scope, key)
      )`,
    acquireConcurrencySlotFunctionDdl(schema),
  ];
}

/**
 * DDL of `acquire_concurrency_slot` (see {@link acquireConcurrencySlot}): its current body,
 * installed by migrations `018_concurrency_slots`, `021_key_concurrency_limits`,
 * `022_concurrency_waiters_seen` (a starving waiter holds the free slots only while it keeps
 * coming back), `024_concurrency_limit_sets` (a job may name several keys: `p_groups`),
 * `028_concurrency_slot_wakes` (a waiter's row names its job and queue, `p_job_id` and `p_queue`,
 * so that a freed slot wakes it: `sql/concurrency-slot-wakes.ts`), `029_concurrency_slot_locks`
 * (a lock per slot instead of one per group), `030_concurrency_slot_walk` (the held slots read
 * in one statement and walked, and the slot and the key's records written in one) and
 * `031_concurrency_slot_time` (a slot held by its time alone, not also by its key's lease) and
 * `033_concurrency_slots_in_transaction` (a refusal by a slot held by a transaction, which has
 * no time to wait for, asks again within a second), `035_concurrency_slot_walk_from_random` and
 * `036_concurrency_slot_takes_never_wait` (the stale waiters' sweep and the take of a row whose
 * time ran out skip rows another transaction has locked: with takes and releases batched, a
 * wait on either could close a cycle) and `037_concurrency_takes_without_waiters` (a key with no
 * waiter at all, the common case below its limit, reads one index entry instead of sweeping and
 * reading its waiters) and `038_concurrency_takes_tell_waiters` (a slot taken while another key
 * waits answers `retry_after_ms` 0 beside it, so that a worker keeping its slots frees them). Besides taking the slot, it records the key's concurrency key and limit in
 * `key_concurrency_limits` ({@link keyConcurrencyLimitsDdl}), in the same statement, so no round
 * trip is added; the key's records of keys outside `p_groups` (all the keys its job names; null:
 * only `p_group`) are dropped, so a key whose job now names other keys is not swept under old ones.
 */
export function acquireConcurrencySlotFunctionDdl(schema: string) {
  const slots = sql.id(schema, 'concurrency_slots');
  const waiters = sql.id(schema, 'concurrency_waiters');
  const limits = sql.id(schema, 'key_concurrency_limits');
  return sql`
      create or replace function ${sql.id(schema, 'acquire_concurrency_slot')}(
        p_group text, p_limit int, p_scope text, p_key text, p_owner uuid, p_lease_ms int, p_starvation_ms int,
        p_groups text[] default null, p_job_id text default null, p_queue text default null)
      returns table (slot int, retry_after_ms bigint)
      language plpgsql volatile as $slot$
      #variable_conflict use_column
      declare
        v_slot int;
        v_candidate int;
        v_live int[];
        v_first int;
        v_next_live int;
        v_row_live boolean;
        v_since timestamptz;
        v_starving boolean;
        v_others_waiting boolean;
      begin
        -- Waiters that stopped coming back (their job finished elsewhere, or was removed) no
        -- longer count, and are deleted. A starving waiter older than this one goes first, if it
        -- keeps coming back: one that has not asked again within the bound would hold every slot
        -- for nobody. Decided before any slot's lock is taken, so one that gives way holds none.
        -- The stale ones locked by another transaction (a take of that key, whose batch holds
        -- its row) are left for a later sweep: a sweep that waited for them could close a cycle.
        -- A key with no waiter at all (the common case, below its limit) skips the sweep and the reads.
        v_since := null;
        v_starving := false;
        v_others_waiting := false;
        perform 1 from ${waiters} as w where w.group_key = p_group limit 1;
        if found then
          with stale as (
            delete from ${waiters} as w
             where (w.group_key, w.scope, w.key) in (
               select w2.group_key, w2.scope, w2.key from ${waiters} as w2
                where w2.group_key = p_group and w2.seen_at < now() - 2 * p_starvation_ms * interval '1 millisecond'
                  for update skip locked)
          ), mine as (
            select w.since from ${waiters} as w
             where w.group_key = p_group and w.scope = p_scope and w.key = p_key
               and w.seen_at >= now() - 2 * p_starvation_ms * interval '1 millisecond'
          )
          select (select m.since from mine as m),
                 exists (
                   select 1 from ${waiters} as w
                    where w.group_key = p_group and not (w.scope = p_scope and w.key = p_key)
                      and w.since < now() - p_starvation_ms * interval '1 millisecond'
                      and w.seen_at >= now() - p_starvation_ms * interval '1 millisecond'
                      and w.since < coalesce((select m.since from mine as m), now()))
            into v_since, v_starving;
          -- Told with the slot taken: a worker that keeps its slots for its next runs frees them
          -- instead while another key waits.
          v_others_waiting := exists (
            select 1 from ${waiters} as w
             where w.group_key = p_group and not (w.scope = p_scope and w.key = p_key)
               and w.seen_at >= now() - 2 * p_starvation_ms * interval '1 millisecond');
        end if;
        if not v_starving then
          ${freeSlotWalk(schema, 'p_group', 'p_limit', { rowTaker: true })}
        end if;
        if v_slot is not null then
          -- One statement: the slot, the key no longer waiting, and its concurrency keys recorded.
          with taken as (
            insert into ${slots} as s (group_key, slot, owner, scope, key, acquired_until)
            values (p_group, v_slot, p_owner, p_scope, p_key, now() + p_lease_ms * interval '1 millisecond')
            on conflict (group_key, slot) do update
               set owner = excluded.owner, scope = excluded.scope, key = excluded.key, acquired_until = excluded.acquired_until
          ), no_longer_waiting as (
            delete from ${waiters} as w where w.group_key = p_group and w.scope = p_scope and w.key = p_key
          ), other_keys_dropped as (
            -- Not the row upserted below, whose concurrency key is among p_groups (the worker
            -- always passes the job's keys with p_group among them, or null).
            delete from ${limits} as r
             where r.scope = p_scope and r.key = p_key and r.group_key <> all(coalesce(p_groups, array[p_group]))
          )
          insert into ${limits} as r (scope, key, group_key, concurrency_limit) values (p_scope, p_key, p_group, p_limit)
          on conflict (scope, key, group_key) do update
             set concurrency_limit = excluded.concurrency_limit, recorded_at = now();
          slot := v_slot;
          -- 0 beside a slot: another key waits for one (a worker of an earlier release reads no
          -- retry beside a slot).
          retry_after_ms := case when v_others_waiting then 0 end;
          return next;
          return;
        end if;
        insert into ${waiters} as w (group_key, scope, key, job_id, queue) values (p_group, p_scope, p_key, p_job_id, p_queue)
        on conflict (group_key, scope, key) do update set seen_at = now(), job_id = excluded.job_id, queue = excluded.queue, woken_at = null;
        -- Ask again about when the first slot's time is up, never later than the lease (a run's
        -- heartbeat renews its slot's time as it goes; the caller caps it anyway). A slot held by
        -- a transaction (its lock, no live row: sql/concurrency-slots-in-transaction.ts) frees
        -- when that transaction ends, which no row tells: then ask again within a second.
        select greatest(1, least(coalesce(min(ceil(extract(epoch from (s.acquired_until - now())) * 1000)) filter (where ${slotIsLive('s')}),
                 p_lease_ms), p_lease_ms,
                 case when count(*) filter (where ${slotIsLive('s')}) < p_limit then 1000 else p_lease_ms end))::bigint
          into retry_after_ms
          from ${slots} as s
         where s.group_key = p_group and s.slot < p_limit;
        slot := null;
        return next;
      end;
      $slot$`;
}

/**
 * DDL of `key_concurrency_limits`, for migration `021_key_concurrency_limits`: the concurrency key
 * and limit of each key that took a slot, written by `acquire_concurrency_slot`.
 *
 * *Why:* a key's row keeps the job's name and payload, enough for the sweeper to add a lost job
 * again, but not the job's concurrency key and limit, which are outside the fingerprint and not
 * part of the key; a job added again without them would run outside its limit. A job takes a slot
 * before it claims, so when the sweeper finds its key processing and lost, this table says what
 * limit it ran under. A row outlives its key's run by design (the sweeper may need it at any time
 * while the key is processing); the janitor deletes rows whose key is not processing once they
 * are older than the retention ({@link deleteStaleConcurrencyLimits}).
 */
export function keyConcurrencyLimitsDdl(schema: string) {
  const limits = sql.id(schema, 'key_concurrency_limits');
  return [
    sql`
      create table ${limits} (
        scope              text        not null,
        key                text        not null,
        group_key          text        not null,
        concurrency_limit  int         not null,
        recorded_at        timestamptz not null default now(),
        primary key (scope, key)
      )`,
    // The janitor: records ordered by age.
    sql`create index key_concurrency_limits_recorded on ${limits} (recorded_at)`,
  ];
}

/**
 * DDL of migration `024_concurrency_limit_sets`: a key records each concurrency key its job names
 * (one row per key and concurrency key, where `021_key_concurrency_limits` kept one per key), so
 * the sweeper adds a lost job again under all its limits. The function of the old signature is
 * dropped before the new one is installed: beside it, a call with seven arguments (a worker of an
 * earlier version) would be ambiguous.
 */
export function concurrencyLimitSetsDdl(schema: string) {
  const limits = sql.id(schema, 'key_concurrency_limits');
  return [
    sql`alter table ${limits} drop constraint key_concurrency_limits_pkey`,
    sql`alter table ${limits} add primary key (scope, key, group_key)`,
    sql`drop function if exists ${sql.id(schema, 'acquire_concurrency_slot')}(text, int, text, text, uuid, int, int)`,
    acquireConcurrencySlotFunctionDdl(schema),
  ];
}

/**
 * Deletes up to `limit` records of `key_concurrency_limits` older than `olderThanMs` whose key is
 * not processing (finished, deleted, or never claimed); how many. `FOR UPDATE SKIP LOCKED` as in
 * `deleteExpiredKeys`, so janitors running at once take disjoint batches.
 */
export async function deleteStaleConcurrencyLimits(db: Kysely<any>, schema: string, olderThanMs: number, limit: number): Promise<number> {
  const limits = sql.id(schema, 'key_concurrency_limits');
  const result = await sql`
    with doomed as (
      select r.scope, r.key
        from ${limits} as r
       where r.recorded_at < now() - ${olderThanMs}::bigint * interval '1 millisecond'
         and not exists (
           select 1 from ${sql.id(schema, 'idempotency_keys')} as k
            where k.scope = r.scope and k.key = r.key and k.status = 'processing')
       order by r.recorded_at
       limit ${limit}
         for update skip locked
    )
    delete from ${limits} as r
     using doomed as d
     where r.scope = d.scope and r.key = d.key`.execute(db);
  return Number(result.numAffectedRows ?? 0n);
}
