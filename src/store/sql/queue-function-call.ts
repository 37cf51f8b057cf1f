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
 * process and schema. Only an answer that names some is kept: one read before BullMQ made its
 * functions (a worker that started first) is read again next time.
 */
const pinnedBySchema = new Map<string, ReadonlySet<string>>();

async function functionsPinningTheirPath(tx: Kysely<any>, schema: string, asPostlude: boolean): Promise<ReadonlySet<string>> {
  const known = pinnedBySchema.get(schema);
  if (known) return known;
  const read = sql<{ name: string }>`
      select distinct p.proname as name
        from pg_catalog.pg_proc as p
        join pg_catalog.pg_namespace as n on n.oid = p.pronamespace
       where n.nspname = ${schema}
         and exists (select from unnest(p.proconfig) as c where c like 'search\\_path=%')`.compile(tx);
  const { rows } = await tx.executeQuery(asPostlude ? groupPostlude(read) : read);
  const pinned = new Set(rows.map((row) => row.name));
  if (pinned.size > 0) pinnedBySchema.set(schema, pinned);
  return pinned;
}

/**
 * Runs `text` on `tx` as one call of the schema-qualified function, when it is one call of a
 * function of `schema` that pins its search path; undefined (nothing sent but the catalog read)
 * when it is not, for the caller to switch the path instead. A call of one of `postludes` goes
 * as the job's postlude in a group (`groupPostlude`), and so does the catalog read before it (it
 * reads only the catalog; an ordinary statement between the job's own and its postlude would
 * make the job interleaved, the first time a process reads it).
 */
export async function runQualifiedCall(tx: Kysely<any>, schema: string, text: string, parameters: readonly unknown[], postludes?: ReadonlySet<string>): Promise<ForeignStatementResult | undefined> {
  const call = oneCall(text);
  if (!call) return undefined;
  const postlude = postludes?.has(call.name) === true;
  if (!(await functionsPinningTheirPath(tx, schema, postlude)).has(call.name)) return undefined;
  const qualified = CompiledQuery.raw(`SELECT ${pg.escapeIdentifier(schema)}.${pg.escapeIdentifier(call.name)}${call.rest}`, [...parameters]);
  const result = await tx.executeQuery(postlude ? groupPostlude(qualified) : qualified);
  return { rows: result.rows as any[], rowCount: Number(result.numAffectedRows ?? result.rows.length) };
}
