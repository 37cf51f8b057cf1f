import { CompiledQuery, type DatabaseConnection, type QueryResult } from 'kysely';
import { inlineParameters } from './inline-parameters.js';

/**
 * What a failed string means: the statements to defer again before trying once more, or
 * undefined to let the error through. `sent` are the deferred statements that went out (none
 * when a caller's statement went alone: the error is then that statement's); `withStatement`
 * tells whether a caller's statement was at the end of the string.
 */
export type MergeRecovery = (error: unknown, sent: readonly string[], withStatement: boolean) => Promise<string[] | undefined>;

/**
 * A connection that holds back control statements (BEGIN, SAVEPOINT, a completion) and sends
 * them at the front of the next statement, as one simple-protocol string: one round trip
 * instead of two. To share a string, that statement is written with its parameters inlined
 * ({@link inlineParameters}), and the connection must answer a string of statements with the
 * last one's rows (`returnsLastResult`); when it cannot (`mergeStatements: false`), or a
 * statement carries binary values, the deferred statements go out on their own first.
 *
 * Every failed string goes to the `recover` option (a group transaction's), a statement sent
 * alone included: it decides whose failure it was, and what to send again.
 */
export class MergingConnection implements DatabaseConnection {
  readonly #inner: DatabaseConnection;
  readonly #mergeStatements: boolean;
  readonly #recover: MergeRecovery | undefined;
  #deferred: string[] = [];

  constructor(inner: DatabaseConnection, options: { mergeStatements: boolean; recover?: MergeRecovery }) {
    this.#inner = inner;
    this.#mergeStatements = options.mergeStatements;
    this.#recover = options.recover;
  }

  /** Statements still to send. */
  get deferred(): readonly string[] {
    return this.#deferred;
  }

  /** Holds `statements` (literal SQL) back until the next statement or {@link flush}. */
  defer(...statements: string[]): void {
    this.#deferred.push(...statements);
  }

  /** Forgets the deferred statements (the transaction is being abandoned). */
  discard(): void {
    this.#deferred = [];
  }

  /** Sends the deferred statements and `next` now, as one string. */
  async flush(next: readonly string[] = []): Promise<void> {
    const statements = [...this.#take(), ...next];
    if (statements.length === 0) return;
    try {
      await this.#inner.executeQuery(CompiledQuery.raw(statements.join(';\n')));
    } catch (error) {
      const again = await this.#recover?.(error, statements, false);
      if (!again) throw error;
      this.#deferred = again;
      await this.flush();
    }
  }

  /**
   * Runs `query`, with the deferred statements in front when they can share its string. Every
   * failure goes to the recovery, a statement's own too: it is the one to tell whose it was.
   */
  async executeQuery<R>(query: CompiledQuery): Promise<QueryResult<R>> {
    const inlined = this.#deferred.length > 0 && this.#mergeStatements ? inlineParameters(query.sql, query.parameters) : undefined;
    if (inlined === undefined && this.#deferred.length > 0) await this.flush();
    const statements = this.#take();
    try {
      return await this.#inner.executeQuery<R>(inlined === undefined ? query : CompiledQuery.raw([...statements, inlined].join(';\n')));
    } catch (error) {
      const again = await this.#recover?.(error, statements, true);
      if (!again) throw error;
      this.#deferred = again;
      return this.executeQuery<R>(query);
    }
  }

  async *streamQuery<R>(query: CompiledQuery, chunkSize?: number): AsyncIterableIterator<QueryResult<R>> {
    await this.flush();
    yield* this.#inner.streamQuery<R>(query, chunkSize);
  }

  #take(): string[] {
    const statements = this.#deferred;
    this.#deferred = [];
    return statements;
  }
}
