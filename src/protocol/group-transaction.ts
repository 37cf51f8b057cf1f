import type { CompiledQuery, ConnectionProvider, DatabaseConnection, Kysely, Transaction } from 'kysely';
import { GatheringConnection, GroupAbortedError, InterleavedStatements, StateLeftBehind, stateLeftBehind } from '../store/gathering-connection.js';
import type { GroupStatements } from '../store/key-store.js';
import { transactionOn } from '../store/one-trip-commit.js';
import { transientStoreFault } from '../store/pg-errors.js';
import { BEGIN_READ_COMMITTED, COMMIT, ROLLBACK, commitApplied } from '../store/transaction-control.js';
import type { CompletedKeyRow } from '../store/records.js';

/** A job's part of a group: its work on the shared transaction, and what it leaves for the group's end. */
export interface GroupMember<T> {
  /** The key it writes: two jobs of one key never share a group. */
  readonly identity: string;
  readonly run: (tx: Transaction<any>) => Promise<GroupMemberEnd<T>>;
}

/**
 * What a job's run throws to leave its group as if it had never joined: its group goes on and
 * commits without it, and its caller gets this error at once (`onLeft`). Only a job that
 * sent no statement of its own (a prelude at most: `groupPrelude`, which reads and writes only
 * the library's own tables, locks and settings) leaves so; one that did fails its group as any
 * other error does. The take of concurrency slots refused (`TransactionSlotsNotTaken`) is one.
 */
export class LeavesGroup extends Error {}

/** What a job leaves for its group's end. */
export interface GroupMemberEnd<T> {
  readonly value: T;
  /**
   * A statement run at the group's end, before the COMMIT (a fenced completion). It must fail,
   * not quietly do nothing, when it cannot do its part: the job then runs alone.
   */
  readonly closing?: CompiledQuery;
  /** A key the group inserts at its end, as `completed` with its result (the fast path's). */
  readonly newKey?: CompletedKeyRow;
}

/**
 * How a group's transaction ended. Only `committed` settles its jobs; every other verdict means
 * nothing of the group was kept, and says how its jobs go on:
 * - `interleaved`: a gathered job sent a statement after a group-mate's; all run again, one after another;
 * - `culprits`: these jobs failed on their own (a statement of theirs failed, they threw, their
 *   closing statement failed, their key had a row, they sent a statement that cannot share a
 *   transaction); they run alone, the others share a transaction again;
 * - `uncertain`: something failed that no single job caused for certain (the COMMIT itself, a
 *   setting changed inside a function, a statement of the group's own, a connection that failed
 *   before the COMMIT went out); every job runs alone;
 * - `unknown`: the connection failed at the end: the COMMIT may or may not have been applied.
 *
 * `abandoned`: the jobs whose callback outran `slowJobMs`, each with its run, which the group
 * stopped waiting for: each runs alone once that run has ended, whatever the verdict.
 */
export type GroupVerdict<M> =
  | { readonly kind: 'committed'; readonly values: ReadonlyMap<M, unknown> }
  | ((
      | { readonly kind: 'interleaved' }
      | { readonly kind: 'culprits'; readonly culprits: ReadonlySet<M>; readonly errors: ReadonlyMap<M, unknown> }
      | { readonly kind: 'uncertain'; readonly error: unknown }
      | { readonly kind: 'unknown'; readonly error: unknown }
    ) & { readonly abandoned?: ReadonlyMap<M, Promise<void>> });

/**
 * What the check of the shared transaction's state after each job compares; the group's end
 * compares everything, whatever this is:
 * - `'nothing'`: no check after each job. Nothing stored in the database can leave state where
 *   the statement screen does not see it (`codeCanLeaveState`), so a job could leave state only
 *   by a statement the screen refuses; the group's end still compares everything, and what it
 *   finds no single job is blamed for (every job runs alone).
 * - `'all-but-prepared-statements'`: settings, temporary objects and cursors after each job; the
 *   session's prepared statements once, at the group's end (reading them costs as much as the
 *   rest together).
 * - `'everything'`: all of it after each job: once a group's end found state a job left that the
 *   checks after each job did not compare, so that the next such job is found on its own.
 */
