import { CompiledQuery, sql, type Kysely } from 'kysely';
import pg from 'pg';
import type { Claim } from '../claim-outcome.js';
import { sendStatements } from '../pipeline.js';
import { AbortedTransactionError, COMMIT, commitApplied } from '../transaction-control.js';
import { LEASE_LOST_STATE, isLeaseLost } from './complete-and-commit.js';
import type { StepPlace } from '../records.js';

/**
 * Records a step's result, fenced, by a call of `record_step` ({@link recordStepFunctionDdl}),
 * as a statement of its own (an external step, after its call returned). Returns false when
 * the claim no longer owns the key, or the step was recorded already (the caller throws
 * `LeaseLostError`); any other error is thrown as it is.
 */
export async function recordStep(db: Kysely<any>, schema: string, claim: Claim, step: StepPlace, resultJson: string): Promise<boolean> {
  try {
    await sql`
      select ${sql.id(schema, 'record_step')}(
        ${claim.scope}::text, ${claim.key}::text, ${claim.owner}::uuid, ${claim.fence}::bigint,
        ${step.name}::text, ${step.position}::int, ${resultJson}::jsonb)`.execute(db);
    return true;
  } catch (error) {
    if (isLeaseLost(error)) return false;
    throw error;
  }
}

/**
 * A database step's record and the COMMIT of the step's transaction, in ONE round trip (one
 * pipeline, as `completeAndCommit`). When the record is refused, Postgres skips the rest of the
 * pipeline, so the COMMIT never runs and the caller rolls the step's effect back with it.
 *
 * Returns false when the record was refused (lease lost, or recorded already); any other error
 * is thrown as it is.
 */
export async function recordStepAndCommit(tx: Kysely<any>, schema: string, claim: Claim, step: StepPlace, resultJson: string): Promise<boolean> {
  const reply = await sendStatements(tx, [recordStepStatement(schema, claim, step, resultJson), COMMIT]);
  if (reply.failure) {
    if (isLeaseLost(reply.failure.error)) return false;
    throw reply.failure.error;
  }
  if (!commitApplied(reply.results[1])) throw new AbortedTransactionError();
  return true;
}

/**
 * A database step's record inside `tx`, a transaction another party commits (a data layer's,
 * see `foreign-transaction.ts`): the record is the transaction's last statement, and it commits
 * or rolls back with the step's writes. Returns false when the record was refused (lease lost,
 * or recorded already): the caller rolls the transaction back.
 */
export async function recordStepIn(tx: Kysely<any>, schema: string, claim: Claim, step: StepPlace, resultJson: string): Promise<boolean> {
  try {
    await tx.executeQuery(recordStepStatement(schema, claim, step, resultJson));
    return true;
  } catch (error) {
    if (isLeaseLost(error)) return false;
    throw error;
  }
}

/** The record as one statement: a call of `record_step`, which a pipeline can carry ahead of other work. */
export function recordStepStatement(schema: string, claim: Claim, step: StepPlace, resultJson: string): CompiledQuery {
  return CompiledQuery.raw(
    `select ${pg.escapeIdentifier(schema)}.record_step($1::text, $2::text, $3::uuid, $4::bigint, $5::text, $6::int, $7::jsonb)`,
    [claim.scope, claim.key, claim.owner, claim.fence, step.name, step.position, resultJson],
  );
}

/**
 * DDL of `record_step(scope, key, owner, fence, name, position, result)`, for the migration that
 * installs it.
 *
 * 1. The key's row is read `for share` under the claim's owner token and fence, `processing`:
 *    a takeover's UPDATE of that row waits until this transaction ends, and a takeover that
 *    committed first leaves no matching row (read committed re-checks the newest version), so
 *    a zombie's record raises {@link LEASE_LOST_STATE} and its transaction, a database step's
 *    effect included, rolls back. Held only from here to the COMMIT that follows in the same
 *    string, so the heartbeat is not held up.
 * 2. The step's row is inserted as recorded, or an external step's started row becomes
 *    recorded. A row recorded already is left as it is and raises the same: of two claims,
 *    only one ever records a step (the primary key makes the second wait for the first).
 */
export function recordStepFunctionDdl(schema: string) {
  return sql`
    create or replace function ${sql.id(schema, 'record_step')}(
      p_scope text, p_key text, p_owner uuid, p_fence bigint, p_name text, p_position int, p_result jsonb)
    returns void
    language plpgsql volatile as $record_step$
    begin
      perform 1 from ${sql.id(schema, 'idempotency_keys')} as k
       where k.scope = p_scope and k.key = p_key
         and k.owner = p_owner and k.fence = p_fence
         and k.status = 'processing'
         for share;
      if not found then
        raise exception 'lease lost: key % in scope % is no longer owned by this claim (fence %); step % not recorded', p_key, p_scope, p_fence, p_name
          using errcode = ${sql.lit(LEASE_LOST_STATE)};
      end if;
      insert into ${sql.id(schema, 'job_steps')} as s (scope, key, name, position, fence, starts, result, started_at, recorded_at)
      values (p_scope, p_key, p_name, p_position, p_fence, 1, p_result, now(), clock_timestamp())
      on conflict (scope, key, name) do update
         set position = excluded.position, fence = excluded.fence, result = excluded.result, recorded_at = excluded.recorded_at
       where s.recorded_at is null;
      if not found then
        raise exception 'step % of key % in scope % is already recorded', p_name, p_key, p_scope
          using errcode = ${sql.lit(LEASE_LOST_STATE)};
      end if;
    end;
    $record_step$`;
}

