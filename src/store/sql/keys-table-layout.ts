import { sql, type Kysely } from 'kysely';
import type { KeysTableLayout } from '../records.js';

/**
 * Reads from the catalog whether `schema.idempotency_keys` exists and which hash partitions
 * it has. Migrations read it to refuse a layout other than the one asked for; the janitor, to
 * delete partition by partition. One catalog query, no table access.
 */
export async function keysTableLayout(db: Kysely<any>, schema: string): Promise<KeysTableLayout> {
  const { rows } = await sql<{ relname: string; partition: string | null }>`
    select parent.relname, child.relname as partition
      from pg_class as parent
      join pg_namespace as n on n.oid = parent.relnamespace
      left join pg_inherits as i on i.inhparent = parent.oid
      left join pg_class as child on child.oid = i.inhrelid
     where n.nspname = ${schema} and parent.relname = 'idempotency_keys' and parent.relkind in ('r', 'p')
     order by (substring(pg_get_expr(child.relpartbound, child.oid) from 'remainder (\\d+)'))::int`.execute(db);
  return {
    exists: rows.length > 0,
    partitions: rows.flatMap((r) => (r.partition === null ? [] : [r.partition])),
  };
}
