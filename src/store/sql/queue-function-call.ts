import { CompiledQuery, sql, type Kysely } from 'kysely';
import pg from 'pg';
import { groupPostlude } from '../gathering-connection.js';
import type { ForeignStatementResult } from './in-search-path.js';

/**
 * BullMQ's PostgreSQL statements name their functions unqualified (its own connections pin
 * `search_path` to the queue's schema), and most of them are one call of one function:
 * `SELECT move_to_completed($1, …, $4::jsonb, …) AS finished_on;`. Such a call, when the
 * function pins its own search path (`SET search_path FROM CURRENT`, as BullMQ creates its
 * job functions), can run on a caller's transaction with only the function's name qualified:
 * one statement, which changes no setting, so it can share a group's transaction (the path
 * switch of `in-search-path.ts` is a `set_config`, which a group refuses).
 *
 * The shape accepted: comment lines, then `SELECT name(` parameters with optional casts to
 * built-in types `)`, an optional `AS alias`, an optional `;`. Anything else (a table read, a
 * cast to one of BullMQ's own types, a function that does not pin its path) goes through the
 * path switch, as before.
 */
const ONE_CALL = /^SELECT\s+([a-z_][a-z0-9_]*)\s*(\((?:\s*\$\d+(?:::(?:jsonb|json|text|bigint|integer|int|boolean|text\[\]|jsonb\[\]|bigint\[\]))?\s*,?)*\s*\)(?:\s+AS\s+[a-z_][a-z0-9_]*)?\s*;?\s*)$/is;

/** The function `text` calls, and the text after the name, when `text` is one call of the accepted shape. */
function oneCall(text: string): { readonly name: string; readonly rest: string } | undefined {
  const code = text.replace(/^(?:\s*--[^\n]*\n)*/, '').trim();
  const match = ONE_CALL.exec(code);
  return match ? { name: match[1]!.toLowerCase(), rest: match[2]! } : undefined;
}

/**
 * The functions of each queue schema that pin their search path, read from the catalog once per
 * process and schema (on the first transaction that needs them). A failed read is tried again.
 */
const pinnedBySchema = new Map<string, Promise<ReadonlySet<string>>>();

async function functionsPinningTheirPath(tx: Kysely<any>, schema: string): Promise<ReadonlySet<string>> {
  let pinned = pinnedBySchema.get(schema);
  if (!pinned) {
    pinned = sql<{ name: string }>`
      select distinct p.proname as name
        from pg_catalog.pg_proc as p
        join pg_catalog.pg_namespace as n on n.oid = p.pronamespace
       where n.nspname = ${schema}
         and exists (select from unnest(p.proconfig) as c where c like 'search\\_path=%')`
      .execute(tx)
      .then(({ rows }) => new Set(rows.map((row) => row.name)));
    pinnedBySchema.set(schema, pinned);
    pinned.catch(() => pinnedBySchema.delete(schema));
  }
  return pinned;
}

/**
 * Runs `text` on `tx` as one call of the schema-qualified function, when it is one call of a
 * function of `schema` that pins its search path; undefined (nothing sent but the catalog read)
 * when it is not, for the caller to switch the path instead. A call of `postlude` goes as the
 * job's postlude in a group (`groupPostlude`: its last statement, on rows of its own).
 */
export async function runQualifiedCall(tx: Kysely<any>, schema: string, text: string, parameters: readonly unknown[], postlude?: string): Promise<ForeignStatementResult | undefined> {
  const call = oneCall(text);
  if (!call) return undefined;
  if (!(await functionsPinningTheirPath(tx, schema)).has(call.name)) return undefined;
  const qualified = CompiledQuery.raw(`SELECT ${pg.escapeIdentifier(schema)}.${pg.escapeIdentifier(call.name)}${call.rest}`, [...parameters]);
  const result = await tx.executeQuery(call.name === postlude ? groupPostlude(qualified) : qualified);
  return { rows: result.rows as any[], rowCount: Number(result.numAffectedRows ?? result.rows.length) };
}
