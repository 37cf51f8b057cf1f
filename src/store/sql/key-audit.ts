import { sql, type Kysely } from 'kysely';
import type { KeyAuditEntry } from '../records.js';

interface KeyAuditRow {
  id: string;
  scope: string;
  key: string;
  action: string;
  actor: string;
  reason: string;
  detail: unknown;
  at: Date;
}

/** A key's operator actions, newest first (served by the `key_audit_by_key` index). */
export async function keyAuditOf(db: Kysely<any>, schema: string, scope: string, key: string, limit: number): Promise<KeyAuditEntry[]> {
  const { rows } = await sql<KeyAuditRow>`
    select * from ${sql.id(schema, 'key_audit')}
     where scope = ${scope} and key = ${key}
     order by id desc
     limit ${limit}`.execute(db);
  return rows.map(toEntry);
}

/** The latest operator actions on any key, newest first (the primary key's order). */
export async function recentKeyAudit(db: Kysely<any>, schema: string, limit: number): Promise<KeyAuditEntry[]> {
  const { rows } = await sql<KeyAuditRow>`
    select * from ${sql.id(schema, 'key_audit')} order by id desc limit ${limit}`.execute(db);
  return rows.map(toEntry);
}

function toEntry(row: KeyAuditRow): KeyAuditEntry {
  return { ...row, id: Number(row.id) };
}
