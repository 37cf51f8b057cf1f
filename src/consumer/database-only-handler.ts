import type { Transaction } from 'kysely';
import { ValidationError } from '../errors.js';
import type { DataLayer } from '../store/data-layer.js';
import type { KeyedJobContext } from './job-context.js';

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
 * transactions: a group that fails rolls back whole, each job to blame runs again alone and the
 * others together, so `transaction` may run more than once for one key, one run committing),
 * unless turned off with
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
 * A database-only handler written in a data layer of your own (Prisma, Drizzle, TypeORM,
 * node-postgres, postgres.js; see {@link DataLayer}): the whole job is one transaction of that
 * data layer, `effect(tx, ctx)`, which also claims and completes the key. The same contract and
 * the same fast path as a {@link DatabaseOnlyHandler}; never in a group (each data layer's
 * transaction has a connection of its own). Made by `databaseOnly(dataLayer, effect)`.
 */
export interface DataLayerHandler<P = unknown, R = unknown, C = DatabaseOnlyContext<P>, Tx = unknown> {
  /** The data layer whose transaction the job is. */
  readonly dataLayer: DataLayer<Tx>;
  /** The job: its effects through `tx`, only; its return value is stored under the key. */
  readonly effect: (tx: Tx, ctx: C) => Promise<R>;
}

/**
 * A handler of any broker's consumer: a function (`async (ctx) => result`, which may call other
 * systems, `ctx.step` and `ctx.transaction`), a {@link DatabaseOnlyHandler}, or a
 * {@link DataLayerHandler}.
 */
export type KeyedJobHandler<P = unknown, R = unknown, M = unknown> =
  | ((ctx: KeyedJobContext<P, M>) => Promise<R>)
  | DatabaseOnlyHandler<P, R, DatabaseOnlyContext<P, M>>
  | DataLayerHandler<P, R, DatabaseOnlyContext<P, M>, any>;

/**
 * A {@link DatabaseOnlyHandler} from its transaction: `databaseOnly(async (tx, ctx) => …)`; or,
 * given a data layer first, a {@link DataLayerHandler}: `databaseOnly(prismaLayer, async (tx, ctx)
 * => …)`. Nothing but the object itself; it lets `ctx` be typed where the handler is written.
 * With a data layer, type `ctx` on the function (`async (tx, ctx: DatabaseOnlyContext<Charge>)
 * => …`) rather than with type arguments, so that `tx`'s type is inferred from the data layer.
 */
export function databaseOnly<P = unknown, R = unknown, C = DatabaseOnlyContext<P>>(
  transaction: (tx: Transaction<any>, ctx: C) => Promise<R>,
): DatabaseOnlyHandler<P, R, C>;
export function databaseOnly<P = unknown, R = unknown, C = DatabaseOnlyContext<P>, Tx = unknown>(
  dataLayer: DataLayer<Tx>,
  effect: (tx: Tx, ctx: C) => Promise<R>,
): DataLayerHandler<P, R, C, Tx>;
export function databaseOnly(
  first: DataLayer<unknown> | ((tx: Transaction<any>, ctx: unknown) => Promise<unknown>),
  effect?: (tx: unknown, ctx: unknown) => Promise<unknown>,
): DatabaseOnlyHandler<any, any, any> | DataLayerHandler<any, any, any, any> {
  if (typeof first === 'function') return { transaction: first };
  if (!isDataLayer(first) || typeof effect !== 'function') {
    throw new ValidationError('INVALID_OPTIONS', 'handler', 'databaseOnly takes a transaction function, or a data layer and an effect function.');
  }
  return { dataLayer: first, effect };
}

/** True for a {@link DataLayer}: an object with a `transaction` and a `driverError` function. */
export function isDataLayer(value: unknown): value is DataLayer<unknown> {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as { transaction?: unknown }).transaction === 'function' &&
    typeof (value as { driverError?: unknown }).driverError === 'function'
  );
}

/** True for a {@link DataLayerHandler}: a data layer and an effect function. */
export function isDataLayerHandler(handler: unknown): handler is DataLayerHandler<any, any, any, any> {
  return (
    typeof handler === 'object' &&
    handler !== null &&
    isDataLayer((handler as { dataLayer?: unknown }).dataLayer) &&
    typeof (handler as { effect?: unknown }).effect === 'function'
  );
}

/**
 * True for a database-only handler of either kind: a {@link DatabaseOnlyHandler} (an object whose
 * `transaction` is a function) or a {@link DataLayerHandler}.
 */
export function isDatabaseOnlyHandler(handler: unknown): handler is DatabaseOnlyHandler<any, any, any> | DataLayerHandler<any, any, any, any> {
  return (
    (typeof handler === 'object' && handler !== null && typeof (handler as { transaction?: unknown }).transaction === 'function') ||
    isDataLayerHandler(handler)
  );
}

/**
 * A database-only handler of either kind whose `ctx` is made from the consumer's by `narrow`,
 * in the same form (a broker's adapter adds its own fields, or notes the run's attempt).
 */
export function withDatabaseOnlyContext<C, D, R>(
  handler: DatabaseOnlyHandler<any, R, D> | DataLayerHandler<any, R, D, any>,
  narrow: (ctx: C) => D,
): DatabaseOnlyHandler<any, R, C> | DataLayerHandler<any, R, C, any> {
  if (isDataLayerHandler(handler)) {
    const layered = handler as DataLayerHandler<any, R, D, any>;
    return { dataLayer: layered.dataLayer, effect: (tx, ctx) => layered.effect(tx, narrow(ctx)) };
  }
  const plain = handler as DatabaseOnlyHandler<any, R, D>;
  return { transaction: (tx, ctx) => plain.transaction(tx, narrow(ctx)) };
}

/** What makes a handler of either form, for error messages. */
export const HANDLER_FORMS =
  'a function (async (ctx) => result) or a database-only handler ({ transaction: async (tx, ctx) => result }, or databaseOnly(dataLayer, async (tx, ctx) => result))';

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

/**
 * A database-only handler as a function of the full context: its transaction is the job's one
 * `ctx.transaction`, and it sees the context without `transaction` and `step`, at run time as in
 * its type.
 */
export function runsInOneTransaction<P, R, M>(handler: DatabaseOnlyHandler<P, R, DatabaseOnlyContext<P, M>> | DataLayerHandler<P, R, DatabaseOnlyContext<P, M>, any>) {
  return (ctx: KeyedJobContext<P, M>): Promise<R> => {
    const { data, key, scope, fence, attempt, message, signal } = ctx;
    const narrowed: DatabaseOnlyContext<P, M> = { data, key, scope, fence, attempt, message, signal };
    if (isDataLayerHandler(handler)) return ctx.transaction(handler.dataLayer, (tx) => handler.effect(tx, narrowed));
    return ctx.transaction((tx) => (handler as DatabaseOnlyHandler<P, R, DatabaseOnlyContext<P, M>>).transaction(tx, narrowed));
  };
}
