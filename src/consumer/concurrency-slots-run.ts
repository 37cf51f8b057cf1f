import type { Transaction } from 'kysely';
import { LeavesGroup } from '../protocol/group-transaction.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { sqlStateOf } from '../store/pg-errors.js';
import { HeldSlot, type ConcurrencySlotPool } from './concurrency-slot-pool.js';
import type { RunFailures } from './run-failures.js';
import type { Run, RunResult } from './run-outcome.js';
import type { ConcurrencyLimit } from './wire-contract.js';
import type { ResolvedWorkerTiming } from './worker-timing.js';

/** What a run in concurrency slots needs of the runner around it. */
export interface SlotsRunDeps<P, M> {
  readonly keys: IdempotencyKeys;
  readonly timing: ResolvedWorkerTiming;
  readonly failures: RunFailures<P, M>;
  /** Runs the job's key once its slots are held. */
  readonly runClaimed: (run: Run<P, M>) => Promise<RunResult>;
  /**
   * The adapter wakes a deferred waiter when a slot frees (BullMQ's worker promotes it): a
   * refused job is recorded as a waiter under its delivery's id and queue, which the freeing
   * run's notification names. Unset: waiters ask again when their deferral ends.
   */
  readonly wakesWaiters?: boolean;
}

/**
 * A job with concurrency limits: takes a slot of each of its concurrency keys first (one
 * statement each, or lent by the worker's pool), runs in them and frees them, whatever the run came to; a key at its limit
 * defers the job without using an attempt, as an in-progress duplicate is.
 *
 * *Why sorted, and why all or nothing:* every job takes its keys' slots in the same order (by
 * key, `concurrencyLimitsOf`), and one refused frees the slots taken before it before the
 * job is deferred. So no job holds a slot while it waits for another (no deadlock, and no slot
 * held by a job that is not running), and two jobs never wait on each other in a cycle.
 *
 * *Held for as long as the run:* the slots' heartbeat renews them while the run goes on
 * (`concurrency-slot-heartbeat.ts`), so a run longer than the lease keeps them, on the fast path
 * (whose key is not `processing` while it runs) and after a leased run's commit alike; a run
 * that can no longer show it holds them rolls back instead of committing (`run.slotsLost`).
 *
 * A slot that cannot be freed (Postgres gone) frees itself when its time is up: never later
 * than the run's lease. Freeing a slot that a job waits for wakes the oldest waiter
 * (`sql/concurrency-slot-wakes.ts`).
 *
 * *With a pool* (`concurrencySlotReuseMs`): a slot the worker kept is lent instead of taken, and
 * given back to the pool instead of freed when the run ends (`concurrency-slot-pool.ts`, which
 * says when it is freed after all); a take refused, or one that found another key waiting, tells
 * the pool its key is contended.
 */
export async function runInSlots<P, M>(run: Run<P, M>, limits: readonly ConcurrencyLimit[], deps: SlotsRunDeps<P, M>, pool?: ConcurrencySlotPool): Promise<RunResult> {
  const { keys, timing, failures } = deps;
  const { scope, key } = run.identity;
  const holder = { scope, key, log: run.log };
  const groups = limits.length > 1 ? limits.map((limit) => limit.key) : undefined;
  const waiter = deps.wakesWaiters && run.delivery.id !== undefined ? { jobId: run.delivery.id, queue: run.delivery.queue } : {};
  // A job deferred or delivered before may be a waiter of its keys: it takes its slots from the
  // database, which forgets it as a waiter (a lent slot would leave its row holding others back).
  const borrows = pool !== undefined && run.delivery.deferrals === 0 && (run.delivery.deliveryCount ?? 1) <= 1;
  const held: HeldSlot[] = [];
  let lentAny = false;
  // Refused by a later key, the job frees the slots it took before it is deferred: none is kept
  // for the next job (a slot kept would still be held back from the key's waiters, for a while).
  let refused = false;
  try {
    for (const limit of limits) {
      const lent = borrows ? pool.lend(limit, holder) : undefined;
      if (lent) {
        held.push(lent);
        lentAny = true;
        continue;
      }
      const sentAt = performance.now();
      let answer: Awaited<ReturnType<IdempotencyKeys['acquireConcurrencySlot']>>;
      try {
        answer = await keys.acquireConcurrencySlot(scope, key, limit, {
          leaseMs: timing.leaseMs,
          starvationMs: timing.concurrencyStarvationMs,
          ...(groups && { groups }),
          ...waiter,
        });
      } catch (error) {
        return failures.storeFault(run, error);
      }
      if (!answer.acquired) {
        refused = true;
        pool?.contended(limit.key);
        // A slot kept by a worker frees within its reuse (and its run): ask again by then at the latest.
        return failures.defer(pool ? Math.min(answer.retryAfterMs, pool.reuseMs) : answer.retryAfterMs, 'concurrency-limit', limit.key);
      }
      if (answer.othersWaiting) pool?.contended(limit.key);
      held.push(new HeldSlot(keys, answer, limit.limit, holder, sentAt, timing));
    }
    const slotsLost = held.length === 1 ? held[0]!.lost : AbortSignal.any(held.map((slot) => slot.lost));
    // A lent slot's take recorded another key: a leased claim records this one's limits itself
    // (the sweeper reads them should its key be lost while processing; a fast-path claim leaves
    // no key processing, and ignores them).
    const claimOptions = lentAny ? { ...run.claimOptions, concurrency: limits } : run.claimOptions;
    return await deps.runClaimed({ ...run, claimOptions, slotsLost });
  } finally {
    for (const slot of held) {
      const freeing = pool && !refused ? pool.giveBack(slot) : slot.free(keys);
      if (freeing) await freeing;
    }
  }
}

