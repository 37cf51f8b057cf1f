import { sql, type Kysely } from 'kysely';
import type { SettledKeyRow } from '../records.js';

/**
 * Reads the rows of several keys in one statement (one round trip): the fast path's probe for
 * keys that are already settled, so that a duplicate replays without opening a transaction. A
 * plain read of committed rows: `completed` and `failed` are final (until the janitor deletes
 * them), so what it finds stays true; a key it does not find, or finds `processing`, goes the
 * usual way (the claim inside the effect's transaction). Looked up by the primary key.
 */
export async function findSettledKeys(
  db: Kysely<any>,
  schema: string,
  keys: ReadonlyArray<{ readonly scope: string; readonly key: string }>,
): Promise<SettledKeyRow[]> {
  const { rows } = await sql<SettledKeyRow>`
    select k.scope, k.key, k.status, k.fingerprint, k.result, k.error
      from unnest(${keys.map((k) => k.scope)}::text[], ${keys.map((k) => k.key)}::text[]) as wanted(scope, key)
      join ${sql.id(schema, 'idempotency_keys')} as k on k.scope = wanted.scope and k.key = wanted.key`.execute(db);
  return rows;
}
