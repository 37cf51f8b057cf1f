import type { Transaction } from 'kysely';
import type { DatabaseStep, ExternalStep, StepBody } from '../protocol/job-steps.js';
import type { Claim } from '../store/claim-outcome.js';
import type { DataLayer } from '../store/data-layer.js';
import type { JobIdentity } from './wire-contract.js';

/**
 * What a handler receives for one message whose key this consumer holds, on any broker. The
 * BullMQ worker's `JobContext` adds `job`; broker consumers name their message in `message`.
 */
export interface KeyedJobContext<P = unknown, M = unknown> {
  /** The payload (`payload` under the wire contract). */
  readonly data: P;
  /** The message's idempotency key, which this consumer holds under a lease (or, on the fast path, inside the open transaction). */
  readonly key: string;
  /** The key's scope. */
  readonly scope: string;
  /** The claim's fence; pass it downstream if the downstream can fence too. */
  readonly fence: number;
  /** How many times the key has been claimed: 1 first, more after takeovers and retries. */
  readonly attempt: number;
  /** The broker's message (a BullMQ `Job`, an AMQP `ConsumeMessage`, a JetStream `JsMsg`). */
  readonly message: M;
  /** Fires when the lease is lost (reason: `LeaseLostError`) or the consumer is shutting down. */
  readonly signal: AbortSignal;
  /**
   * Runs `fn(tx)` in a transaction that also completes the key, storing `fn`'s return value:
   * the effect and the completion commit together or not at all. Call it at most once.
   *
   * `fn` may run more than once, one run committing, as in every database-retry API: with group
   * commit (the default) it may share a transaction with other jobs' callbacks, and when that
   * group rolls back for another job's failure it runs again. A run that did not commit leaves
   * nothing in the database; what it did elsewhere stays done. So call other systems outside
   * `fn` (before `ctx.transaction`, in a `ctx.step`), or pass `{ runsAlone: true }`, which runs
   * `fn` once in a transaction of its own (see {@link TransactionOptions}).
   */
  transaction<T>(fn: (tx: Transaction<any>) => Promise<T>, options?: TransactionOptions): Promise<T>;
  /**
   * The same in a data layer of your own (`idempotent-jobs/pg`, `/postgres-js`, `/drizzle`,
   * `/prisma`, `/typeorm`): `fn(tx)` runs on the data layer's transaction (a `PoolClient`, a
   * Prisma or Drizzle transaction, a TypeORM `EntityManager`…), and the key's fenced completion
   * runs last inside it. Refused when the lease was lost ({@link LeaseLostError}, the
   * transaction rolls back). Call it at most once, and not on the fast path of a function
   * handler (use `databaseOnly(dataLayer, …)` there).
   */
  transaction<Tx, T>(dataLayer: DataLayer<Tx>, fn: (tx: Tx) => Promise<T>): Promise<T>;
  /**
   * An external step of a multi-step job (a call to another system), `ctx.step(name, async
   * (step) => …)`: recorded under the key and `name` when it succeeds, so that a later run of
   * the key (a retry, a takeover) returns the recorded result without running it and goes on
   * at the first step not recorded. At most once per lease: it runs again only under a new
   * claim, when the last one died before recording it. Pass `step.stepKey` downstream;
   * `step.starts` counts its starts. Its record rides with the run's next round trip (the next
   * step, or the completion), which makes it durable before anything after it runs.
   *
   * Call steps before `ctx.transaction` (which stays the completion), in the same order with
   * the same names on every run; names are unique within a run (else `StepMismatchError`).
   * Resolves to the result as stored (its JSON form), on the first run as on replays. Not
   * available on the fast path (throws `StepsUnsupportedError`).
   */
  step<T>(name: string, run: ExternalStep<T>): Promise<T>;
  /**
   * A database step of a multi-step job, `ctx.step(name, { transaction: async (tx, step) =>
   * … })`: exactly once, since its writes and its record commit together in one transaction. A
   * later run of the key returns the recorded result without running it. The same rules as an
   * external step: before `ctx.transaction`, the same order and names on every run, not on the
   * fast path.
   *
   * In a data layer of your own, `ctx.step(name, { dataLayer, transaction: async (tx, step) =>
   * … })`: `tx` is the data layer's transaction (a `PoolClient`, a Prisma or Drizzle
   * transaction, a TypeORM `EntityManager`…), and the step's fenced record runs last inside it.
   */
  step<T, Tx = Transaction<any>>(name: string, database: DatabaseStep<T, Tx>): Promise<T>;
}

