import { sql, type Kysely } from 'kysely';
import type { CoalesceAnswer, CoalesceArrival } from '../records.js';


/**
 * A coalescing job arrives (see the `coalesce_arrive` function, {@link coalesceArriveFunctionDdl}): one
 * statement, serialized per (scope, key) by the row lock of the key's `coalescing_keys` row.
 *
 * - The job is the one running the key's current generation (a redelivery after a crash or a
 *   retry): run that generation again, with its payload; its idempotency key (`<key>#<generation>`)
 *   replays it if it committed.
 * - The current generation has finished (its idempotency key is completed or failed), or none
 *   ever ran: this job runs the next generation with its own payload, the newest; a payload left
 *   pending is superseded by it.
 * - A run is in flight: the job's payload becomes the pending successor's, replacing any earlier
 *   one (the newest wins), and the job is done (`coalesced`): the running job runs the successor
 *   when its own run ends ({@link coalesceNext}).
 *
 * A generation whose key never got a row and which was handed out more than `staleMs` ago
 * counts as finished: its job was removed before it claimed.
 *
 * "Newest" is the order the producer sent the jobs, where the arrival says when it was sent
 * (`sentAtMs`): an arrival sent before a payload the key already took (running, run or
 * pending) is superseded by it and done (`coalesced`) without changing anything, so a delivery
 * held back by a fault (a Postgres outage deferring it) never runs after a newer one. Without a
 * send time, the order in which arrivals reach Postgres.
 */
export async function coalesceArrive(
  db: Kysely<any>,
  schema: string,
  input: CoalesceArrival,
): Promise<CoalesceAnswer> {
  const sentAt = input.sentAtMs === undefined ? null : new Date(input.sentAtMs).toISOString();
  const { rows } = await sql<{ action: 'run' | 'coalesced'; generation: string | null; payload: unknown }>`
    select * from ${sql.id(schema, 'coalesce_arrive')}(
      ${input.scope}::text, ${input.key}::text, ${input.jobId}::text, ${input.payloadJson}::jsonb, ${input.staleMs}::int,
      ${sentAt}::timestamptz)`.execute(db);
  const row = rows[0]!;
  return row.action === 'run' ? { action: 'run', generation: Number(row.generation), payload: row.payload } : { action: 'coalesced' };
}

/**
 * The running job's run of `generation` has ended: takes the pending successor's payload, if
 * any, as generation + 1 for this same job to run (one statement, under the same row lock);
 * undefined when nothing is pending or another job has taken the key over.
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
 * DDL of `coalesce_arrive(scope, key, job, payload, stale_ms, sent_at)` (see {@link coalesceArrive}).
 * `greatest` ignores nulls: an arrival without a send time leaves the newest one as it was.
 */
export function coalesceArriveFunctionDdl(schema: string) {
  const table = sql.id(schema, 'coalescing_keys');
  const keys = sql.id(schema, 'idempotency_keys');
  return sql`
    create or replace function ${sql.id(schema, 'coalesce_arrive')}(
      p_scope text, p_key text, p_job text, p_payload jsonb, p_stale_ms int, p_sent_at timestamptz default null)
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
      -- Sent before a payload the key already took: that newer payload has run or will.
      if p_sent_at < r.newest_sent_at then
        action := 'coalesced';
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
               assigned_at = now(), pending_payload = null, newest_sent_at = greatest(c.newest_sent_at, p_sent_at)
         where c.scope = p_scope and c.key = p_key
        returning c.generation into generation;
        action := 'run'; payload := p_payload;
        return next;
        return;
      end if;
      update ${table} as c set pending_payload = p_payload, newest_sent_at = greatest(c.newest_sent_at, p_sent_at)
       where c.scope = p_scope and c.key = p_key;
      action := 'coalesced';
      return next;
    end;
    $coalesce$`;
}
