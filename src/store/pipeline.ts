/**
 * Several statements in one round trip, each with its own parameters, and exactly what became of
 * each: the extended query protocol, pipelined (Parse/Bind/Describe/Execute per statement, one
 * Sync at the end), through node-postgres's protocol layer.
 *
 * Why not a simple-protocol string of several statements: Postgres parses such a string whole
 * before it runs any of it, so one statement's syntax error means nothing ran, while its results
 * cannot say which statement failed; and its values must be written into the text as literals,
 * which type differently from parameters and cannot carry every value. In a pipeline each
 * statement is parsed when its turn comes: the statements before a failed one ran (their
 * results arrived), the failed one reports its own error, and the server skips every message
 * after it up to the Sync, so none of the rest ran. Parameters stay parameters.
 *
 * Between Syncs the statements form one implicit transaction when no BEGIN opened one: one that
 * fails undoes those before it too. Inside a transaction the failure aborts the transaction.
 */
import { CompiledQuery, type Kysely, type QueryResult } from 'kysely';
import { sqlStateOf } from './pg-errors.js';

/** What a pipeline did: a result per statement that ran, in order, and the one that failed, if any. */
export interface PipelineReply {
  /** One result per statement that ran, in Kysely's shape; a failed statement and those after it have none. */
  readonly results: ReadonlyArray<QueryResult<unknown>>;
  /**
   * The statement that failed (its index, always one of those sent) and its error, as Postgres
   * reported it. Every statement before it ran; none after it did. A session that ended (a
   * terminated backend) is no statement's failure: the pipeline rejects instead.
   */
  readonly failure?: { readonly index: number; readonly error: unknown };
}

/**
 * The text of a query that asks a connection for a pipeline: a comment, which Postgres would
 * ignore, that the connections of `kyselyOverPool` (and the store's own connection wrappers)
 * recognise. The statements travel as its one parameter; the reply comes back as its one row.
 */
const PIPELINE_QUERY = '/* idempotent-jobs: pipeline */';

/**
 * Kysely instances (and the store's transaction objects over them) whose connections answer a
 * {@link pipelineQuery}: those of `kyselyOverPool`, so of `createPostgresDb`.
 */
const pipelining = new WeakSet<Kysely<any>>();

/** Records that `db`'s connections answer pipeline queries; returns `db`. */
export function markPipelining<D extends Kysely<any>>(db: D): D {
  pipelining.add(db);
  return db;
}

/**
 * True when `db`'s connections send a {@link pipelineQuery} as one pipeline (an instance made by
 * `createPostgresDb`). Over any other Kysely instance, {@link sendStatements} sends statements
 * one after another, a round trip each.
 */
export function pipelines(db: Kysely<any>): boolean {
  return pipelining.has(db);
}

/**
 * Sends `statements` on `db` (a Kysely instance, or a transaction of the store's): as one
 * pipeline when its connections can, else one after another, stopping at the first that fails.
 * Either way the reply says exactly which ran; only a failed connection throws.
 */
export async function sendStatements(db: Kysely<any>, statements: readonly CompiledQuery[]): Promise<PipelineReply> {
  if (pipelines(db)) return replyOf(await db.executeQuery(pipelineQuery(statements)));
  const results: Array<QueryResult<unknown>> = [];
  for (const [index, statement] of statements.entries()) {
    try {
      results.push(await db.executeQuery(statement));
    } catch (error) {
      if (sqlStateOf(error) === undefined) throw error;
      return { results, failure: { index, error } };
    }
  }
  return { results };
}

/** A query asking for `statements` to be sent as one pipeline; its one row is the {@link PipelineReply}. */
export function pipelineQuery(statements: readonly CompiledQuery[]): CompiledQuery {
  return CompiledQuery.raw(PIPELINE_QUERY, [statements]);
}

/** The statements of a {@link pipelineQuery}, or undefined for any other query. */
export function statementsOfPipeline(query: { readonly sql: string; readonly parameters: readonly unknown[] }): readonly CompiledQuery[] | undefined {
  return query.sql === PIPELINE_QUERY ? (query.parameters[0] as readonly CompiledQuery[]) : undefined;
}

/** The reply of a {@link pipelineQuery}, from the result the connection answered it with. */
export function replyOf(result: QueryResult<unknown>): PipelineReply {
  return result.rows[0] as PipelineReply;
}

/** `reply` as the result of a {@link pipelineQuery}, in the shape a Kysely connection returns. */
export function asPipelineResult(reply: PipelineReply): QueryResult<unknown> {
  return { rows: [reply] };
}