export type EachJobCheck = 'nothing' | 'all-but-prepared-statements' | 'everything';

/** How a group runs its jobs. */
export interface GroupTransactionOptions {
  /** The store's statements for the group's end. */
  readonly statements: GroupStatements;
  /**
   * Run the jobs of each batch at once, their statements gathered into one pipeline per turn
   * (see {@link GatheringConnection}); false: one after another.
   */
  readonly gather: boolean;
  /** The connection answers pipeline queries (`pipelines(db)`); without it, each statement goes alone. */
  readonly pipelines: boolean;
  /** The settings to watch ({@link GroupStatements.state}); undefined: the state is not checked. */
  readonly watchedSettings: readonly string[] | undefined;
  /** What the state check after each job compares ({@link EachJobCheck}). */
  readonly checkEachJob: EachJobCheck;
  /** How long the insert of the group's new keys may wait on a key another transaction holds. */
  readonly lockTimeoutMs: number;
  /** Longest a job's callback may hold the group (`GroupCommitOptions.slowJobMs`). */
  readonly slowJobMs: number;
  /** Told at once of a job that left the group ({@link LeavesGroup}): it is no member of it from then on. */
  readonly onLeft: (member: GroupMember<unknown>, error: LeavesGroup) => void;
  /**
   * Told of a job past `slowJobMs` that sent a prelude (`groupPrelude`: it may hold concurrency
   * slots by the group's transaction): the group waits for it rather than stop waiting, since
   * its slots must last as long as its run.
   */
  readonly onSlowHoldingLocks: (member: GroupMember<unknown>) => void;
}

/**
 * A job's callback held its group open longer than `slowJobMs`: the group rolled back without
 * waiting for it, and the job runs alone once this run has ended.
 */
export class HeldGroupTooLong extends Error {
  constructor(readonly slowJobMs: number) {
    super(`a job's callback held its group's transaction open for more than ${slowJobMs} ms; the group goes on without it, and it runs alone`);
    this.name = 'HeldGroupTooLong';
  }
}

/**
 * Runs one group's transaction: BEGIN (riding with the first statements, with the keeping of the
 * transaction's state); the jobs, in batches taken from `take` while it offers more, the state
 * checked after each job's statements (in the round trip of the next job's first statement);
 * then one pipeline of the state check after the last job, every job's closing statement, one
 * insert of every new key, and the COMMIT. No savepoints of the group's own: a group commits
 * whole or not at all.
 *
 * Gathered (`gather`), the jobs of a batch run at once, and the statements they send in one turn
 * go out as one pipeline: a batch of jobs of one statement each costs one round trip. A job that
 * sends a statement after a group-mate's has run since its own previous one stops the group
 * (`interleaved`).
 *
 * Every failure stops the group and rolls it back; the verdict says whose it was, from what
 * Postgres answered for each statement (see `store/pipeline.ts`), never from a guess. No job's
 * outcome is decided in a group that did not commit: a job that failed here runs again alone,
 * where its failure (if it fails again) is its own.
 *
 * Nothing is taken when no connection could be had: that error is thrown.
 */
