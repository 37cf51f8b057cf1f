import { sql, type Kysely } from 'kysely';

/** A key's state as the reconciler needs it. */
export interface PresentKey {
  readonly status: string;
  /** `processing` with its lease run out (by the database's clock): no owner is working on it. */
  readonly leaseExpired: boolean;
}

/**
 * Which of `keys` (scope and key) have a row, and in which state: one statement for a batch, the
 * pairs sent as two parallel arrays and joined on the primary key. The reconciler asks it of
 * keys whose jobs BullMQ holds as completed; a pair missing from the answer is a key that
 * vanished, one left `processing` past its lease lost its completion.
 */
export async function presentKeys(
  db: Kysely<any>,
  schema: string,
  keys: ReadonlyArray<{ readonly scope: string; readonly key: string }>,
): Promise<Map<string, PresentKey>> {
  if (keys.length === 0) return new Map();
  const { rows } = await sql<{ scope: string; key: string; status: string; lease_expired: boolean }>`
    select k.scope, k.key, k.status, (k.status = 'processing' and k.locked_until < now()) as lease_expired
      from unnest(${keys.map((k) => k.scope)}::text[], ${keys.map((k) => k.key)}::text[]) as wanted(scope, key)
      join ${sql.id(schema, 'idempotency_keys')} as k on k.scope = wanted.scope and k.key = wanted.key`.execute(db);
  return new Map(rows.map((row) => [presentKeyId(row.scope, row.key), { status: row.status, leaseExpired: row.lease_expired === true }]));
}

/** How {@link presentKeys} names a key in its answer. */
export const presentKeyId = (scope: string, key: string): string => JSON.stringify([scope, key]);
