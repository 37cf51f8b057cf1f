import { sql, type Kysely } from 'kysely';
import type { CoalesceAnswer, CoalesceArrival } from '../records.js';


/**
 * A coalescing job arrives (see the `coalesce_arrive` function, {@link coalesceArriveFunctionDdl}): one
 * statement, serialized per (scope, key) by the row lock of the key's `coalescing_keys` row.
 *
 * - The job is the key's running job (a redelivery after a crash, a retry, a store fault at the
 *   hand-over): while its generation has not ended, it runs that generation again, with its
 *   payload (its idempotency key `<key>#<generation>` replays it if it committed meanwhile); once
 *   it has ended, the job takes the pending successor as the next generation, or, none pending,
 *   is `finished`: nothing is left for it to run.
 * - The job ran the generation before the current one, or its payload is the newest the key took
 *   (running, run or pending): a redelivery whose acknowledgement was lost; `finished`, or
 *   `coalesced`, and nothing changes.
 * - The job was sent before the newest payload the key took: superseded by it, `coalesced`.
 * - The current generation has ended, or none ever ran: this job runs the next generation with
 *   its own payload, the newest; a payload left pending (older) is superseded by it.
 * - A run is in flight: the job's payload becomes the pending successor's, replacing any earlier
 *   one (the newest wins), and the job is done (`coalesced`): the running job runs the successor
 *   when its run ends ({@link coalesceNext}), or its redelivery does.
 *
 * A generation has ended when its key is completed or failed, or when the key was deleted after
 * it finished (the deletion records it on the row: see `coalescing-janitor.ts`), so a retention
 * shorter than the wait for the next arrival strands nothing and runs nothing twice. A generation
 * whose key never got a row and which was handed out more than `staleMs` ago counts as ended for
 * other jobs: its job was removed before it claimed.
 *
 * "Newest" is the order in which the jobs were sent. A job's send time is the broker's
 * (`sentAtMs`: BullMQ's job timestamp, JetStream's stored time) when it is not later than the
 * database's clock; a job without one, or with one ahead of that clock (a producer clock running
 * ahead), counts as sent when it first arrives, by the database's clock, which is remembered
 * (`coalescing_arrivals`) so that each delivery of the job counts the same. So a delivery held back
 * by a fault (a Postgres outage deferring it), or delivered again, never runs after a newer one.
 */
export async function coalesceArrive(
  db: Kysely<any>,
  schema: string,
  input: CoalesceArrival,
): Promise<CoalesceAnswer> {
  const sentAt = input.sentAtMs === undefined ? null : new Date(input.sentAtMs).toISOString();
  const { rows } = await sql<{ action: 'run' | 'coalesced' | 'finished'; generation: string | null; payload: unknown }>`
    select * from ${sql.id(schema, 'coalesce_arrive')}(
      ${input.scope}::text, ${input.key}::text, ${input.jobId}::text, ${input.payloadJson}::jsonb, ${input.staleMs}::int,
      ${sentAt}::timestamptz)`.execute(db);
  const row = rows[0]!;
  if (row.action === 'run') return { action: 'run', generation: Number(row.generation), payload: row.payload };
  return row.action === 'finished' ? { action: 'finished', generation: Number(row.generation) } : { action: 'coalesced' };
}

/**
 * The running job's run of `generation` has ended: takes the pending successor's payload, if
 * any, as generation + 1 for this same job to run (one statement, under the same row lock);
 * undefined when nothing is pending or another job has taken the key over. When this statement
 * never runs (a store fault, a crash after the generation's commit), the job's redelivery takes
 * the successor through {@link coalesceArrive}.
 */
export async function coalesceNext(
  db: Kysely<any>,
  schema: string,
  input: { readonly scope: string; readonly key: string; readonly jobId: string; readonly generation: number },
): Promise<{ readonly generation: number; readonly payload: unknown } | undefined> {
  const { rows } = await sql<{ generation: string; running_payload: unknown }>`
    update ${sql.id(schema, 'coalescing_keys')}
       set generation = generation + 1, running_payload = pending_payload, pending_payload = null,
           assigned_at = now()
     where scope = ${input.scope} and key = ${input.key}
       and running_job = ${input.jobId} and generation = ${input.generation}
       and pending_payload is not null
    returning generation, running_payload`.execute(db);
  const row = rows[0];
  return row ? { generation: Number(row.generation), payload: row.running_payload } : undefined;
}