/** The slots a run holds by its own transaction: its limits, and whether it took them. */
export interface TransactionSlots {
  readonly limits: readonly ConcurrencyLimit[];
  /** Set once the slots are taken: the run then wakes their waiters when its transaction ends. */
  taken: boolean;
  /** The key was a waiter of its keys: its forgetting, sent apart from the transaction, not waited for there. */
  forgotten?: Promise<void>;
}

/**
 * The run's transaction did not take its slots, before the handler ran: a concurrency key was at
 * its limit (`refused`), or the keys' schema has no function to take them so (`unavailable`:
 * migration `034_concurrency_slots_in_groups` not run, the worker started with `MIGRATE=false`).
 * A transaction of the job's own rolls back; a group's goes on without the job (it leaves the
 * group: {@link LeavesGroup}). Either way the job asks for slot rows instead.
 */
export class TransactionSlotsNotTaken extends LeavesGroup {
  readonly reason: 'refused' | 'unavailable';

  constructor(reason: 'refused' | 'unavailable', message: string, options?: { cause: unknown }) {
    super(message, options);
    this.name = 'TransactionSlotsNotTaken';
    this.reason = reason;
  }
}

/**
 * A job with concurrency limits whose run is one transaction (the fast path, alone or in a
 * group): its slots are taken inside that transaction, by `slots`' first statement
 * ({@link takeTransactionSlots}), and held by their locks until it commits or rolls back
 * (`sql/concurrency-slots-in-transaction.ts`): no slot row, no commit to take or free one, no
 * heartbeat. In a group, the group's transaction holds them, until the group commits. A key at
 * its limit ends the run before the handler ran (its own transaction rolls back; a group goes on
 * without it), and the job goes the way of {@link runInSlots}, which
 * records it as a waiter (or takes a slot freed meanwhile); so does every job once the keys'
 * schema proved to have no function to take them so (`deps.unavailable`). Once a transaction
 * that took the slots has ended, the keys' oldest waiters are woken, as freeing a slot row wakes
 * them (a statement that writes nothing when there is none: see `wakeConcurrencyWaiters`).
 */
export async function runInTransactionSlots<P, M>(
  run: Run<P, M>,
  limits: readonly ConcurrencyLimit[],
  deps: SlotsRunDeps<P, M> & {
    readonly runFastPath: (run: Run<P, M>, slots: TransactionSlots) => Promise<RunResult>;
    /** Told once the schema proved to have no function to take slots in a transaction. */
    readonly unavailable: (error: TransactionSlotsNotTaken) => void;
  },
): Promise<RunResult> {
  const slots: TransactionSlots = { limits, taken: false };
  try {
    return await deps.runFastPath(run, slots);
  } catch (error) {
    if (!(error instanceof TransactionSlotsNotTaken)) throw error;
    if (error.reason === 'unavailable') deps.unavailable(error);
    return runInSlots(run, limits, deps);
  } finally {
    await slots.forgotten;
    if (slots.taken) {
      const { scope, key } = run.identity;
      await deps.keys.wakeConcurrencyWaiters(scope, key, limits.map((limit) => limit.key)).catch((error: unknown) => {
        run.log.warn({ err: error }, 'could not wake the waiters of its concurrency keys; they ask again when their deferral ends');
      });
    }
  }
}

/**
 * The first statement of a run's transaction when its slots are held by it: takes them, or throws
 * {@link TransactionSlotsNotTaken} (the transaction then rolls back). Store faults throw as the
 * store's calls do.
 */
export async function takeTransactionSlots<P, M>(keys: IdempotencyKeys, timing: ResolvedWorkerTiming, run: Run<P, M>, tx: Transaction<any>, slots: TransactionSlots): Promise<void> {
  const { scope, key } = run.identity;
  let answer: Awaited<ReturnType<IdempotencyKeys['takeConcurrencySlotsInTransaction']>>;
  try {
    answer = await keys.takeConcurrencySlotsInTransaction(tx, scope, key, slots.limits, { starvationMs: timing.concurrencyStarvationMs });
  } catch (error) {
    // 42883 undefined_function: a schema not migrated to 034. Not the job's fault, and no attempt's.
    if (sqlStateOf(error) === '42883') throw new TransactionSlotsNotTaken('unavailable', 'the keys\' schema has no take_concurrency_slots_in_shared_transaction', { cause: error });
    throw error;
  }
  if (answer.refusedGroup !== undefined) throw new TransactionSlotsNotTaken('refused', `concurrency key ${JSON.stringify(answer.refusedGroup)} is at its limit`);
  slots.taken = true;
  if (answer.wasWaiting) {
    // Not awaited here: it needs a connection of its own while this transaction holds one.
    slots.forgotten = keys.forgetConcurrencyWaiter(scope, key, slots.limits.map((limit) => limit.key)).catch((error: unknown) => {
      run.log.warn({ err: error }, 'could not forget the job as a waiter of its concurrency keys; its row stops counting once it is not seen again');
    });
  }
}