/** One delivery of a message, as its adapter describes it to the runner. */
export interface Delivery<M> {
  /** What the handler sees as `ctx.message`. */
  readonly message: M;
  /** The broker's id of the message (a job id, an AMQP message id), for logs, events and the key's row. */
  readonly id: string | undefined;
  /** How logs and errors name the delivery, e.g. `Job 7 on queue "payments"`. */
  readonly label: string;
  /** The queue (or stream, subject) and the message's name, kept on the key's row for operators. */
  readonly queue: string;
  /** The message's name (a BullMQ job name; broker consumers use the queue's or subject's name). */
  readonly name: string;
  /**
   * True when a retryable error must be stored anyway: the broker will not deliver it again.
   * Read once the run has failed (an adapter may count attempts on the key: a getter).
   */
  readonly lastAttempt: boolean;
  /** How often this message was deferred (or redelivered) without using an attempt; backs off store faults. */
  readonly deferrals: number;
  /**
   * Which delivery of the message this is, counting from 1 (BullMQ's `attemptsStarted`,
   * JetStream's delivery count), when the broker counts them: bound into the job's log lines, so
   * that a run can be told from an older delivery of the same message.
   */
  readonly deliveryCount?: number;
  /**
   * When the producer sent the message (ms since the epoch: BullMQ's job timestamp, JetStream's
   * stored time), when the broker says: coalescing keys order payloads by it.
   */
  readonly sentAtMs?: number;
  /** The broker's own cancellation of this delivery, if it has one. */
  readonly signal?: AbortSignal;
}

/** Options of `ctx.transaction(fn, options)`. */
export interface TransactionOptions {
  /**
   * Never share a group's transaction: `fn` runs in a transaction of its own, and runs again
   * only if the job does (a retry, a takeover), as without group commit. For a callback that
   * calls another system inside the transaction, or changes a setting from inside a function.
   * @defaultValue `false` (it may share one; `GROUP_COMMIT=false` turns groups off for the worker)
   */
  readonly runsAlone?: boolean;
}

/**
 * Reads the options a handler passed to `ctx.transaction(fn, options)`; throws a TypeError naming
 * the mistake for anything else. The default error disposition retries a TypeError, so a deploy
 * that mends the handler can still run the job while it has attempts left.
 */
export function transactionOptionsOf(options: unknown): TransactionOptions {
  if (options === undefined) return {};
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    throw new TypeError('ctx.transaction(fn, options): options must be an object like { runsAlone: true }.');
  }
  const { runsAlone, ...rest } = options as Record<string, unknown>;
  const unknownNames = Object.keys(rest);
  if (unknownNames.length > 0) {
    throw new TypeError(`ctx.transaction(fn, options): unknown option ${unknownNames.join(', ')} (it takes runsAlone).`);
  }
  if (runsAlone !== undefined && typeof runsAlone !== 'boolean') {
    throw new TypeError('ctx.transaction(fn, options): runsAlone must be true or false.');
  }
  return runsAlone === undefined ? {} : { runsAlone };
}

/** The handler's `ctx` for one run: the message's identity, the claim, and how this run commits and records steps. */
export function jobContext<P, M>(
  delivery: Delivery<M>,
  identity: JobIdentity<P>,
  claim: Claim,
  signal: AbortSignal,
  transaction: (first: DataLayer<unknown> | ((tx: Transaction<any>) => Promise<unknown>), second?: unknown) => Promise<unknown>,
  step: (name: string, body: StepBody<unknown>) => Promise<unknown>,
): KeyedJobContext<P, M> {
  return {
    data: identity.payload,
    key: identity.key,
    scope: identity.scope,
    fence: claim.fence,
    attempt: claim.attempts,
    message: delivery.message,
    signal,
    transaction: transaction as KeyedJobContext<P, M>['transaction'],
    step: step as KeyedJobContext<P, M>['step'],
  };
}
