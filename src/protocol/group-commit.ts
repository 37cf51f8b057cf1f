import type { Kysely, Transaction } from 'kysely';
import { returnsLastResult } from '../store/last-result-pool.js';
import { GroupTransaction } from '../store/group-transaction.js';
import { onOneConnection } from '../store/one-trip-commit.js';
import { runOptimisticGroup, type InsertCompletedKeys, type OptimisticJob } from './optimistic-group.js';

/**
 * Subtransaction ids Postgres caches per transaction (`PGPROC_MAX_CACHED_SUBXIDS`); past them,
 * every other session's snapshots must look up `pg_subtrans`, which slows the whole database.
 */
const CACHED_SUBTRANSACTIONS = 64;

/** Options of group commit ({@link IdempotencyOptions.groupCommit}). */
export interface GroupCommitOptions {
  /** Most jobs in one transaction. Keep it under 64: Postgres caches 64 subtransactions per transaction. @defaultValue `32` */
  readonly maxJobs?: number;
  /** Groups open at once, each on its own connection. @defaultValue `2` */
  readonly maxGroups?: number;
  /**
   * Run groups optimistically first: no savepoint per job, every key written at the group's
   * end with the COMMIT; a failure rolls the whole group back and its jobs run again in careful
   * groups (a savepoint per job). False: every group is careful. @defaultValue `true`
   */
  readonly optimistic?: boolean;
}

/**
 * The defaults of {@link GroupCommitOptions}, used by the options and the environment alike.
 * Two groups: in the benchmarks, four cost more CPU per job (more, smaller commits) for no gain.
 * Up to 32 jobs each, so that two groups can hold what 64 jobs in flight bring: a gathered
 * group's jobs share their round trips, so a larger group costs little more time.
 */
export const GROUP_COMMIT_DEFAULTS: Required<GroupCommitOptions> = { maxJobs: 32, maxGroups: 2, optimistic: true };

/** How a job's part of a group ends: its value, and the statement that closes it. */
export interface GroupJobEnd<T> {
  readonly value: T;
  /**
   * `'rollback'`: nothing of this job is kept (its claim found the key held or settled).
   * A string: literal SQL run after the job, before its savepoint is released (its completion).
   * Undefined: nothing more to run.
   */
  readonly closing?: string | 'rollback';
  /** What the job fails with when `closing` fails (a lost lease, say). @defaultValue the SQL error */
  readonly closingError?: (error: unknown) => unknown;
}

/**
 * A job's part of a group: runs on the group's transaction, inside the job's own savepoint.
 * `stepped` is what the group's {@link BatchedStep} gave this job, if it ran for it.
 */
export type GroupJob<T> = (tx: Transaction<any>, stepped: unknown) => Promise<GroupJobEnd<T>>;

/** What a {@link BatchedStep} did for one job: the value its job receives, and the literal SQL that undoes it. */
export interface SteppedJob {
  readonly value: unknown;
  readonly undo: string;
}

/**
 * One statement that does a step of several jobs at once, before they run (the fast path's
 * claims of a group's keys: one round trip instead of one per job). It runs between jobs, on
 * the group's transaction, outside the jobs' savepoints, so what it did for a job that then
 * fails is undone by that job's `undo`. For each input: what it did, or undefined when the job
 * must do the step itself. If it throws an SQL error, it is rolled back and every job does its
 * own step.
 */
export type BatchedStep = (tx: Transaction<any>, inputs: readonly unknown[]) => Promise<ReadonlyArray<SteppedJob | undefined>>;

/** How a job may run in a group: always the careful way, and optimistically when it offers that too. */
export interface GroupJobRuns<T> {
  /** Inside the job's own savepoint (a careful group). */
  readonly careful: GroupJob<T>;
  /** Input of a careful group's batched step for this job; undefined when it takes none. */
  readonly stepInput?: unknown;
  /** With no savepoint, in an optimistic group; tried first when the committer is optimistic. */
  readonly optimistic?: OptimisticJob<T>;
}

/** What a committer can do for several jobs at once, beyond running each. */
export interface GroupSteps {
  /** The careful groups' batched step (the fast path's claims of new keys). */
  readonly batchedStep?: BatchedStep;
  /** How an optimistic group writes its new keys at its end; without it, no job can run optimistically. */
  readonly insertCompletedKeys?: InsertCompletedKeys;
}

interface Waiting {
  readonly job: GroupJob<unknown>;
  /** Input of the group's batched step for this job; undefined when it takes none. */
  readonly stepInput: unknown;
  /** Its optimistic variant, until it has been tried (a job runs optimistically at most once). */
  optimistic: OptimisticJob<unknown> | undefined;
  readonly resolve: (value: unknown) => void;
  readonly reject: (error: unknown) => void;
  outcome?: { readonly value: unknown } | { readonly error: unknown };
}

