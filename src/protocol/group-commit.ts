import type { Kysely } from 'kysely';
import type { GroupStatements, WatchedState } from '../store/key-store.js';
import { pipelines } from '../store/pipeline.js';
import { StateLeftBehind } from '../store/gathering-connection.js';
import { groupRefusalsCounter, refusalReasonOf, type GroupRefusal } from './group-refusals.js';
import { runGroupTransaction, type EachJobCheck, type GroupMember, type GroupVerdict } from './group-transaction.js';

/** Options of group commit ({@link IdempotencyOptions.groupCommit}). */
export interface GroupCommitOptions {
  /** Most jobs in one transaction (at most 63): a failed group's jobs all run again. @defaultValue `32` */
  readonly maxJobs?: number;
  /** Groups open at once, each on its own connection. @defaultValue `2` */
  readonly maxGroups?: number;
  /**
   * Custom settings (`app.tenant`) to watch besides those the library always watches, those
   * declared for the database or role and those named by a literal in the database's functions
   * and policies: a job that changed one (say, inside a function the handler calls) is found
   * after its statements, its group rolls back, and it runs alone. Name here what your code sets
   * under a name it computes (`set_config(v_name, …)`). @defaultValue `[]`
   */
  readonly watchSettings?: readonly string[];
  /**
   * Longest a job's callback may hold its group open, from its start to its end. Past it, the
   * group rolls back without waiting for it; its group-mates share a transaction again, and the
   * slow job runs alone once its abandoned run has ended (its later statements fail). This
   * bounds the time a callback spends outside the database (an await on another system); a
   * statement already on its way is waited for, as the connection answers in order (bounded by
   * `statement_timeout` and `lock_timeout`). @defaultValue `1000`
   */
  readonly slowJobMs?: number;
}

/**
 * The defaults of {@link GroupCommitOptions}, used by the options and the environment alike.
 * Two groups: in the benchmarks, four cost more CPU per job (more, smaller commits) for no gain.
 * Up to 32 jobs each, so that two groups can hold what 64 jobs in flight bring: a gathered
 * group's jobs share their round trips, so a larger group costs little more time.
 */
export const GROUP_COMMIT_DEFAULTS: Required<GroupCommitOptions> = { maxJobs: 32, maxGroups: 2, watchSettings: [], slowJobMs: 1_000 };

/**
 * How often a job may share a transaction that then rolls back for a group-mate's failure
 * before it runs alone: a job is never held up for long by others' failures.
 */
const MAX_GROUP_TRIES = 3;

/** How long a kind of job found holding its concurrency slots by its group past `slowJobMs` runs alone. */
const SLOW_KIND_ALONE_MS = 5 * 60_000;

/** A job as group commit runs it: in a group when it can, alone when it must. */
export interface GroupJob<T> extends GroupMember<T> {
  /** The job in a transaction of its own, as it would run without group commit. */
  readonly alone: () => Promise<T>;
  /**
   * What runs it (a queue and job name): once a job of a kind is found sending a statement that
   * cannot share a transaction, later jobs of that kind run alone from the start. Unset: only
   * this job.
   */
  readonly kind?: string;
  /** Told when group commit sends this job out of its group for what it did to the shared transaction (to log it). */
  readonly onRefused?: (refusal: GroupRefusal) => void;
}

interface Waiting {
  readonly job: GroupJob<unknown>;
  readonly resolve: (value: unknown) => void;
  readonly reject: (error: unknown) => void;
  /** Groups it shared that rolled back for another job's failure. */
  tries: number;
}

