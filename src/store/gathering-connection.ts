import type { CompiledQuery, DatabaseConnection, QueryResult } from 'kysely';
import { TransactionControlError } from '../errors.js';
import { pipelineQuery, replyOf, type PipelineReply } from './pipeline.js';
import { sqlStateOf } from './pg-errors.js';
import { screenStatement, type SavepointCommand } from './statement-screen.js';

/**
 * Why a group stopped, and whose fault it was:
 * - `'job'`: the jobs in `culprits` failed on their own: a statement of theirs failed, they
 *   threw, or they sent a statement that cannot share a transaction. Each runs alone; the others
 *   may share a transaction again.
 * - `'interleaved'`: a gathered job sent a statement after a group-mate's (see
 *   {@link InterleavedStatements}); the jobs run again, one after another.
 * - `'uncertain'`: something failed that no single job caused for certain (a statement of the
 *   group's own, the connection). Every job runs alone.
 */
export type GroupFailure =
  | { readonly kind: 'job'; readonly error: unknown; readonly culprits: ReadonlySet<object> }
  | { readonly kind: 'interleaved'; readonly error: unknown }
  | { readonly kind: 'uncertain'; readonly error: unknown };

/**
 * A job of a gathered group sent a statement after another job's statement had run since its
 * own previous one. Its statements would no longer run as if the jobs ran one after another (a
 * `SELECT … FOR UPDATE` then an `UPDATE` of two jobs interleaved in one transaction loses an
 * update, as the transaction's row locks do not keep its own jobs apart), so the group rolls back
 * and runs again with its jobs one after another.
 */
export class InterleavedStatements extends Error {
  constructor() {
    super("a job of a gathered group sent a statement after a group-mate's; the group runs again, one job after another");
    this.name = 'InterleavedStatements';
  }
}

/**
 * A job of a group sent a statement that leaves state behind for the statements after it (a
 * setting, a temporary table; see `statement-screen.ts`): its group-mates would run under it.
 * It was not sent; the group rolls back, and the job runs alone, in a transaction of its own.
 */
export class StatementLeavesState extends Error {
  constructor(readonly statement: string) {
    super(`a job of a group sent a statement that changes its transaction's state for the statements after it (${statement.slice(0, 80)}); the job runs alone`);
    this.name = 'StatementLeavesState';
  }
}

/**
 * A job of a group left state in the shared transaction, found by the check of the transaction's
 * state that follows each job's statements (a setting changed inside a function, a temporary
 * table, an open cursor, a prepared statement: see `sql/group-settings.ts`), or by its own
 * savepoint commands (a savepoint it left open, or one of a group-mate's it named). Its
 * group-mates would have run under it: the group rolls back, and the job runs alone.
 */
export class StateLeftBehind extends Error {
  constructor(what: string, options?: { cause?: unknown }) {
    super(`a job of a group left ${what} in the shared transaction; the job runs alone`, options);
    this.name = 'StateLeftBehind';
  }
}

/**
 * A statement of a job that was not sent, because its group had already failed (SQLSTATE 25P02,
 * as Postgres would answer in the aborted transaction). The job runs again, in another group or
 * alone; nothing of this run is kept.
 */
export class GroupAbortedError extends Error {
  readonly code = '25P02';

  constructor(cause: unknown) {
    super('the group this job shared a transaction with failed; this run of the job is rolled back and the job runs again', { cause });
    this.name = 'GroupAbortedError';
  }
}

/** Texts of statements marked {@link groupPrelude}. */
const preludeTexts = new Set<string>();

/**
 * Marks `query`'s text as a job's *prelude* in a group: a statement that reads nothing a job
 * writes and writes nothing a job reads (the library's own tables, locks and settings only; the
 * take of concurrency slots, `sql/concurrency-slots-in-transaction.ts`), sent before the job's
 * own statements. It does not count as the job's statement for the order of the group's jobs: a
 * job that sent one and then its own statements, after group-mates' had run, is not
 * interleaved, since what it reads and writes is the same whichever order the prelude went in.
 * A job that sent one may hold locks by the group's transaction (concurrency slots): its group
 * waits for it past `slowJobMs` (see `runGroupTransaction`). Returns `query`.
 */
