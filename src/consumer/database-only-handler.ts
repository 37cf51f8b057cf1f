import type { Transaction } from 'kysely';
import { ValidationError } from '../errors.js';
import type { KeyedJobContext } from './keyed-job-runner.js';

/**
 * What a database-only handler's transaction receives: the job's payload, key, scope, fence,
 * attempt, message and signal; no `transaction` and no `step`, for the whole job is one
 * transaction already.
 */
export type DatabaseOnlyContext<P = unknown, M = unknown> = Omit<KeyedJobContext<P, M>, 'transaction' | 'step'>;

/**
 * A database-only handler: the whole job is one transaction on this database, `transaction(tx,
 * ctx)`, whose return value is the key's stored result. It commits with the key's completion or
 * not at all.
 *
 * The contract: everything the job does goes through `tx`. Nothing outside this database inside
 * `transaction`: no HTTP call, no queue publish, no file write, no other database. A job that
 * has such effects is a function handler (`async (ctx) => …`) that runs them as `ctx.step`s.
 *
 * Why: being one transaction, a run that rolls back leaves no trace, so running it again is a
 * transaction retry. The workers therefore run database-only handlers on the fast path (claim,
 * effect and result in one transaction; no lease) and with group commit (concurrent jobs share
 * transactions, optimistically: a group that fails rolls back and its jobs run again, so
 * `transaction` may run more than once for one key, one run committing), unless turned off with
 * `fastPath: false` or `groupCommit: false` (`FAST_PATH=false`, `GROUP_COMMIT=false`).
 *
 * The price of group commit: a group commits when its last job has ended and holds their row
 * locks until then, so a slow `transaction` holds up its group-mates. Keep it
 * short (a few statements), or turn group commit off for such a worker.
 *
 * @example
 * ```ts
 * import { databaseOnly } from 'idempotent-jobs';
 *
 * const handler = databaseOnly<{ amount: number }>(async (tx, ctx) => {
 *   await tx.insertInto('ledger').values({ key: ctx.key, amount: ctx.data.amount }).execute();
 *   return { booked: ctx.data.amount };
 * });
 * ```
 */
export interface DatabaseOnlyHandler<P = unknown, R = unknown, C = DatabaseOnlyContext<P>> {
  /** The job: its effects through `tx`, only; its return value is stored under the key. */
  readonly transaction: (tx: Transaction<any>, ctx: C) => Promise<R>;
}

/**
 * A handler of any broker's consumer: a function (`async (ctx) => result`, which may call other
 * systems, `ctx.step` and `ctx.transaction`), or a {@link DatabaseOnlyHandler}.
 */
export type KeyedJobHandler<P = unknown, R = unknown, M = unknown> =
  | ((ctx: KeyedJobContext<P, M>) => Promise<R>)
  | DatabaseOnlyHandler<P, R, DatabaseOnlyContext<P, M>>;

/**
 * A {@link DatabaseOnlyHandler} from its transaction: `databaseOnly(async (tx, ctx) => …)`.
 * Nothing but the object itself; it lets `ctx` be typed where the handler is written.
 */
export function databaseOnly<P = unknown, R = unknown, C = DatabaseOnlyContext<P>>(
  transaction: (tx: Transaction<any>, ctx: C) => Promise<R>,
): DatabaseOnlyHandler<P, R, C> {
  return { transaction };
}

/** True for a {@link DatabaseOnlyHandler}: an object (not a function) whose `transaction` is a function. */
export function isDatabaseOnlyHandler(handler: unknown): handler is DatabaseOnlyHandler<any, any, any> {
  return (
    typeof handler === 'object' &&
    handler !== null &&
    typeof (handler as { transaction?: unknown }).transaction === 'function'
  );
}

/** What makes a handler of either form, for error messages. */
export const HANDLER_FORMS = 'a function (async (ctx) => result) or a database-only handler ({ transaction: async (tx, ctx) => result })';

/**
 * Which form `handler` has; throws a {@link ValidationError} (`INVALID_OPTIONS`, field
 * `handler`) when it is neither.
 */
export function handlerForm(handler: unknown): 'function' | 'database-only' {
  if (typeof handler === 'function') return 'function';
  if (isDatabaseOnlyHandler(handler)) return 'database-only';
  const got = handler === null ? 'null' : typeof handler === 'object' ? 'an object without a transaction function' : typeof handler;
  throw new ValidationError('INVALID_OPTIONS', 'handler', `handler must be ${HANDLER_FORMS}; got ${got}.`);
}
