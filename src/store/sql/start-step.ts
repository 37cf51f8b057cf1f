import { CompiledQuery, sql, type Kysely } from 'kysely';
import pg from 'pg';
import type { Claim } from '../claim-outcome.js';
import { sendHeldRecord, noteHeldRecordFate, type HeldRecord } from '../one-trip-commit.js';
import { pipelines, sendStatements, type PipelineReply } from '../pipeline.js';
import { LEASE_LOST_STATE, isLeaseLost } from './complete-and-commit.js';
import type { StepPlace } from '../records.js';

/**
 * Marks an external step as started, before it runs, by a call of `start_step`
 * ({@link startStepFunctionDdl}): its row is created with `starts` 1, or its `starts` goes up
 * by one (a run after a takeover starting it again). Fenced: only the key's current owner and
 * fence may start a step, so a zombie learns it lost the key before it calls anyone.
 *
 * `heldRecord` (the previous step's held record), when given and pending, goes in the same pipeline
 * just before the start, both in one implicit transaction (no BEGIN: they commit together at the
 * pipeline's end, or neither does): the previous step is recorded before this one starts, one
 * round trip for both. The heldRecord's state says what became of it. Over a connection that cannot
 * pipeline, it goes alone first.
 *
 * Returns the step's start count, this start included; undefined when the claim no longer owns
 * the key, the step is already recorded, or `heldRecord` was refused (the caller throws
 * `LeaseLostError`).
 */
export async function startStep(
  db: Kysely<any>,
  schema: string,
  claim: Claim,
  step: StepPlace,
  heldRecord?: HeldRecord,
): Promise<number | undefined> {
  if (heldRecord && !pipelines(db)) {
    await sendHeldRecord(db, heldRecord);
    if (heldRecord.state === 'refused') return undefined;
    if (heldRecord.state === 'failed') throw heldRecord.error;
  }
  const carried = heldRecord?.take() ? heldRecord : undefined;
  const statements = [...(carried ? [carried.statement] : []), startStepStatement(schema, claim, step)];
  let reply: PipelineReply | undefined;
  try {
    reply = await sendStatements(db, statements);
  } finally {
    // Both commit at the pipeline's end: the record did only if the start did too.
    if (carried) noteHeldRecordFate(carried, reply, 0, statements.length - 1);
  }
  if (reply.failure) {
    if (isLeaseLost(reply.failure.error)) return undefined;
    throw reply.failure.error;
  }
  return (reply.results[statements.length - 1]!.rows[0] as { starts: number }).starts;
}

/** The start as one statement: a call of `start_step`. */
export function startStepStatement(schema: string, claim: Claim, step: StepPlace): CompiledQuery {
  return CompiledQuery.raw(`select ${pg.escapeIdentifier(schema)}.start_step($1::text, $2::text, $3::uuid, $4::bigint, $5::text, $6::int) as starts`, [
    claim.scope,
    claim.key,
    claim.owner,
    claim.fence,
    step.name,
    step.position,
  ]);
}

/**
 * DDL of `start_step(scope, key, owner, fence, name, position)`, for the migration that
 * installs it. The key's row is read `for share` under the claim's owner token and fence: a
 * takeover (an UPDATE of that row) waits for this statement, or this statement, coming after
 * it, finds no row and raises {@link LEASE_LOST_STATE}. A recorded step is never started again
 * (the upsert's condition), which raises the same.
 */
export function startStepFunctionDdl(schema: string) {
  return sql`
    create or replace function ${sql.id(schema, 'start_step')}(
      p_scope text, p_key text, p_owner uuid, p_fence bigint, p_name text, p_position int)
    returns integer
    language plpgsql volatile as $start_step$
    declare
      v_starts integer;
    begin
      perform 1 from ${sql.id(schema, 'idempotency_keys')} as k
       where k.scope = p_scope and k.key = p_key
         and k.owner = p_owner and k.fence = p_fence
         and k.status = 'processing'
         for share;
      if not found then
        raise exception 'lease lost: key % in scope % is no longer owned by this claim (fence %); step % not started', p_key, p_scope, p_fence, p_name
          using errcode = ${sql.lit(LEASE_LOST_STATE)};
      end if;
      insert into ${sql.id(schema, 'job_steps')} as s (scope, key, name, position, fence, starts, started_at)
      values (p_scope, p_key, p_name, p_position, p_fence, 1, now())
      on conflict (scope, key, name) do update
         set starts = s.starts + 1, position = excluded.position, fence = excluded.fence, started_at = excluded.started_at
       where s.recorded_at is null
      returning s.starts into v_starts;
      if not found then
        raise exception 'step % of key % in scope % is already recorded', p_name, p_key, p_scope
          using errcode = ${sql.lit(LEASE_LOST_STATE)};
      end if;
      return v_starts;
    end;
    $start_step$`;
}