/**
 * Group commit: concurrent jobs' effects and completions share one transaction, so a group of
 * N jobs pays one BEGIN, one COMMIT and one WAL flush instead of N.
 *
 * Groups come in two kinds. An optimistic group (see `optimistic-group.ts`) runs its jobs with
 * no savepoints and writes every key at its end, with the COMMIT; it is tried first, for jobs
 * that offer an optimistic variant, when the committer is optimistic. If anything in it fails,
 * it rolls back whole and its jobs wait again, to run in careful groups. A careful group (see
 * {@link GroupTransaction}) gives each job its own savepoint, so a job that fails rolls back
 * only itself: a failed statement, a failed closing statement (a lost lease) and an SQL error
 * the job caught itself. A job that caught an SQL error of its own statement fails with it.
 *
 * A job that arrives while fewer than `maxGroups` groups are open starts a group; otherwise it
 * waits and joins the next open group that looks for work. A group takes the waiting jobs of
 * its kind (up to `maxJobs`; careful jobs first, as they have waited before), runs them (an
 * optimistic group at once, gathering their statements into shared round trips, until a job
 * sends a statement after a group-mate's; a careful group one after another), takes more while
 * any are waiting and it holds fewer than `maxJobs`, then commits. Nothing waits on a timer:
 * under load, jobs group themselves.
 *
 * Every job settles when its group ends: resolved when the COMMIT succeeded (or with its own
 * error when its part was rolled back), rejected with the group's error when the group could
 * not commit (or could not tell whether it did), so that nothing is reported done that did
 * not commit. A job is never failed for a group-mate's error.
 *
 * The price: a group commits when its last job has ended, and it holds every job's row locks
 * until then, so a slow job holds up its group. And a job may run more
 * than once: which is why, by default, `IdempotencyKeys` groups only database-only effects
 * (whose every run but the committed one leaves no trace), and every effect only when asked.
 */
export class GroupCommitter {
  readonly #db: Kysely<any>;
  readonly #maxJobs: number;
  readonly #maxGroups: number;
  readonly #batchedStep: BatchedStep | undefined;
  readonly #insertCompletedKeys: InsertCompletedKeys | undefined;
  readonly #waiting: Waiting[] = [];
  #open = 0;
  /**
   * Optimistic groups run their jobs at once, gathering their statements (see
   * `runOptimisticGroup`), until a job sends a statement after a group-mate's: from then on,
   * one after another. Only on connections that answer a string with every result.
   */
  #gather: boolean;

  constructor(db: Kysely<any>, options: GroupCommitOptions = {}, steps: GroupSteps = {}) {
    this.#db = db;
    this.#maxJobs = options.maxJobs ?? GROUP_COMMIT_DEFAULTS.maxJobs;
    this.#maxGroups = options.maxGroups ?? GROUP_COMMIT_DEFAULTS.maxGroups;
    this.#batchedStep = steps.batchedStep;
    this.#insertCompletedKeys = (options.optimistic ?? GROUP_COMMIT_DEFAULTS.optimistic) ? steps.insertCompletedKeys : undefined;
    this.#gather = returnsLastResult(db);
  }