export async function runGroupTransaction<M extends GroupMember<unknown>>(
  db: Kysely<any>,
  take: () => readonly M[],
  options: GroupTransactionOptions,
): Promise<GroupVerdict<M>> {
  const { statements } = options;
  const watched = statements.state && options.watchedSettings;
  const eachJob = options.checkEachJob;
  const stateCheck = watched && eachJob !== 'nothing' ? statements.state!.check(watched, { preparedStatements: eachJob === 'everything' }) : undefined;
  // At the group's end, what the checks after each job did not compare: any job may have left it.
  const groupCheck = !watched
    ? undefined
    : eachJob === 'nothing'
      ? statements.state!.check(watched, { preparedStatements: true })
      : eachJob === 'all-but-prepared-statements'
        ? statements.state!.checkPreparedStatements(watched)
        : undefined;
  return db.getExecutor().provideConnection(async (inner): Promise<GroupVerdict<M>> => {
    const connection = new GatheringConnection(inner, { gather: options.gather, pipelines: options.pipelines, ...(stateCheck ? { stateCheck } : {}) });
    const ends = new Map<M, GroupMemberEnd<unknown>>();
    // Jobs that threw an error of their own (not one the group's failure caused).
    const threw = new Map<M, unknown>();
    // Jobs whose callback outran slowJobMs, with their runs: the group did not wait for them.
    const abandoned = new Map<M, Promise<void>>();
    const stop = async (verdict: GroupVerdict<M>): Promise<GroupVerdict<M>> => {
      await connection.rollback(ROLLBACK);
      return abandoned.size > 0 && verdict.kind !== 'committed' ? { ...verdict, abandoned } : verdict;
    };
    connection.defer(BEGIN_READ_COMMITTED, ...(watched ? [statements.state!.keep(watched)] : []));
    for (let batch = take(); batch.length > 0; batch = take()) {
      const run = (member: M) => {
        const ran = member.run(transactionOn(db, sharedProvider(connection.forJob(member)))).then(
          (end) => {
            if (abandoned.has(member)) return;
            const open = connection.openSavepoints(member);
            if (open > 0) {
              // Its group-mates would run inside its savepoint: it runs alone.
              const error = new StateLeftBehind(`${open} savepoint${open === 1 ? '' : 's'} open`);
              threw.set(member, error);
              connection.fail({ kind: 'job', error, culprits: new Set([member]) });
              return;
            }
            ends.set(member, end);
          },
          (error: unknown) => {
            if (abandoned.has(member)) return;
            if (error instanceof LeavesGroup && !connection.sentStatements(member) && connection.openSavepoints(member) === 0) {
              options.onLeft(member, error);
              return;
            }
            if (!(error instanceof GroupAbortedError) && !(error instanceof InterleavedStatements)) threw.set(member, error);
            // The group is lost: its other jobs' statements go no further.
            connection.fail({ kind: 'job', error, culprits: new Set([member]) });
          },
        );
        return endedWithin(ran, options.slowJobMs, () => {
          if (connection.sentPrelude(member)) {
            // Its concurrency slots may be this transaction's locks, which must last its run:
            // the group waits for it (the rollback would free them under it).
            options.onSlowHoldingLocks(member);
            return false;
          }
          abandoned.set(member, ran);
          // Its statements, and its group-mates', go no further; the group rolls back.
          connection.fail({ kind: 'job', error: new HeldGroupTooLong(options.slowJobMs), culprits: new Set([member]) });
          return true;
        });
      };
      if (options.gather) await Promise.all(batch.map(run));
      else await oneAfterAnother(batch, run, () => connection.failure !== undefined);
      const failure = connection.failure;
      if (failure?.kind === 'interleaved') return stop({ kind: 'interleaved' });
      if (failure?.kind === 'uncertain') return stop({ kind: 'uncertain', error: failure.error });
      if (failure) {
        const errors = new Map<M, unknown>(threw);
        for (const culprit of failure.culprits) if (!errors.has(culprit as M)) errors.set(culprit as M, failure.error);
        for (const slow of abandoned.keys()) errors.delete(slow); // they run alone after their run ends
        return stop({ kind: 'culprits', culprits: new Set(errors.keys()), errors });
      }
    }
    if (ends.size === 0) {
      // Another group took the jobs first (BEGIN never went out), or every job left the group.
      await connection.rollback(ROLLBACK);
      return { kind: 'committed', values: new Map() };
    }
    return endGroup(connection, [...ends], { ...options, stateCheck, groupCheck }, stop);
  });
}

/**
 * The group's end: the state check after the last job, the check of what those after each job
 * did not compare, every closing statement, the new keys and the COMMIT in one pipeline; the
 * verdict from Postgres's answer.
 */