/**
 * Group commit: concurrent jobs' effects and completions share one transaction, so a group of N
 * jobs pays one BEGIN, one COMMIT and one WAL flush instead of N, and (gathered) one round trip
 * for N jobs' statements.
 *
 * **What a group guarantees: its jobs' outcomes are those of running them one after another,
 * each in a transaction of its own.** A group commits whole, and only a committed group completes
 * its jobs' keys; a job is never failed in a group. When anything fails, the group rolls back and
 * Postgres's answer says whose failure it was (`store/pipeline.ts`): a job whose statement failed,
 * which threw, whose closing statement failed, whose key had a row, or which sent a statement
 * that cannot share a transaction runs again alone, in a transaction of its own (`alone`), where
 * its outcome is its own; its group-mates share a transaction again. A failure no single job is
 * certainly to blame for (the COMMIT refused on a deferred constraint, a setting changed where
 * the statements cannot show it) sends every job of the group to run alone. A job that has
 * shared {@link MAX_GROUP_TRIES} failed groups runs alone too.
 *
 * Nothing crosses from one job to the next inside a group: a job's statement that would leave
 * state behind (a setting, a temporary table) is never sent in a group, and, where code stored
 * in the database could leave state too (`codeCanLeaveState`), after each job's statements the
 * transaction's state is compared with what the group's BEGIN kept (`store/sql/group-settings.ts`),
 * before any group-mate's statement runs; the group's end compares what those checks did not
 * (see {@link EachJobCheck}). A job found leaving state runs alone, and so do later jobs of its
 * kind; each such refusal is counted
 * (`idempotent_jobs_group_commit_refusals_total`) and told to the job (`onRefused`). One thing
 * cannot be told apart: `now()` is the group's BEGIN time, for every job of it.
 *
 * A job that arrives while fewer than `maxGroups` groups are open starts a group; otherwise it
 * waits and joins the next open group that looks for work. A group takes the waiting jobs (up
 * to `maxJobs`; those that waited before first), runs them (gathered: at once, their statements
 * sharing round trips, until a job sends a statement after a group-mate's; from then on, one
 * after another, as every later group), takes more while any are waiting and it holds fewer
 * than `maxJobs`, then commits. Nothing waits on a timer: under load, jobs group themselves.
 *
 * The price: a group commits when its last job has ended, and it holds every job's row locks
 * until then, so a slow job holds up its group, for at most `slowJobMs`: past it the group
 * goes on without it, and it runs alone once its run has ended. And a job may run more than
 * once (one run committing): which is why, by default, `IdempotencyKeys` groups only effects
 * marked database-only (whose every run but the committed one leaves no trace: the workers'
 * transactions and `ctx.transaction` callbacks), and every effect only when asked.
 */
export class GroupCommitter {
  readonly #db: Kysely<any>;
  readonly #statements: GroupStatements;
  readonly #maxJobs: number;
  readonly #maxGroups: number;
  readonly #lockTimeoutMs: number;
  readonly #watchSettings: readonly string[];
  readonly #slowJobMs: number;
  readonly #waiting: Waiting[] = [];
  /** Kinds of jobs found sending a statement that cannot share a transaction: they run alone. */
  readonly #aloneKinds = new Set<string>();
  /** Kinds of jobs found holding concurrency slots by their group past slowJobMs: they run alone until then (`performance.now()`). */
  readonly #slowKindsUntil = new Map<string, number>();
  /** Set once a group's end found state a job left that the checks after each job did not compare (see {@link EachJobCheck}). */
  #checkEverythingEachJob = false;
  /** The store's last watched state, with {@link GroupCommitOptions.watchSettings} added. */
  #merged: { readonly from: WatchedState; readonly state: WatchedState } | undefined;
  readonly #refusals = groupRefusalsCounter();
  #open = 0;
  /**
   * Groups run their jobs at once, gathering their statements, until a job sends a statement
   * after a group-mate's: from then on, one after another. Only on connections that pipeline.
   */
  #gather: boolean;

  constructor(db: Kysely<any>, statements: GroupStatements, options: GroupCommitOptions & { readonly lockTimeoutMs: number }) {
    this.#db = db;
    this.#statements = statements;
    this.#maxJobs = options.maxJobs ?? GROUP_COMMIT_DEFAULTS.maxJobs;
    this.#maxGroups = options.maxGroups ?? GROUP_COMMIT_DEFAULTS.maxGroups;
    this.#lockTimeoutMs = options.lockTimeoutMs;
    this.#watchSettings = options.watchSettings ?? GROUP_COMMIT_DEFAULTS.watchSettings;
    this.#slowJobMs = options.slowJobMs ?? GROUP_COMMIT_DEFAULTS.slowJobMs;
    this.#gather = pipelines(db);
  }