/** DDL of `coalescing_keys` and the first `coalesce_arrive`, for migration `019_coalescing` (as it ran; see {@link coalesceArriveFunctionDdl}). */
export function coalescingDdl(schema: string) {
  const table = sql.id(schema, 'coalescing_keys');
  const keys = sql.id(schema, 'idempotency_keys');
  return [
    sql`
      create table ${table} (
        scope            text        not null,
        key              text        not null,
        generation       bigint      not null default 0,
        running_job      text,
        running_payload  jsonb,
        assigned_at      timestamptz,
        pending_payload  jsonb,
        primary key (scope, key)
      )`,
    sql`
      create or replace function ${sql.id(schema, 'coalesce_arrive')}(
        p_scope text, p_key text, p_job text, p_payload jsonb, p_stale_ms int)
      returns table (action text, generation bigint, payload jsonb)
      language plpgsql volatile as $coalesce$
      #variable_conflict use_column
      declare
        r record;
        v_run_key text;
        v_finished boolean;
      begin
        insert into ${table} as c (scope, key) values (p_scope, p_key) on conflict do nothing;
        select * into r from ${table} as c where c.scope = p_scope and c.key = p_key for update;
        if r.running_job = p_job then
          action := 'run'; generation := r.generation; payload := r.running_payload;
          return next;
          return;
        end if;
        v_run_key := p_key || '#' || r.generation;
        v_finished := r.running_job is null
          or exists (select 1 from ${keys} as k where k.scope = p_scope and k.key = v_run_key and k.status in ('completed', 'failed'))
          or (r.assigned_at < now() - p_stale_ms * interval '1 millisecond'
              and not exists (select 1 from ${keys} as k where k.scope = p_scope and k.key = v_run_key));
        if v_finished then
          update ${table} as c
             set generation = c.generation + 1, running_job = p_job, running_payload = p_payload,
                 assigned_at = now(), pending_payload = null
           where c.scope = p_scope and c.key = p_key
          returning c.generation into generation;
          action := 'run'; payload := p_payload;
          return next;
          return;
        end if;
        update ${table} as c set pending_payload = p_payload where c.scope = p_scope and c.key = p_key;
        action := 'coalesced';
        return next;
      end;
      $coalesce$`,
  ];
}

/**
 * Migration `025_coalescing_send_order`: the send time of the newest payload each key took
 * (`coalescing_keys.newest_sent_at`), and `coalesce_arrive` with the arrival's send time as a
 * last parameter (default null, so an older worker's five-argument call still resolves; the old
 * signature is dropped first).
 */
export function coalescingSendOrderDdl(schema: string) {
  return [
    sql`alter table ${sql.id(schema, 'coalescing_keys')} add column if not exists newest_sent_at timestamptz`,
    sql`drop function if exists ${sql.id(schema, 'coalesce_arrive')}(text, text, text, jsonb, int)`,
    coalesceArriveFunctionDdl(schema),
  ];
}

/**
 * Migration `027_coalescing_ends`: a generation's end outlives its key, every delivery of a job
 * counts as sent at the same time, and rows can be deleted.
 *
 * - `finished_generation`: the generation whose key was deleted after it finished (written by
 *   the key's deletion, in the same statement: see `coalescing-janitor.ts`).
 * - `previous_job`, `previous_generation`: the job that ran the generation before the current
 *   one (or ran the current one, once it is done with it) and that generation, and `newest_job`:
 *   the job whose payload is the newest the key took. A redelivery of either runs nothing.
 * - `coalescing_arrivals`: the send time a job without a trustworthy one (none, or ahead of the
 *   database's clock) was given at its first arrival, so that its redeliveries count the same.
 * - `coalescing_generation_floor`: one row, the highest generation of any coalescing row the
 *   janitor deleted. A key's new row starts past it, so its generations never meet a key (or a
 *   tombstone) of an earlier row's generation, which would replay instead of running.
 * - indexes on `coalescing_keys.assigned_at` and `coalescing_arrivals.arrived_at`: the janitor
 *   finds idle rows and old arrivals by them.
 * - send times stored ahead of the database clock (before arrivals were clamped to it) are
 *   brought back to it, so that a producer clock that ran ahead strands no key.
 * - `coalesce_arrive`'s current body (same signature).
 *
 * Each statement may run again (a migration test runs every migration after the one it tests again).
 */
export function coalescingEndsDdl(schema: string) {
  const table = sql.id(schema, 'coalescing_keys');
  const arrivals = sql.id(schema, 'coalescing_arrivals');
  const floor = sql.id(schema, 'coalescing_generation_floor');
  return [
    sql`alter table ${table} add column if not exists finished_generation bigint`,
    sql`alter table ${table} add column if not exists previous_job text`,
    sql`alter table ${table} add column if not exists previous_generation bigint`,
    sql`alter table ${table} add column if not exists newest_job text`,
    sql`
      create table if not exists ${arrivals} (
        scope       text        not null,
        key         text        not null,
        job_id      text        not null,
        sent_at     timestamptz not null,
        arrived_at  timestamptz not null default now(),
        primary key (scope, key, job_id)
      )`,
    sql`create index if not exists coalescing_arrivals_arrived_at on ${arrivals} (arrived_at)`,
    sql`create table if not exists ${floor} (generation bigint not null)`,
    sql`insert into ${floor} (generation) select 0 where not exists (select 1 from ${floor})`,
    sql`create index if not exists coalescing_keys_assigned_at on ${table} (assigned_at)`,
    sql`update ${table} set newest_sent_at = now() where newest_sent_at > now()`,
    coalesceArriveFunctionDdl(schema),
  ];
}