async function endGroup<M>(
  connection: GatheringConnection,
  ends: ReadonlyArray<readonly [M, GroupMemberEnd<unknown>]>,
  options: GroupTransactionOptions & { readonly stateCheck: CompiledQuery | undefined; readonly groupCheck: CompiledQuery | undefined },
  stop: (verdict: GroupVerdict<M>) => Promise<GroupVerdict<M>>,
): Promise<GroupVerdict<M>> {
  const { statements, stateCheck, groupCheck } = options;
  const sent: CompiledQuery[] = [];
  // What failing at each position of the pipeline means.
  const blame: Array<(error: unknown) => GroupVerdict<M>> = [];
  const culprit = (member: M) => (error: unknown): GroupVerdict<M> => ({ kind: 'culprits', culprits: new Set([member]), errors: new Map([[member, error]]) });
  const uncertain = (error: unknown): GroupVerdict<M> => ({ kind: 'uncertain', error });
  const last = connection.lastSender as M | undefined;
  if (stateCheck && last !== undefined) {
    sent.push(stateCheck);
    blame.push((error) => culprit(last)(stateLeftBehind(error)));
  }
  if (groupCheck && last !== undefined) {
    // Any job of the group may have left it: every job runs alone (see GroupCommitter). A store
    // fault here is no job's doing.
    sent.push(groupCheck);
    blame.push((error) => uncertain(transientStoreFault(error) ? error : stateLeftBehind(error)));
  }
  for (const [member, end] of ends) {
    if (!end.closing) continue;
    sent.push(end.closing);
    blame.push(culprit(member));
  }
  const newKeys = ends.filter(([, end]) => end.newKey !== undefined);
  if (newKeys.length > 0) {
    const owners = new Map(newKeys.map(([member, end]) => [end.newKey!, member]));
    const insert = statements.completedKeys!.insert([...owners.keys()], options.lockTimeoutMs);
    sent.push(insert.statement);
    blame.push((error) => {
      const rows = statements.completedKeys!.keysWithRows(error, insert.rows);
      if (!rows) return uncertain(error);
      const members = rows.map((row) => owners.get(row)!);
      return { kind: 'culprits', culprits: new Set(members), errors: new Map(members.map((member) => [member, error])) };
    });
  }
  sent.push(COMMIT);
  // A COMMIT refused (a deferred constraint, a serialization failure) is nobody's for certain;
  // one cut off by the connection may have been applied.
  blame.push((error) => (transientStoreFault(error) === 'connection' ? { kind: 'unknown', error } : uncertain(error)));
  let reply;
  try {
    reply = await connection.flush(sent);
    } catch (error) {
    // The connection failed: the COMMIT may have been applied.
    await connection.rollback(ROLLBACK);
    return { kind: 'unknown', error };
  }
  if (reply.failure) {
    const verdict = reply.failure.index < 0 ? uncertain(reply.failure.error) : blame[reply.failure.index]!(reply.failure.error);
    return verdict.kind === 'unknown' ? verdict : stop(verdict);
  }
  if (!commitApplied(reply.results[sent.length - 1])) return stop(uncertain(new Error('the group\'s COMMIT was answered with ROLLBACK')));
  return { kind: 'committed', values: new Map(ends.map(([member, end]) => [member, end.value])) };
}

/**
 * Resolves when `ran` has settled, or after `limitMs` if `onSlow` (called then) says to stop
 * waiting: the group waits for a job's callback no longer than that, unless it must.
 */
function endedWithin(ran: Promise<void>, limitMs: number, onSlow: () => boolean): Promise<void> {
  return new Promise<void>((resolve) => {
    const timer = setTimeout(() => {
      if (onSlow()) resolve();
    }, limitMs);
    void ran.then(() => {
      clearTimeout(timer);
      resolve();
    });
  });
}

/** Runs each job once the one before has ended, up to the first that fails the group. */
async function oneAfterAnother<J>(jobs: readonly J[], run: (job: J) => Promise<void>, failed: () => boolean): Promise<void> {
  for (const job of jobs) {
    await run(job);
    if (failed()) return;
  }
}

/** Hands its connection to every caller at once (the gathering connection keeps them in order). */
function sharedProvider(connection: DatabaseConnection): ConnectionProvider {
  return { provideConnection: (consume) => consume(connection) };
}