export function groupPrelude<Q extends CompiledQuery>(query: Q): Q {
  preludeTexts.add(query.sql);
  return query;
}

/** Texts of statements marked {@link groupPostlude}. */
const postludeTexts = new Set<string>();

/**
 * Marks `query`'s text as a job's *postlude* in a group: one of the statements that end what the
 * job sends, which read and write only rows of the job's own outside what jobs' statements touch
 * (BullMQ's move of the job to completed, and the metrics it collects then, on the queue's
 * tables, when the queue is in Postgres: `bullmq/finish-in-effect.ts`). It may go after
 * group-mates' statements without making the job interleaved: moved back to right after the
 * job's own statements, past those of its group-mates, it reads and writes the same. The state
 * the last sender's statements left is checked before it runs (it would run under it); it leaves
 * none to check after it. It counts as the job's statement for leaving the group (a job that sent
 * one has written). Sent while any savepoint is open, it is an ordinary statement, as a prelude
 * is. Returns `query`.
 */
export function groupPostlude<Q extends CompiledQuery>(query: Q): Q {
  postludeTexts.add(query.sql);
  return query;
}

interface Pending {
  readonly member: object;
  readonly query: CompiledQuery;
  /** Cannot go in a pipeline: a parameterless text of several statements. */
  readonly alone: boolean;
  /** The check of the transaction's state after `member`'s statements: its failure is {@link StateLeftBehind}. */
  readonly stateCheck?: true;
  readonly resolve: (result: QueryResult<any>) => void;
  readonly reject: (error: unknown) => void;
}

/**
 * The connection of a group whose jobs share one transaction. Each job sends its statements
 * through its own view ({@link GatheringConnection.forJob}). Gathered (`gather`), the statements
 * the jobs send in one turn of the event loop go out together as one pipeline, behind the
 * deferred statements (the group's BEGIN): a group of N jobs of one statement each sends them in
 * one round trip. Otherwise each statement goes as soon as it is sent (the jobs then run one
 * after another). Every statement keeps its own parameters and gets its own result or error
 * (see `pipeline.ts`), so a failure is always the statement's own.
 *
 * Gathering is only safe while the result is what running the jobs one after another would have
 * given: so a job may send a statement only if nothing of another job has run since its own
 * previous statement (each statement is atomic, and jobs of one statement each run as if in the
 * order their statements went). A statement that breaks this fails with
 * {@link InterleavedStatements}, and the group with it.
 *
 * A job's statement that would end the transaction is refused (`TransactionControlError`); one
 * that leaves state for its group-mates is not sent ({@link StatementLeavesState}). Either fails
 * the group, with that job to blame. What a statement's text cannot show (a function that sets
 * a setting or creates a temporary table) the state check shows (`stateCheck`): it goes after a
 * job's statements, in the round trip of the next job's first statement, and its failure is that
 * job's ({@link StateLeftBehind}); the group's end checks after the last job. Savepoint commands
 * are followed per job: one naming a savepoint the job did not open fails it, and
 * {@link openSavepoints} tells the group whether a job left one open.
 *
 * Any failure is the group's: every later statement fails at once ({@link GroupAbortedError}),
 * and {@link failure} says whose it was. Strings go out strictly in order, one after another.
 */
export class GatheringConnection {
  readonly #inner: DatabaseConnection;
  readonly #gather: boolean;
  readonly #pipelines: boolean;
  #deferred: CompiledQuery[] = [];
  #pending: Pending[] = [];
  #drainScheduled = false;
  /** Round trips sent so far, in order: each starts when the one before has ended. */
  #sending: Promise<void> = Promise.resolve();
  /** The job whose statement was the last sent, and every job that sent any. */
  #lastSender: object | undefined;
  /** Whether the state the last sender's statements left was checked since the last of them. */
  #lastSenderChecked = false;
  readonly #senders = new WeakSet<object>();
  /** Every job that sent a prelude ({@link groupPrelude}), counted as its statement or not. */
  readonly #preludeSenders = new WeakSet<object>();
  readonly #stateCheck: CompiledQuery | undefined;
  /** Each job's savepoints still open, oldest first. */
  readonly #savepoints = new WeakMap<object, string[]>();
  /** How many savepoints are open, all jobs' together. */
  #openSavepointCount = 0;
  #failure: GroupFailure | undefined;