  /**
   * Runs a job in a group; resolves with its value once its group committed. It runs
   * optimistically first when it offers that and the committer is optimistic, else (and after
   * an optimistic group failed) carefully, where the group's batched step may do its first step
   * (see {@link BatchedStep}).
   */
  run<T>(runs: GroupJobRuns<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.#waiting.push({
        job: runs.careful as GroupJob<unknown>,
        stepInput: runs.stepInput,
        optimistic: this.#insertCompletedKeys ? (runs.optimistic as OptimisticJob<unknown> | undefined) : undefined,
        resolve: resolve as (value: unknown) => void,
        reject,
      });
      if (this.#open < this.#maxGroups) void this.#runGroup();
    });
  }

  async #runGroup(): Promise<void> {
    this.#open++;
    try {
      if (this.#waiting.some((waiting) => waiting.optimistic === undefined)) await this.#runCarefulGroup();
      else await this.#runOptimisticGroup(this.#insertCompletedKeys!);
    } finally {
      this.#open--;
      if (this.#waiting.length > 0 && this.#open < this.#maxGroups) void this.#runGroup();
    }
  }

  /**
   * Waiting jobs of one kind, at most `room`, in the order they came. An optimistic group also
   * leaves a job whose key it already holds (`identities`) for a later group.
   */
  #take(room: number, kind: 'careful' | 'optimistic', identities?: Set<string>): Waiting[] {
    const taken: Waiting[] = [];
    for (let i = 0; i < this.#waiting.length && taken.length < room; ) {
      const waiting = this.#waiting[i]!;
      const optimistic = waiting.optimistic;
      const fits =
        kind === 'careful' ? optimistic === undefined : optimistic !== undefined && !identities!.has(optimistic.identity);
      if (!fits) {
        i++;
        continue;
      }
      if (optimistic) identities!.add(optimistic.identity);
      taken.push(waiting);
      this.#waiting.splice(i, 1);
    }
    return taken;
  }

  async #runOptimisticGroup(insertCompletedKeys: InsertCompletedKeys): Promise<void> {
    const members: Waiting[] = [];
    const identities = new Set<string>();
    try {
      const verdict = await runOptimisticGroup(
        this.#db,
        () => {
          const batch = this.#take(this.#maxJobs - members.length, 'optimistic', identities);
          members.push(...batch);
          return batch.map((member) => member.optimistic!);
        },
        { insertCompletedKeys, gather: this.#gather, everyResult: returnsLastResult(this.#db) },
      );
      if (verdict.kind === 'committed') members.forEach((member, i) => member.resolve(verdict.values[i]));
      else if (verdict.kind === 'unknown') for (const member of members) member.reject(verdict.error);
      else if (verdict.interleaved) {
        // These jobs send several statements each: they run again optimistically, ahead of the
        // others, one after another, as every later group does.
        this.#gather = false;
        this.#waiting.unshift(...members);
      } else {
        // Rolled back whole: every job waits again, ahead of the others, for a careful group.
        for (const member of members) member.optimistic = undefined;
        this.#waiting.unshift(...members);
      }
    } catch (error) {
      // No connection at all (Postgres unreachable, so nobody was taken): fail the waiting jobs
      // too, for their callers to retry, instead of starting the next group and failing again.
      for (const member of members) member.reject(error);
      if (members.length === 0) for (const waiting of this.#waiting.splice(0)) waiting.reject(error);
    }
  }

  async #runCarefulGroup(): Promise<void> {
    const members: Waiting[] = [];
    let group!: GroupTransaction;
    const mergeStatements = returnsLastResult(this.#db);
    try {
      await onOneConnection(
        this.#db,
        async (tx) => {
          try {
            for (;;) {
              // Up to maxJobs in all, and within Postgres's cache of subtransaction ids: one
              // savepoint per job, plus one for this batch's batched step.
              const room = Math.min(this.#maxJobs - members.length, CACHED_SUBTRANSACTIONS - group.savepoints - 1);
              if (room <= 0) break;
              const batch = this.#take(room, 'careful');
              if (batch.length === 0) break;
              members.push(...batch);
              const stepped = await this.#runBatchedStep(group, tx, batch);
              for (const [i, member] of batch.entries()) {
                group.startJob();
                await this.#runMember(group, tx, member, stepped[i]);
              }
            }
            await group.commit();
          } catch (error) {
            await group.rollback().catch(() => {});
            throw error;
          }
        },
        (connection) => {
          group = new GroupTransaction(connection, { mergeStatements });
          return group.connection;
        },
      );
      for (const member of members) settle(member, member.outcome ?? { error: new Error('group job left no outcome') });
    } catch (groupError) {
      // Nothing of the group committed: a job's own error still says more than the group's.
      for (const member of members) settle(member, member.outcome && 'error' in member.outcome ? member.outcome : { error: groupError });
      // No connection at all (Postgres unreachable): fail the waiting jobs too, for their
      // callers to retry, instead of starting the next group at once and failing again in a loop.
      if (members.length === 0) for (const waiting of this.#waiting.splice(0)) waiting.reject(groupError);
    }
  }

  /** The batched step for the jobs of `batch` that take one; what it did for each (by position). */
  async #runBatchedStep(group: GroupTransaction, tx: Transaction<any>, batch: readonly Waiting[]): Promise<Array<SteppedJob | undefined>> {
    const step = this.#batchedStep;
    const taking = batch.flatMap((member, position) => (member.stepInput === undefined ? [] : [position]));
    // One job's step costs the same round trip alone as batched.
    if (!step || taking.length < 2) return [];
    const done = await group.runShared(() => step(tx, taking.map((position) => batch[position]!.stepInput)));
    const stepped: Array<SteppedJob | undefined> = [];
    if ('value' in done) taking.forEach((position, i) => (stepped[position] = done.value[i]));
    return stepped;
  }

  async #runMember(group: GroupTransaction, tx: Transaction<any>, member: Waiting, stepped: SteppedJob | undefined): Promise<void> {
    const undo = stepped ? [stepped.undo] : [];
    let end: GroupJobEnd<unknown>;
    try {
      end = await member.job(tx, stepped?.value);
    } catch (error) {
      member.outcome = { error };
      group.abortJob(undo);
      return;
    }
    if (end.closing === 'rollback') {
      member.outcome = { value: end.value };
      group.abortJob(undo);
      return;
    }
    // A statement of the job failed and the job caught the error: its savepoint is aborted, so
    // it cannot commit. It fails with the error it swallowed, rolled back alone.
    const failure = group.statementFailure;
    if (failure !== undefined) {
      member.outcome = { error: failure };
      group.abortJob(undo);
      return;
    }
    member.outcome = { value: end.value };
    group.endJob(
      end.closing,
      (error) => {
        member.outcome = { error: end.closingError ? end.closingError(error) : error };
      },
      undo,
    );
  }
}

function settle(member: Waiting, outcome: { readonly value: unknown } | { readonly error: unknown }): void {
  if ('error' in outcome) member.reject(outcome.error);
  else member.resolve(outcome.value);
}