/**
 * DDL of `coalesce_arrive(scope, key, job, payload, stale_ms, sent_at)` (see {@link coalesceArrive}).
 *
 * - The row is found locked, or made: a row the janitor deletes between the insert's conflict
 *   and the lock is made again (the loop); a new row's generations start past the floor, read
 *   after the insert, so after the commit of a janitor whose deletion the insert waited for.
 * - The job's send time: the one its first arrival was given, if it was given one; else the
 *   broker's, if not ahead of `now()`; else `now()`, given and remembered. A send time ahead of
 *   the clock would otherwise make its payload newer than everything sent for as long as that
 *   producer's clock is ahead; given anew at each delivery, a redelivery would count as new.
 */
export function coalesceArriveFunctionDdl(schema: string) {
  const table = sql.id(schema, 'coalescing_keys');
  const arrivals = sql.id(schema, 'coalescing_arrivals');
  const floor = sql.id(schema, 'coalescing_generation_floor');
  const keys = sql.id(schema, 'idempotency_keys');
  return sql`
    create or replace function ${sql.id(schema, 'coalesce_arrive')}(
      p_scope text, p_key text, p_job text, p_payload jsonb, p_stale_ms int, p_sent_at timestamptz default null)
    returns table (action text, generation bigint, payload jsonb)
    language plpgsql volatile as $coalesce$
    #variable_conflict use_column
    declare
      r record;
      v_sent timestamptz;
      v_run_key text;
      v_ended boolean;
      v_made int;
    begin
      loop
        select * into r from ${table} as c where c.scope = p_scope and c.key = p_key for update;
        exit when found;
        insert into ${table} as c (scope, key) values (p_scope, p_key) on conflict do nothing;
        get diagnostics v_made = row_count;
        if v_made > 0 then
          update ${table} as c set generation = (select f.generation from ${floor} as f)
           where c.scope = p_scope and c.key = p_key;
        end if;
      end loop;
      select a.sent_at into v_sent from ${arrivals} as a where a.scope = p_scope and a.key = p_key and a.job_id = p_job;
      if v_sent is null then
        if p_sent_at <= now() then
          v_sent := p_sent_at;
        else
          v_sent := now();
          insert into ${arrivals} as a (scope, key, job_id, sent_at) values (p_scope, p_key, p_job, v_sent);
        end if;
      end if;
      v_run_key := p_key || '#' || r.generation;
      v_ended := coalesce(r.finished_generation >= r.generation, false)
        or exists (select 1 from ${keys} as k where k.scope = p_scope and k.key = v_run_key and k.status in ('completed', 'failed'));
      if r.running_job = p_job then
        if not v_ended then
          action := 'run'; generation := r.generation; payload := r.running_payload;
          return next;
          return;
        end if;
        -- Its run ended and it did not hand over (a fault, a crash after the commit): it does now.
        if r.pending_payload is not null then
          update ${table} as c
             set generation = c.generation + 1, running_payload = c.pending_payload, pending_payload = null, assigned_at = now()
           where c.scope = p_scope and c.key = p_key
          returning c.generation, c.running_payload into generation, payload;
          action := 'run';
          return next;
          return;
        end if;
        update ${table} as c set running_job = null, previous_job = p_job, previous_generation = c.generation
         where c.scope = p_scope and c.key = p_key;
        action := 'finished'; generation := r.generation;
        return next;
        return;
      end if;
      if r.previous_job = p_job then
        action := 'finished'; generation := r.previous_generation;
        return next;
        return;
      end if;
      -- Its payload is the newest the key took, or it was sent before that one: nothing new.
      if r.newest_job = p_job or v_sent < r.newest_sent_at then
        action := 'coalesced';
        return next;
        return;
      end if;
      if r.running_job is null or v_ended
         or (r.assigned_at < now() - p_stale_ms * interval '1 millisecond'
             and not exists (select 1 from ${keys} as k where k.scope = p_scope and k.key = v_run_key)) then
        update ${table} as c
           set generation = c.generation + 1, running_job = p_job, running_payload = p_payload,
               assigned_at = now(), pending_payload = null, newest_sent_at = v_sent, newest_job = p_job,
               previous_job = coalesce(c.running_job, c.previous_job),
               previous_generation = case when c.running_job is null then c.previous_generation else c.generation end
         where c.scope = p_scope and c.key = p_key
        returning c.generation into generation;
        action := 'run'; payload := p_payload;
        return next;
        return;
      end if;
      update ${table} as c set pending_payload = p_payload, newest_sent_at = v_sent, newest_job = p_job
       where c.scope = p_scope and c.key = p_key;
      action := 'coalesced';
      return next;
    end;
    $coalesce$`;
}