  /**
   * `gather`: jobs run at once and their statements are sent together (needs `pipelines`).
   * `pipelines`: the inner connection answers pipeline queries; without it, each statement goes
   * on its own. `stateCheck`: the statement that fails when the transaction's state differs from
   * the group's start; unset, only statements' texts are screened.
   */
  constructor(inner: DatabaseConnection, options: { gather: boolean; pipelines: boolean; stateCheck?: CompiledQuery }) {
    this.#inner = inner;
    this.#pipelines = options.pipelines;
    this.#gather = options.gather && options.pipelines;
    this.#stateCheck = options.stateCheck;
  }

  /** The job whose statement was the last sent (the state check at the group's end is its). */
  get lastSender(): object | undefined {
    return this.#lastSender;
  }

  /** Whether `member` sent a statement of its own (a prelude is not one: {@link groupPrelude}). */
  sentStatements(member: object): boolean {
    return this.#senders.has(member);
  }

  /** Whether `member` sent a prelude ({@link groupPrelude}): it may hold locks by the group's transaction. */
  sentPrelude(member: object): boolean {
    return this.#preludeSenders.has(member);
  }

  /** How many savepoints `member` opened and left open. */
  openSavepoints(member: object): number {
    return this.#savepoints.get(member)?.length ?? 0;
  }

  /** What failed the group, if anything did. */
  get failure(): GroupFailure | undefined {
    return this.#failure;
  }

  /** Holds `statements` back (the group's BEGIN), to lead the next round trip. */
  defer(...statements: CompiledQuery[]): void {
    this.#deferred.push(...statements);
  }

  /** Forgets the deferred statements (the transaction is being abandoned before it began). */
  discard(): void {
    this.#deferred = [];
  }

  /** Fails the group (the first failure wins): every later statement fails at once. */
  fail(failure: GroupFailure): void {
    this.#failure ??= failure;
  }

  /** `member`'s view of the connection: what it sends is told apart from its group-mates'. */
  forJob(member: object): DatabaseConnection {
    return {
      executeQuery: <R>(query: CompiledQuery) => this.#submit<R>(member, query),
      streamQuery: <R>(query: CompiledQuery, chunkSize?: number) => this.#stream<R>(member, query, chunkSize),
    };
  }

