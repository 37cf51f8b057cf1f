import { CompiledQuery, type DatabaseConnection, type QueryResult } from 'kysely';
import { inlineParameters } from './inline-parameters.js';
import { everyResultQuery, statementResults, type StatementResult } from './last-result-pool.js';

/**
 * Why a gathered group stopped: a job sent a statement after another job's statement had run
 * since its own previous one. Its statements would no longer run as if the jobs ran one after
 * another (a `SELECT … FOR UPDATE` then an `UPDATE` of two jobs interleaved in one transaction
 * loses an update, as the transaction's row locks do not keep its own jobs apart), so the group
 * rolls back and runs again with its jobs one after another.
 */
export class InterleavedStatements extends Error {
  constructor() {
    super('a job of a gathered group sent a statement after a group-mate\'s; the group runs again, one job after another');
    this.name = 'InterleavedStatements';
  }
}

interface Pending {
  readonly query: CompiledQuery;
  /** The statement as literal SQL, when it can share a string with others. */
  readonly inlined: string | undefined;
  readonly resolve: (result: QueryResult<any>) => void;
  readonly reject: (error: unknown) => void;
}

/**
 * The connection of an optimistic group whose jobs run at once. Each job sends its statements
 * through its own view ({@link GatheringConnection.forJob}); the statements sent in one turn of
 * the event loop go out together as one simple-protocol string, behind the deferred statements
 * (the group's BEGIN), and each job receives its own statement's result. A group of N jobs of
 * one statement each sends them in one round trip instead of N.
 *
 * Gathering is only safe while the result is what running the jobs one after another would
 * have given: so a job may send a statement only if nothing of another job has run since its own
 * previous statement (each statement is atomic, and jobs of one statement each run as if in the
 * order their statements went). A statement that breaks this fails with
 * {@link InterleavedStatements}, and the group with it.
 *
 * Any failure (a string Postgres refused, a job that threw, an interleaving) is the group's:
 * every later statement fails with it at once, and {@link flush} refuses to commit. Strings go
 * out strictly in order, one after another. Without `gather`, each statement goes out as soon
 * as it is sent (jobs then run one after another); without `everyResult` (a Kysely instance not
 * made by `kyselyOverPool`), each goes alone.
 */
export class GatheringConnection {
  readonly #inner: DatabaseConnection;
  readonly #gather: boolean;
  readonly #everyResult: boolean;
  #deferred: string[] = [];
  #pending: Pending[] = [];
  #drainScheduled = false;
  /** Strings sent so far, in order: each starts when the one before has ended. */
  #sending: Promise<void> = Promise.resolve();
  /** The job whose statement was the last sent, and every job that sent any. */
  #lastSender: object | undefined;
  readonly #senders = new WeakSet<object>();
  #failure: { readonly error: unknown } | undefined;

  constructor(inner: DatabaseConnection, options: { gather: boolean; everyResult: boolean }) {
    this.#inner = inner;
    this.#gather = options.gather;
    this.#everyResult = options.everyResult;
  }

  /** What failed the group, if anything did. */
  get failure(): { readonly error: unknown } | undefined {
    return this.#failure;
  }

  /** Holds `statements` (literal SQL) back, to lead the next string. */
  defer(...statements: string[]): void {
    this.#deferred.push(...statements);
  }

  /** Forgets the deferred statements (the transaction is being abandoned before it began). */
  discard(): void {
    this.#deferred = [];
  }

  /** Fails the group with `error` (first failure wins): every later statement fails with it. */
  fail(error: unknown): void {
    this.#failure ??= { error };
  }

  /** One job's view of the connection: what it sends is told apart from its group-mates'. */
  forJob(): DatabaseConnection {
    const sender = {};
    return {
      executeQuery: <R>(query: CompiledQuery) => this.#submit<R>(sender, query),
      streamQuery: <R>(query: CompiledQuery, chunkSize?: number) => this.#stream<R>(sender, query, chunkSize),
    };
  }

