import { sql, type Kysely } from 'kysely';
import { toKeyRecord, type IdempotencyKeysTable, type KeyRecord, type RecentKeysKind } from '../records.js';

/**
 * A short list of keys an operator looks at first:
 * - `expired-lease`: processing keys whose lease has run out, longest ago first (crashed
 *   owners, released keys nobody has claimed yet); read through the partial `processing` index.
 * - `failed`: failed keys, latest first.
 * - `taken-over`: keys claimed more than once (a takeover after a crash, a retry after a
 *   release), latest first.
 * The last two sort the whole table by `updated_at` (a top-N sort bounded by `limit`): a read
 * a person makes when opening a page, like `stats`' counts, never a per-job one; no index on
 * `updated_at` is kept for it, since that would make every completion's update non-HOT.
 */
export async function recentKeys(db: Kysely<any>, schema: string, kind: RecentKeysKind, limit: number): Promise<KeyRecord[]> {
  const table = sql.id(schema, 'idempotency_keys');
  const query =
    kind === 'expired-lease'
      ? sql<IdempotencyKeysTable>`select * from ${table} where status = 'processing' and locked_until <= now() order by locked_until limit ${limit}`
      : kind === 'failed'
        ? sql<IdempotencyKeysTable>`select * from ${table} where status = 'failed' order by updated_at desc, scope, key limit ${limit}`
        : sql<IdempotencyKeysTable>`select * from ${table} where attempts > 1 order by updated_at desc, scope, key limit ${limit}`;
  const { rows } = await query.execute(db);
  return rows.map(toKeyRecord);
}

/** The database's clock now: the page shows ages and lease ends against it, not the server's. */
export async function databaseNow(db: Kysely<any>): Promise<Date> {
  const { rows } = await sql<{ now: Date }>`select now() as now`.execute(db);
  return rows[0]!.now;
}