  /** Runs a job in a group (or alone, when it must); resolves with its value once its transaction committed. */
  run<T>(job: GroupJob<T>): Promise<T> {
    if (job.kind !== undefined && (this.#aloneKinds.has(job.kind) || this.#slowKindAlone(job.kind))) return job.alone();
    return new Promise<T>((resolve, reject) => {
      this.#waiting.push({ job: job as GroupJob<unknown>, resolve: resolve as (value: unknown) => void, reject, tries: 0 });
      if (this.#open < this.#maxGroups) void this.#runGroup();
    });
  }

  async #runGroup(): Promise<void> {
    this.#open++;
    const members: Waiting[] = [];
    try {
      const watched = await this.#watched();
      const identities = new Set<string>();
      const verdict = await runGroupTransaction(
        this.#db,
        () => {
          const batch = this.#take(this.#maxJobs - members.length, identities);
          members.push(...batch);
          return batch.map((waiting) => waiting.job);
        },
        {
          statements: this.#statements,
          gather: this.#gather,
          pipelines: pipelines(this.#db),
          watchedSettings: watched?.names,
          checkEachJob: this.#checkEachJob(watched),
          lockTimeoutMs: this.#lockTimeoutMs,
          slowJobMs: this.#slowJobMs,
          onLeft: (job, error) => {
            // Told at once: its caller goes on while the group does.
            const at = members.findIndex((member) => member.job === job);
            if (at >= 0) members.splice(at, 1)[0]!.reject(error);
          },
          onSlowHoldingLocks: (job) => this.#noteSlowHoldingLocks(job as GroupJob<unknown>),
        },
      );
      this.#deliverVerdict(members, verdict);
    } catch (error) {
      // No connection at all (Postgres unreachable): fail the waiting jobs too, for their
      // callers to retry, instead of starting the next group and failing again in a loop.
      for (const member of members) member.reject(error);
      if (members.length === 0) for (const waiting of this.#waiting.splice(0)) waiting.reject(error);
    } finally {
      this.#open--;
      if (this.#waiting.length > 0 && this.#open < this.#maxGroups) void this.#runGroup();
    }
  }

  #deliverVerdict(all: readonly Waiting[], verdict: GroupVerdict<GroupJob<unknown>>): void {
    // A job whose callback outran slowJobMs runs alone once that run has ended, whatever the
    // verdict: never two runs of one callback at once.
    const abandoned = verdict.kind === 'committed' ? undefined : verdict.abandoned;
    const members = abandoned?.size ? all.filter((member) => !abandoned.has(member.job)) : all;
    for (const member of all) {
      const run = abandoned?.get(member.job);
      if (run) void run.then(() => this.#runAlone(member));
    }
    switch (verdict.kind) {
      case 'committed':
        for (const member of members) member.resolve(verdict.values.get(member.job));
        return;
      case 'interleaved':
        // These jobs send several statements each: they run again, one after another, ahead
        // of the others, as every later group does.
        this.#gather = false;
        this.#waiting.unshift(...members);
        return;
      case 'culprits': {
        for (const member of members) if (verdict.culprits.has(member.job)) this.#noteRefusal(member.job, verdict.errors.get(member.job));
        const again: Waiting[] = [];
        for (const member of members) {
          // A group-mate of a kind just found leaving state runs alone too, as later ones will.
          const aloneKind = member.job.kind !== undefined && this.#aloneKinds.has(member.job.kind);
          if (verdict.culprits.has(member.job) || aloneKind) this.#runAlone(member);
          else if (++member.tries >= MAX_GROUP_TRIES) this.#runAlone(member);
          else again.push(member);
        }
        this.#waiting.unshift(...again);
        return;
      }
      case 'uncertain':
        // State one of the group's jobs left, found at the group's end (a prepared statement,
        // or anything when nothing is compared after each job): from now on each job's check
        // compares everything, so the next such job is found and its kind runs alone.
        if (verdict.error instanceof StateLeftBehind) this.#checkEverythingEachJob = true;
        for (const member of members) this.#runAlone(member);
        return;
      case 'unknown':
        // The COMMIT may have been applied: each job's caller reads its key to find out.
        for (const member of members) member.reject(verdict.error);
        return;
    }
  }

  /**
   * The store's watched state, with the settings of {@link GroupCommitOptions.watchSettings};
   * undefined when the store checks no state. Settings named there are set by the application's
   * code under names it computes, so that code can leave state: each job is checked.
   */
  async #watched(): Promise<WatchedState | undefined> {
    const watched = await this.#statements.state?.watched();
    if (watched === undefined || this.#watchSettings.length === 0) return watched;
    // One merged list per read of the store's, so that the statements built from it are too.
    if (this.#merged?.from !== watched) {
      this.#merged = { from: watched, state: { names: [...new Set([...watched.names, ...this.#watchSettings])], codeCanLeaveState: true } };
    }
    return this.#merged.state;
  }

  /** What the check after each job compares: everything once a group's end found state it missed. */
  #checkEachJob(watched: WatchedState | undefined): EachJobCheck {
    if (this.#checkEverythingEachJob) return 'everything';
    return watched?.codeCanLeaveState ? 'all-but-prepared-statements' : 'nothing';
  }

  /**
   * A job past slowJobMs that may hold concurrency slots by its group's transaction: its group
   * waits for it (its slots must last its run), holding its group-mates' commit up. Its kind runs
   * alone for a while (a stall of the process can make a quick job look slow), counted and told
   * as a refusal.
   */
  #noteSlowHoldingLocks(job: GroupJob<unknown>): void {
    if (job.kind !== undefined) this.#slowKindsUntil.set(job.kind, performance.now() + SLOW_KIND_ALONE_MS);
    this.#refusals.inc({ reason: 'slots-held-too-long' });
    const error = new Error(`a job that may hold concurrency slots by its group's transaction ran past slowJobMs (${this.#slowJobMs} ms): the group waited for it; its kind runs alone for a while`);
    job.onRefused?.({ reason: 'slots-held-too-long', error, kind: job.kind });
  }

  #slowKindAlone(kind: string): boolean {
    const until = this.#slowKindsUntil.get(kind);
    if (until === undefined) return false;
    if (until > performance.now()) return true;
    this.#slowKindsUntil.delete(kind);
    return false;
  }

  #runAlone(member: Waiting): void {
    member.job.alone().then(member.resolve, member.reject);
  }

  /**
   * A job to blame: when what it did cannot share a transaction (a refusal, not a failure of
   * its own), jobs of its kind run alone from now on, and the refusal is counted and told.
   */
  #noteRefusal(job: GroupJob<unknown>, error: unknown): void {
    const reason = refusalReasonOf(error);
    if (reason === undefined) return;
    if (job.kind !== undefined) this.#aloneKinds.add(job.kind);
    this.#refusals.inc({ reason });
    job.onRefused?.({ reason, error: error as Error, kind: job.kind });
  }

  /**
   * Waiting jobs, at most `room`, in the order they came, leaving for a later group a job whose
   * key the group already holds (`identities`).
   */
  #take(room: number, identities: Set<string>): Waiting[] {
    const taken: Waiting[] = [];
    for (let i = 0; i < this.#waiting.length && taken.length < room; ) {
      const waiting = this.#waiting[i]!;
      if (identities.has(waiting.job.identity)) {
        i++;
        continue;
      }
      identities.add(waiting.job.identity);
      taken.push(waiting);
      this.#waiting.splice(i, 1);
    }
    return taken;
  }
}