  /**
   * Waits for every round trip sent, then sends the deferred statements and `statements` as one
   * pipeline (the group's end) and returns Postgres's answer, the deferred statements' results
   * left out (their failure is reported at index -1). Refuses, with the group's failure, when
   * the group failed; a failed connection throws.
   */
  async flush(statements: readonly CompiledQuery[]): Promise<PipelineReply> {
    this.#drain();
    await this.#sending;
    if (this.#failure) throw this.#failure.error;
    const deferred = this.#take();
    const reply = await this.#send([...deferred, ...statements]);
    const failure = reply.failure && { index: Math.max(-1, reply.failure.index - deferred.length), error: reply.failure.error };
    return { results: reply.results.slice(deferred.length), ...(failure ? { failure } : {}) };
  }

  /** Waits for every round trip sent, then ends the transaction with a ROLLBACK, unless nothing was sent (then nothing began). */
  async rollback(rollback: CompiledQuery): Promise<void> {
    this.#drain();
    await this.#sending;
    if (this.#deferred.length > 0) this.discard();
    else await this.#inner.executeQuery(rollback).catch(() => {});
  }

  #submit<R>(member: object, query: CompiledQuery): Promise<QueryResult<R>> {
    let alone: boolean;
    try {
      alone = this.#admit(member, query);
    } catch (error) {
      return Promise.reject(error);
    }
    return new Promise<QueryResult<R>>((resolve, reject) => {
      if (preludeTexts.has(query.sql)) this.#preludeSenders.add(member);
      this.#pending.push({ member, query, alone, resolve, reject });
      if (!this.#gather) this.#drain();
      else if (!this.#drainScheduled) {
        // The jobs' statements sent in this turn of the event loop go out together.
        this.#drainScheduled = true;
        setImmediate(() => this.#drain());
      }
    });
  }

  async *#stream<R>(member: object, query: CompiledQuery, chunkSize?: number): AsyncIterableIterator<QueryResult<R>> {
    this.#admit(member, query);
    this.#drain();
    // The round trips sent after this wait for the stream's end.
    let streamed!: () => void;
    const ended = new Promise<void>((resolve) => (streamed = resolve));
    const before = this.#sending;
    this.#sending = before.then(() => ended);
    await before;
    try {
      if (this.#failure) throw new GroupAbortedError(this.#failure.error);
      await this.#sendDeferred();
      yield* this.#inner.streamQuery<R>(query, chunkSize);
    } catch (error) {
      this.#failWith(member, error);
      throw error;
    } finally {
      streamed();
    }
  }

  /**
   * Lets `member` send `query` now, or refuses it and fails the group (see the class's
   * comment). Returns whether the statement must go alone (not in a pipeline).
   */
  #admit(member: object, query: CompiledQuery): boolean {
    if (this.#failure) throw new GroupAbortedError(this.#failure.error);
    const { effect, statements, savepoints } = screenStatement(query.sql);
    if (effect !== 'plain') {
      const error = effect === 'ends-transaction' ? new TransactionControlError(query.sql) : new StatementLeavesState(query.sql);
      this.fail({ kind: 'job', error, culprits: new Set([member]) });
      throw error;
    }
    // A prelude sent before the job's own statements is no statement of the job's for the
    // order of the group's jobs (see groupPrelude); one sent after them is. Nor is a postlude
    // (see groupPostlude), whenever it is sent. Either counts as the job's statement when a
    // savepoint is open: a ROLLBACK TO it would undo it (a prelude's locks, a postlude's move)
    // under the job's feet, and counted as the job's statement it makes that ROLLBACK TO
    // interleaved, which fails the group. Either runs under the state the last sender's
    // statements left, so that state is checked first; the last sender stays the last (a
    // prelude or a postlude leaves no state to check).
    const prelude = !this.#senders.has(member) && preludeTexts.has(query.sql);
    if ((prelude || postludeTexts.has(query.sql)) && this.#openSavepointCount === 0) {
      this.#checkLastSenderBefore(member);
      if (!prelude) this.#senders.add(member);
      return !this.#pipelines;
    }
    if (this.#senders.has(member) && this.#lastSender !== member) {
      const error = new InterleavedStatements();
      this.fail({ kind: 'interleaved', error });
      throw error;
    }
    this.#followSavepoints(member, savepoints);
    this.#checkLastSenderBefore(member);
    this.#senders.add(member);
    this.#lastSender = member;
    this.#lastSenderChecked = false;
    return !this.#pipelines || (query.parameters.length === 0 && statements > 1);
  }

  /**
   * Queues the check of the state the last sender's statements left, to run before `member`'s
   * statement: unless they are `member`'s own, or were checked since the last of them.
   */
  #checkLastSenderBefore(member: object): void {
    const previous = this.#lastSender;
    if (!this.#stateCheck || previous === undefined || previous === member || this.#lastSenderChecked) return;
    this.#pending.push({ member: previous, query: this.#stateCheck, alone: false, stateCheck: true, resolve: () => {}, reject: () => {} });
    this.#lastSenderChecked = true;
  }

  /**
   * Keeps `member`'s open savepoints as its commands open and end them. A command naming a
   * savepoint the job has not open (a group-mate's, or none) is refused: it would roll back or
   * release a group-mate's work, where alone it fails as Postgres fails it.
   */
  #followSavepoints(member: object, commands: readonly SavepointCommand[]): void {
    if (commands.length === 0) return;
    const open = [...(this.#savepoints.get(member) ?? [])];
    for (const command of commands) {
      if (command.op === 'open') {
        open.push(command.name);
        continue;
      }
      const at = open.lastIndexOf(command.name);
      if (at < 0) {
        const error = new StateLeftBehind(`a savepoint command naming "${command.name}", a savepoint it had not opened,`);
        this.fail({ kind: 'job', error, culprits: new Set([member]) });
        throw error;
      }
      open.length = command.op === 'release' ? at : at + 1;
    }
    this.#openSavepointCount += open.length - (this.#savepoints.get(member)?.length ?? 0);
    this.#savepoints.set(member, open);
  }

  /** Sends what is pending, after the round trips already on their way. */
  #drain(): void {
    this.#drainScheduled = false;
    const pending = this.#pending;
    if (pending.length === 0) return;
    this.#pending = [];
    this.#sending = this.#sending.then(() => this.#sendPending(pending));
  }

  /** Sends `pending` in order: runs of statements that can share a pipeline as one each, the others alone. */
  async #sendPending(pending: readonly Pending[]): Promise<void> {
    for (let start = 0; start < pending.length; ) {
      if (this.#failure) {
        const aborted = new GroupAbortedError(this.#failure.error);
        for (const item of pending.slice(start)) item.reject(aborted);
        return;
      }
      let end = start + 1;
      if (!pending[start]!.alone) while (end < pending.length && !pending[end]!.alone) end++;
      await this.#sendRun(pending.slice(start, end));
      start = end;
    }
  }

  /** One round trip: the deferred statements and `run`'s, each item getting its own result or error. */
  async #sendRun(run: readonly Pending[]): Promise<void> {
    try {
      if (run[0]!.alone) {
        await this.#sendDeferred();
        run[0]!.resolve(await this.#inner.executeQuery(run[0]!.query));
        return;
      }
      const deferred = this.#take();
      const reply = await this.#send([...deferred, ...run.map((item) => item.query)]);
      const failedAt = reply.failure ? reply.failure.index - deferred.length : run.length;
      if (failedAt < 0) {
        // A statement of the group's own failed: nobody's for certain.
        this.fail({ kind: 'uncertain', error: reply.failure!.error });
        for (const item of run) item.reject(new GroupAbortedError(reply.failure!.error));
        return;
      }
      run.forEach((item, i) => {
        if (i < failedAt) item.resolve(reply.results[deferred.length + i]!);
        else if (i === failedAt) this.#failWith(item.member, item.stateCheck ? stateLeftBehind(reply.failure!.error) : reply.failure!.error, item);
        else item.reject(new GroupAbortedError(reply.failure!.error));
      });
    } catch (error) {
      // The connection failed (or the statement sent alone did): answer everything in the run.
      this.#failWith(run[0]!.member, error);
      for (const item of run) item.reject(error);
    }
  }

  /** Fails the group for `member`'s statement (its own, when Postgres answered it), rejecting `item` with the error. */
  #failWith(member: object, error: unknown, item?: Pending): void {
    const answered = sqlStateOf(error) !== undefined || error instanceof StateLeftBehind;
    if (answered && !(error instanceof GroupAbortedError)) this.fail({ kind: 'job', error, culprits: new Set([member]) });
    else this.fail({ kind: 'uncertain', error });
    item?.reject(error);
  }

  async #sendDeferred(): Promise<void> {
    const deferred = this.#take();
    if (deferred.length === 0) return;
    const reply = await this.#send(deferred);
    if (reply.failure) {
      this.fail({ kind: 'uncertain', error: reply.failure.error });
      throw new GroupAbortedError(reply.failure.error);
    }
  }

  async #send(statements: readonly CompiledQuery[]): Promise<PipelineReply> {
    if (this.#pipelines) return replyOf(await this.#inner.executeQuery(pipelineQuery(statements)));
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

  #take(): CompiledQuery[] {
    const deferred = this.#deferred;
    this.#deferred = [];
    return deferred;
  }
}

/**
 * The failure of a state check (see `sql/group-settings.ts`) as the job's: whatever Postgres
 * answered, the state the job left made it fail (a role without the right to call it, say).
 */
export function stateLeftBehind(error: unknown): StateLeftBehind {
  const detail = error instanceof Error ? error.message.replace(/^a job of this group left /, '').replace(/ in the shared transaction$/, '') : String(error);
  return new StateLeftBehind(detail, { cause: error });
}