  /**
   * Waits for every string sent, then sends the deferred statements and `statements` as one
   * string (the group's end). Refuses, with the group's failure, when the group failed.
   */
  async flush(statements: readonly string[]): Promise<void> {
    this.#drain();
    await this.#sending;
    if (this.#failure) throw this.#failure.error;
    await this.#inner.executeQuery(CompiledQuery.raw([...this.#take(), ...statements].join(';\n')));
  }

  /** Waits for every string sent, then ends the transaction with a ROLLBACK, unless nothing was sent (then nothing began). */
  async rollback(): Promise<void> {
    this.#drain();
    await this.#sending;
    if (this.#deferred.length > 0) this.discard();
    else await this.#inner.executeQuery(CompiledQuery.raw('rollback')).catch(() => {});
  }

  #submit<R>(sender: object, query: CompiledQuery): Promise<QueryResult<R>> {
    try {
      this.#admit(sender);
    } catch (error) {
      return Promise.reject(error);
    }
    return new Promise<QueryResult<R>>((resolve, reject) => {
      // Written as literal SQL only when it may share a string: gathered, or behind the BEGIN.
      // One after another with nothing deferred, it goes as it is, parameters and all.
      const shares = this.#everyResult && (this.#gather || this.#deferred.length > 0);
      const inlined = shares ? inlineParameters(query.sql, query.parameters) : undefined;
      this.#pending.push({ query, inlined, resolve, reject });
      if (!this.#gather) this.#drain();
      else if (!this.#drainScheduled) {
        // The jobs' statements sent in this turn of the event loop go out together.
        this.#drainScheduled = true;
        setImmediate(() => this.#drain());
      }
    });
  }

  async *#stream<R>(sender: object, query: CompiledQuery, chunkSize?: number): AsyncIterableIterator<QueryResult<R>> {
    this.#admit(sender);
    this.#drain();
    // The strings sent after this wait for the stream's end.
    let streamed!: () => void;
    const ended = new Promise<void>((resolve) => (streamed = resolve));
    const before = this.#sending;
    this.#sending = before.then(() => ended);
    await before;
    try {
      if (this.#failure) throw this.#failure.error;
      if (this.#deferred.length > 0) await this.#inner.executeQuery(CompiledQuery.raw(this.#take().join(';\n')));
      yield* this.#inner.streamQuery<R>(query, chunkSize);
    } catch (error) {
      this.fail(error);
      throw error;
    } finally {
      streamed();
    }
  }

  /** Lets `sender` send a statement now, or fails the group (see the class's comment). */
  #admit(sender: object): void {
    if (this.#failure) throw this.#failure.error;
    if (this.#senders.has(sender) && this.#lastSender !== sender) {
      this.fail(new InterleavedStatements());
      throw this.#failure!.error;
    }
    this.#senders.add(sender);
    this.#lastSender = sender;
  }

  /** Sends what is pending, after the strings already on their way. */
  #drain(): void {
    this.#drainScheduled = false;
    const pending = this.#pending;
    if (pending.length === 0) return;
    this.#pending = [];
    this.#sending = this.#sending.then(() => this.#send(pending));
  }

  /** Sends `pending` in order: runs of inlined statements as one string each, the others alone. */
  async #send(pending: readonly Pending[]): Promise<void> {
    for (let start = 0; start < pending.length; ) {
      if (this.#failure) {
        for (const item of pending.slice(start)) item.reject(this.#failure.error);
        return;
      }
      let end = start + 1;
      if (pending[start]!.inlined !== undefined) while (end < pending.length && pending[end]!.inlined !== undefined) end++;
      const run = pending.slice(start, end);
      try {
        const results = run[0]!.inlined === undefined ? [await this.#sendAlone(run[0]!.query)] : await this.#sendString(run);
        run.forEach((item, i) => item.resolve(results[i]!));
      } catch (error) {
        this.fail(error);
        for (const item of run) item.reject(error);
      }
      start = end;
    }
  }

  /** One statement that cannot share a string (binary values, or no multi-result connection). */
  async #sendAlone(query: CompiledQuery): Promise<QueryResult<unknown>> {
    if (this.#deferred.length > 0) await this.#inner.executeQuery(CompiledQuery.raw(this.#take().join(';\n')));
    return this.#inner.executeQuery(query);
  }

  /** Inlined statements behind the deferred ones, as one string; each statement's result. */
  async #sendString(run: readonly Pending[]): Promise<Array<QueryResult<unknown>>> {
    const deferred = this.#take();
    const results = statementResults(await this.#inner.executeQuery(everyResultQuery([...deferred, ...run.map((item) => item.inlined!)])));
    // A caller's text of several statements would shift every result after it: nothing can be
    // told apart then, so the group fails (its careful run sends each statement on its own).
    if (results.length !== deferred.length + run.length) {
      throw new Error(`a gathered string of ${deferred.length + run.length} statements returned ${results.length} results`);
    }
    return results.slice(deferred.length).map(asKyselyResult);
  }

  #take(): string[] {
    const statements = this.#deferred;
    this.#deferred = [];
    return statements;
  }
}

/** A statement's result as Kysely's Postgres connection reports it (`PostgresConnection.executeQuery`). */
function asKyselyResult(result: StatementResult): QueryResult<unknown> {
  const { command, rowCount, rows } = result;
  if (command === 'ROLLBACK' || command === 'COMMIT') return { rows: [{ command }] };
  const affects = command === 'INSERT' || command === 'UPDATE' || command === 'DELETE' || command === 'MERGE';
  return { numAffectedRows: affects ? BigInt(rowCount ?? 0) : undefined, rows: rows ?? [] };
}
