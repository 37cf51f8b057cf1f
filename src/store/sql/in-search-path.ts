import { CompiledQuery, sql, type Kysely } from 'kysely';

/** What a statement run by {@link runInSearchPath} returned. */
export interface ForeignStatementResult {
  readonly rows: any[];
  readonly rowCount: number;
}

/**
 * Runs another library's statement (BullMQ's PostgreSQL backend's, whose SQL names its tables
 * and functions unqualified) inside the caller's transaction `tx`, with `search_path` set to
 * `schema` for that statement only: three statements, because a parameterised statement cannot
 * set its own search path.
 *
 * - The old path is read in a MATERIALIZED CTE, so it is read before `set_config` changes it.
 * - `set_config(…, true)` is transaction-local: even a restore that never runs (the statement
 *   failed and the transaction is aborted) ends with the transaction. The restore is
 *   transaction-local too, so a session-level path the caller set survives the commit as it was.
 * - Only `schema` is on the path while the statement runs (as BullMQ pins its own connections'
 *   path), so nothing of the caller's can shadow a name of BullMQ's.
 */
export async function runInSearchPath(tx: Kysely<any>, schema: string, text: string, parameters: readonly unknown[]): Promise<ForeignStatementResult> {
  const quoted = `"${schema.replace(/"/g, '""')}"`;
  const { rows } = await sql<{ previous: string }>`
    with old as materialized (select current_setting('search_path') as previous)
    select previous, set_config('search_path', ${quoted}, true) from old`.execute(tx);
  try {
    const result = await tx.executeQuery(CompiledQuery.raw(text, [...parameters]));
    return { rows: result.rows as any[], rowCount: Number(result.numAffectedRows ?? result.rows.length) };
  } finally {
    await sql`select set_config('search_path', ${rows[0]!.previous}, true)`.execute(tx).catch(() => {});
  }
}
