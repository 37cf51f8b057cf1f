/**
 * The store's hot statements (the claim, the fenced completion, BEGIN and COMMIT of an effect's
 * transaction) as named prepared statements: each connection parses and plans each of them once
 * and afterwards sends only its name and parameters (Bind/Execute), where an unnamed statement
 * is parsed, analysed and planned again on every job. A PL/pgSQL function keeps its own
 * statements' plans per session already; this saves the outer `select … from claim_key(…)` its
 * parse and plan too.
 *
 * Which statements: those the store passes through {@link prepared}; their text (schema
 * included) names them, `ij_` + 32 hex digits of its SHA-256, so the same text has the same name
 * on every connection and in every process. Whether a connection uses names at all is the
 * pool's choice (`createPostgresDb`'s `preparedStatements`): off behind a pooler in transaction
 * mode that cannot keep prepared statements (PgBouncer before 1.21, or without
 * `max_prepared_statements`), where the statements go unnamed as before.
 *
 * What a connection has prepared is tracked here, per node-postgres connection, from Postgres's
 * answers (see `pipeline-protocol.ts`): a name counts as prepared only once a statement sent
 * with its Parse completed; a Parse whose statement failed may or may not have created it, so
 * its next Parse goes after a Close of the name (closing a name that does not exist is no error).
 */
import { createHash } from 'node:crypto';
import type { CompiledQuery, Kysely, QueryResult, RawBuilder } from 'kysely';

/** Statement text → its name, for every text the store has marked {@link prepared}. */
const names = new Map<string, string>();

/** Marks `query`'s text as one the store sends as a named prepared statement where the pool allows; returns `query`. */
export function prepared<Q extends CompiledQuery>(query: Q): Q {
  if (!names.has(query.sql)) names.set(query.sql, `ij_${createHash('sha256').update(query.sql).digest('hex').slice(0, 32)}`);
  return query;
}

/** Runs `query` on `db` as a statement marked {@link prepared}: for statements built with Kysely's `sql` whose text does not vary between calls (only their parameters do). */
export function executePrepared<R>(db: Kysely<any>, query: RawBuilder<R>): Promise<QueryResult<R>> {
  return db.executeQuery(prepared(query.compile(db)));
}

/** The name of a text marked {@link prepared}, or undefined: the statement goes unnamed. */
export function preparedNameOf(text: string): string | undefined {
  return names.get(text);
}

/** What one connection has prepared: names certainly there, and names whose Parse may or may not have taken. */
export interface PreparedOnConnection {
  readonly parsed: Set<string>;
  readonly uncertain: Set<string>;
}

const byConnection = new WeakMap<object, PreparedOnConnection>();

/** The prepared names of a node-postgres connection (its `connection` object), from its first statement on. */
export function preparedOn(connection: object): PreparedOnConnection {
  let state = byConnection.get(connection);
  if (!state) {
    state = { parsed: new Set(), uncertain: new Set() };
    byConnection.set(connection, state);
  }
  return state;
}
