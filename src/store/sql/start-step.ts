import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import type { Claim } from '../claim-outcome.js';
import { returnsLastResult } from '../last-result-pool.js';
import { sendLeadingStatements, type LeadingStatements } from '../one-trip-commit.js';
import { LEASE_LOST_STATE, isLeaseLost } from './complete-and-commit.js';

/** A step's place in its key's sequence. */
export interface StepPlace {
  /** The step's name, unique within its key. */
  readonly name: string;
  /** 1-based position. */
  readonly position: number;
}

/**
 * Marks an external step as started, before it runs, by a call of `start_step`
 * ({@link startStepFunctionDdl}): its row is created with `starts` 1, or its `starts` goes up
 * by one (a run after a takeover starting it again). Fenced: only the key's current owner and
 * fence may start a step, so a zombie learns it lost the key before it calls anyone.
 *
 * `lead` (the previous step's held record), when given and pending, goes in the same string
 * just before the start, both in one implicit transaction: the previous step is recorded before
 * this one starts, one round trip for both. Over a connection that cannot answer a string of
 * statements with the last one's rows, it goes alone first.
 *
 * Returns the step's start count, this start included; undefined when the claim no longer owns
 * the key, the step is already recorded, or `lead` was refused (the caller throws
 * `LeaseLostError`).
 */
export async function startStep(
  db: Kysely<any>,
  schema: string,
  claim: Claim,
  step: StepPlace,
  lead?: LeadingStatements,
): Promise<number | undefined> {
  if (lead && !returnsLastResult(db)) {
    await sendLeadingStatements(db, lead);
    if (lead.state === 'refused') return undefined;
  }
  const carried = lead?.take() ? lead : undefined;
  try {
    const { rows } = await sql.raw<{ starts: number }>(`${carried ? `${carried.text};\n` : ''}${startStepText(schema, claim, step)}`).execute(db);
    if (carried) carried.state = 'committed';
    return rows[0]!.starts;
  } catch (error) {
    carried?.failedWith(error);
    if (isLeaseLost(error)) return undefined;
    throw error;
  }
}

/** The start as one self-contained statement of literal SQL (values escaped by node-postgres). */
export function startStepText(schema: string, claim: Claim, step: StepPlace): string {
  return `select ${pg.escapeIdentifier(schema)}.start_step(${pg.escapeLiteral(claim.scope)}, ${pg.escapeLiteral(claim.key)}, ${pg.escapeLiteral(claim.owner)}::uuid, ${integer(claim.fence)}, ${pg.escapeLiteral(step.name)}, ${integer(step.position)}) as starts`;
}

function integer(value: number): string {
  if (!Number.isSafeInteger(value)) throw new TypeError(`${value} must be a safe integer to be inlined into SQL.`);
  return String(value);
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
