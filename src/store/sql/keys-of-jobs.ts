import { sql, type Kysely } from 'kysely';
import { toKeyRecord, type IdempotencyKeysTable, type KeyRecord, type StepRecord, type TombstoneRecord } from '../records.js';

/** Keys named by (scope, key), as the job views of a queue dashboard list them. */
export type KeyPairs = ReadonlyArray<{ readonly scope: string; readonly key: string }>;

/**
 * What a page of jobs shows of their keys, read in one snapshot (one statement, so that a key
 * deleted between two reads is not shown neither as a key nor as a tombstone): the keys' rows,
 * their steps and the tombstones of keys the janitor deleted, plus the database clock to count
 * leases against. The pairs are sent as two parallel arrays and joined on each table's primary
 * key (the tombstones' on the key's hash), so a page of fifty jobs is one round trip.
 */
export async function keysOfJobs(
  db: Kysely<any>,
  schema: string,
  keys: KeyPairs,
): Promise<{ records: KeyRecord[]; steps: Array<StepRecord & { readonly scope: string; readonly key: string }>; tombstones: TombstoneRecord[]; now: Date }> {
  const scopes = keys.map((k) => k.scope);
  const names = keys.map((k) => k.key);
  const { rows } = await sql<{ kind: 'key' | 'step' | 'tombstone' | 'now'; row: Record<string, unknown> }>`
    with wanted as (select distinct scope, key from unnest(${scopes}::text[], ${names}::text[]) as w(scope, key))
    select 'key' as kind, to_jsonb(k) as row
      from wanted join ${sql.id(schema, 'idempotency_keys')} as k on k.scope = wanted.scope and k.key = wanted.key
    union all
    select 'step', jsonb_build_object('scope', s.scope, 'key', s.key, 'name', s.name, 'position', s.position, 'fence', s.fence,
                                      'starts', s.starts, 'result', s.result, 'started_at', s.started_at, 'recorded_at', s.recorded_at)
      from wanted join ${sql.id(schema, 'job_steps')} as s on s.scope = wanted.scope and s.key = wanted.key
    union all
    select 'tombstone', jsonb_build_object('scope', wanted.scope, 'key', wanted.key, 'failed', t.failed, 'finished_at', t.finished_at,
                                           'expires_at', t.expires_at, 'fingerprint_hash', encode(t.fingerprint_hash, 'hex'))
      from wanted join ${sql.id(schema, 'key_tombstones')} as t
        on t.scope = wanted.scope and t.key_hash = sha256(convert_to(wanted.key, 'UTF8')) and t.expires_at > now()
    union all
    select 'now', jsonb_build_object('now', now())`.execute(db);
  const records: KeyRecord[] = [];
  const steps: Array<StepRecord & { scope: string; key: string }> = [];
  const tombstones: TombstoneRecord[] = [];
  let now = new Date();
  for (const { kind, row } of rows) {
    if (kind === 'key') records.push(toKeyRecord(fromJson(row) as unknown as IdempotencyKeysTable));
    else if (kind === 'step') {
      steps.push({
        scope: row.scope as string,
        key: row.key as string,
        name: row.name as string,
        position: Number(row.position),
        fence: Number(row.fence),
        starts: Number(row.starts),
        result: row.result ?? null,
        startedAt: new Date(row.started_at as string),
        recordedAt: row.recorded_at === null ? null : new Date(row.recorded_at as string),
      });
    } else if (kind === 'tombstone') {
      tombstones.push({
        scope: row.scope as string,
        key: row.key as string,
        outcome: row.failed ? 'failed' : 'completed',
        finishedAt: new Date(row.finished_at as string),
        expiresAt: new Date(row.expires_at as string),
        fingerprintHash: row.fingerprint_hash as string,
      });
    } else now = new Date(row.now as string);
  }
  steps.sort((a, b) => a.position - b.position);
  return { records, steps, tombstones, now };
}

/** A key's row as `to_jsonb` gives it, with its timestamps turned back into dates (as node-postgres reads them). */
function fromJson(row: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = { ...row };
  for (const column of ['locked_until', 'created_at', 'updated_at', 'completed_at', 'expires_at']) {
    if (typeof out[column] === 'string') out[column] = new Date(out[column] as string);
  }
  return out;
}
