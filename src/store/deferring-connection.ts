import type { CompiledQuery, DatabaseConnection, QueryResult } from 'kysely';
import { asPipelineResult, pipelineQuery, replyOf, statementsOfPipeline, type PipelineReply } from './pipeline.js';
import { sqlStateOf } from './pg-errors.js';
import { screenStatement } from './statement-screen.js';

/** Options of {@link DeferringConnection}. */
export interface DeferringConnectionOptions {
  /** The inner connection answers pipeline queries (a connection of `kyselyOverPool`). */
  readonly pipelines: boolean;
  /**
   * Looks at each statement of the caller's own (not a pipeline the store asked for) before it
   * is sent; may throw to refuse it.
   */
  readonly screen?: (query: CompiledQuery) => void;
  /**
   * Told what every round trip sent and what Postgres answered; `reply` undefined when the
   * connection failed, leaving unknown what ran.
   */
  readonly onReply?: (sent: readonly CompiledQuery[], reply: PipelineReply | undefined) => void;
}

/**
 * A connection that holds statements back (BEGIN, a held step record) and sends them in front of
 * the next statement, in one pipeline: one round trip instead of two, and each statement's fate
 * known exactly (see `pipeline.ts`). A query that is itself a pipeline (`pipelineQuery`: the
 * store's COMMIT with its completion, say) goes in the same pipeline behind them.
 *
 * When a held-back statement fails, the caller's statements did not run: the caller gets that
 * statement's error. Over a connection that cannot pipeline, held-back statements go first, one
 * by one, each a round trip. A parameterless text of several statements cannot go in a
 * pipeline (the extended protocol takes one statement at a time): what is held back goes first,
 * then the text alone, as it always would.
 */
export class DeferringConnection implements DatabaseConnection {
  readonly #inner: DatabaseConnection;
  readonly #options: DeferringConnectionOptions;
  #deferred: CompiledQuery[] = [];

  constructor(inner: DatabaseConnection, options: DeferringConnectionOptions) {
    this.#inner = inner;
    this.#options = options;
  }

  /** Statements held back, not sent yet. */
  get deferred(): readonly CompiledQuery[] {
    return this.#deferred;
  }

  /** Holds `statements` back until the next statement. */
  defer(...statements: CompiledQuery[]): void {
    this.#deferred.push(...statements);
  }

  /** Forgets the held-back statements (the transaction is abandoned before it began). */
  discard(): void {
    this.#deferred = [];
  }

  async executeQuery<R>(query: CompiledQuery): Promise<QueryResult<R>> {
    const asked = statementsOfPipeline(query);
    if (!asked) this.#options.screen?.(query);
    const alone = !asked && (!this.#options.pipelines || (query.parameters.length === 0 && screenStatement(query.sql).statements > 1));
    if (alone) {
      if (this.#deferred.length > 0) this.#throwFailure(await this.#send(this.#take()));
      return this.#inner.executeQuery<R>(query);
    }
    const ahead = this.#deferred.length;
    const statements = [...this.#take(), ...(asked ?? [query])];
    const reply = await this.#send(statements);
    if (reply.failure && reply.failure.index < ahead) throw reply.failure.error;
    if (asked) {
      const failure = reply.failure && { index: reply.failure.index - ahead, error: reply.failure.error };
      return asPipelineResult({ results: reply.results.slice(ahead), ...(failure ? { failure } : {}) }) as QueryResult<R>;
    }
    this.#throwFailure(reply);
    return reply.results[ahead] as QueryResult<R>;
  }

  async *streamQuery<R>(query: CompiledQuery, chunkSize?: number): AsyncIterableIterator<QueryResult<R>> {
    this.#options.screen?.(query);
    if (this.#deferred.length > 0) this.#throwFailure(await this.#send(this.#take()));
    yield* this.#inner.streamQuery<R>(query, chunkSize);
  }

  /** Sends `statements` in one pipeline (or one by one, when the connection cannot pipeline). */
  async #send(statements: readonly CompiledQuery[]): Promise<PipelineReply> {
    let reply: PipelineReply | undefined;
    try {
      reply = this.#options.pipelines ? replyOf(await this.#inner.executeQuery(pipelineQuery(statements))) : await this.#oneByOne(statements);
      return reply;
    } finally {
      this.#options.onReply?.(statements, reply);
    }
  }

  async #oneByOne(statements: readonly CompiledQuery[]): Promise<PipelineReply> {
    const results: Array<QueryResult<unknown>> = [];
    for (const [index, statement] of statements.entries()) {
      try {
        results.push(await this.#inner.executeQuery(statement));
      } catch (error) {
        if (sqlStateOf(error) === undefined) throw error;
        return { results, failure: { index, error } };
      }
    }
    return { results };
  }

  #throwFailure(reply: PipelineReply): void {
    if (reply.failure) throw reply.failure.error;
  }

  #take(): CompiledQuery[] {
    const statements = this.#deferred;
    this.#deferred = [];
    return statements;
  }
}
