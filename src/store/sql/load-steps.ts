import { sql, type Kysely } from 'kysely';
import type { StepRecord } from '../records.js';

interface StepRow {
  name: string;
  position: number;
  fence: string | number;
  starts: number;
  result: unknown;
  started_at: Date;
  recorded_at: Date | null;
}

/**
 * A key's steps in position order: what a run replays and checks its calls against. One
 * statement, served by the primary key's (scope, key) prefix. Read once per run, when the
 * handler first calls `ctx.step`; the run's claim fences out every other writer of the key's
 * steps, so the read stays true for the rest of the run.
 */
export async function loadSteps(db: Kysely<any>, schema: string, scope: string, key: string): Promise<StepRecord[]> {
  const { rows } = await sql<StepRow>`
    select name, position, fence, starts, result, started_at, recorded_at
      from ${sql.id(schema, 'job_steps')}
     where scope = ${scope} and key = ${key}
     order by position`.execute(db);
  return rows.map((row) => ({
    name: row.name,
    position: row.position,
    fence: Number(row.fence),
    starts: row.starts,
    result: row.result,
    startedAt: row.started_at,
    recordedAt: row.recorded_at,
  }));
}
