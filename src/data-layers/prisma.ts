import type { DataLayer, RunStatement } from '../store/data-layer.js';
import { unwrapDriverError } from './driver-error.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/**
 * What the adapter needs of a Prisma client: interactive transactions whose client runs raw
 * statements. Any generated `PrismaClient` (with the `pg` driver adapter, `@prisma/adapter-pg`,
 * or the query engine) has it.
 */
export interface PrismaLikeClient<Tx extends PrismaLikeTransaction> {
  /** Prisma's interactive transaction, `prisma.$transaction(async (tx) => …, options)`. */
  $transaction<T>(fn: (tx: Tx) => Promise<T>, options?: { isolationLevel?: any; maxWait?: number; timeout?: number }): Promise<T>;
}

/** What the adapter needs of a Prisma interactive transaction's client: `$queryRawUnsafe`. */
export interface PrismaLikeTransaction {
  /** Prisma's `tx.$queryRawUnsafe(sql, ...values)`, `$1`, `$2`, … in `sql`. */
  $queryRawUnsafe<T = unknown>(query: string, ...values: any[]): PromiseLike<T>;
}

/** The transaction client type of a Prisma client (`any` for a client typed `any`, as a dynamically imported one is). */
export type PrismaTransactionOf<C> = 0 extends 1 & C ? any : C extends PrismaLikeClient<infer Tx> ? Tx : never;

/** Options of {@link prismaDataLayer}. */
export interface PrismaDataLayerOptions {
  /** How errors name the data layer. @defaultValue `'Prisma'` */
  readonly name?: string;
  /**
   * Longest wait for a connection to start the interactive transaction (Prisma's `maxWait`).
   * @defaultValue Prisma's (2 s)
   */
  readonly maxWaitMs?: number;
  /**
   * Longest an interactive transaction may run before Prisma rolls it back (Prisma's
   * `timeout`): the whole effect, and the completion. The completion of a transaction that ran
   * past it fails, so nothing commits and the job is retried.
   * @defaultValue `30_000` (Prisma's own default is 5 s)
   */
  readonly timeoutMs?: number;
}

/**
 * Your Prisma client as a data layer: the effect runs in an interactive transaction,
 * `prisma.$transaction(async (tx) => …, { isolationLevel: 'ReadCommitted' })`, on its
 * transaction client, and the key's fenced completion runs last in it through
 * `tx.$queryRawUnsafe`. Works with Prisma's driver adapter for `pg` (`@prisma/adapter-pg`).
 *
 * @example
 * ```ts
 * import { databaseOnly, type DatabaseOnlyContext } from 'idempotent-jobs';
 * import { prismaDataLayer } from 'idempotent-jobs/prisma';
 *
 * // prisma: your generated PrismaClient, e.g. new PrismaClient({ adapter: new PrismaPg({ connectionString }) })
 * export default databaseOnly(prismaDataLayer(prisma), async (tx, ctx: DatabaseOnlyContext<{ orderId: number; cents: number }>) => {
 *   await tx.ledger.create({ data: { orderId: ctx.data.orderId, cents: ctx.data.cents } });
 *   return { booked: true };
 * });
 * ```
 */
export function prismaDataLayer<C extends PrismaLikeClient<any>>(prisma: C, options: PrismaDataLayerOptions = {}): DataLayer<PrismaTransactionOf<C>> {
  refuseUnknownOptions(options, optionNames<PrismaDataLayerOptions>()(['name', 'maxWaitMs', 'timeoutMs']), 'prismaDataLayer(prisma, options)');
  const transactionOptions = {
    isolationLevel: 'ReadCommitted',
    timeout: options.timeoutMs ?? 30_000,
    ...(options.maxWaitMs === undefined ? {} : { maxWait: options.maxWaitMs }),
  };
  return {
    name: options.name ?? 'Prisma',
    transaction(body) {
      return prisma.$transaction(
        (tx: PrismaTransactionOf<C>) =>
          body(tx, statementsOn(tx as PrismaLikeTransaction)),
        transactionOptions,
      );
    },
    driverError: prismaDriverError,
    statementsOn: (tx) => statementsOn(tx as PrismaLikeTransaction),
  };
}

/** The raw-SQL call on a Prisma transaction client. */
function statementsOn(tx: PrismaLikeTransaction): RunStatement {
  return async (text, parameters) => {
    try {
      return { rows: await tx.$queryRawUnsafe<Array<Record<string, unknown>>>(text, ...parameters) };
    } catch (error) {
      if (isVoidResult(error)) return { rows: [] };
      throw error;
    }
  };
}

/** The driver adapter's error inside a Prisma error: `meta.driverAdapterError`, or the error itself. */
function driverAdapterErrorOf(error: unknown): { cause?: Record<string, unknown> } | undefined {
  let current: unknown = error;
  for (let depth = 0; depth < 8 && current !== null && typeof current === 'object'; depth++) {
    const meta = (current as { meta?: { driverAdapterError?: unknown } }).meta;
    if (meta?.driverAdapterError && typeof meta.driverAdapterError === 'object') return meta.driverAdapterError as { cause?: Record<string, unknown> };
    if ((current as { name?: unknown }).name === 'DriverAdapterError') return current as { cause?: Record<string, unknown> };
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

/**
 * A statement whose one column is `void` (the store's functions that return nothing, the fenced
 * completion among them): Postgres ran it and answered; only Prisma's driver adapter cannot
 * turn a `void` column into a value, and says so after the answer came. No rows to read.
 */
function isVoidResult(error: unknown): boolean {
  const cause = driverAdapterErrorOf(error)?.cause;
  return cause?.kind === 'UnsupportedNativeDataType' && cause.type === 'void';
}

/** The adapter's kinds for a connection that failed, as the socket error codes the store classifies. */
const CONNECTION_KINDS: Record<string, string> = {
  ConnectionClosed: 'ECONNRESET',
  SocketTimeout: 'ETIMEDOUT',
  DatabaseNotReachable: 'ECONNREFUSED',
};

/**
 * The driver's error inside a Prisma error. Prisma's driver adapter keeps, in
 * `meta.driverAdapterError.cause`, the pg error's SQLSTATE (`originalCode`), message and
 * severity, or a kind for a socket that failed: rebuilt here as an error with that `code`, so a
 * terminated backend (57P01) or a dropped connection is a transient fault.
 */
export function prismaDriverError(error: unknown): unknown {
  const cause = driverAdapterErrorOf(error)?.cause;
  if (cause) {
    if (typeof cause.originalCode === 'string') {
      return Object.assign(new Error(String(cause.originalMessage ?? cause.message ?? cause.originalCode)), {
        code: cause.originalCode,
        ...(typeof cause.severity === 'string' ? { severity: cause.severity } : {}),
      });
    }
    const kind = typeof cause.kind === 'string' ? cause.kind : '';
    if (kind in CONNECTION_KINDS) return Object.assign(new Error(`Prisma's driver adapter: ${kind}`), { code: CONNECTION_KINDS[kind] });
    if (kind === 'TooManyConnections') return Object.assign(new Error(String(cause.cause ?? kind)), { code: '53300' });
  }
  return unwrapDriverError(error);
}
