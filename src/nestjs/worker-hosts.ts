import type { Transaction } from 'kysely';
import type { DatabaseOnlyJobContext, IdempotentWorker, JobContext } from '../bullmq/idempotent-worker.js';

/** The worker the module started for each processor, set once the application has bootstrapped. */
const workers = new WeakMap<object, IdempotentWorker<any, any>>();

/** Gives `host` the worker the module started for it. */
export function attachWorker(host: object, worker: IdempotentWorker<any, any>): void {
  workers.set(host, worker);
}

function workerOf<P, R>(host: object): IdempotentWorker<P, R> {
  const worker = workers.get(host);
  if (!worker) {
    throw new Error(
      `${host.constructor.name}'s worker has not started yet: the module starts processors' workers once the application has bootstrapped (after every module's onModuleInit); use it from onApplicationBootstrap on.`,
    );
  }
  return worker;
}

/**
 * The class a processor extends (as `@nestjs/bullmq`'s `WorkerHost`): `process(ctx)` runs once
 * per idempotency key with the library's context (`ctx.key`, `ctx.data`, `ctx.transaction`,
 * `ctx.step`, `ctx.signal`), and what it returns is stored under the key and replayed to
 * duplicates. Decorate the class with {@link IdempotentProcessor}; its constructor takes its
 * dependencies by injection as any provider's does.
 *
 * @example
 * ```ts
 * import type { EntityManager } from 'typeorm';
 * import type { DataLayer, JobContext } from 'idempotent-jobs';
 * import { IdempotentProcessor, IdempotentWorkerHost, InjectDataLayer } from 'idempotent-jobs/nestjs';
 *
 * declare const gateway: { charge(orderId: string, cents: number, options: { idempotencyKey: string }): Promise<{ id: string }> };
 *
 * @IdempotentProcessor('payments', { concurrency: 4 })
 * export class PaymentsProcessor extends IdempotentWorkerHost<{ orderId: string; cents: number }, { chargeId: string }> {
 *   constructor(@InjectDataLayer() private readonly orm: DataLayer<EntityManager>) {
 *     super();
 *   }
 *
 *   async process(ctx: JobContext<{ orderId: string; cents: number }>) {
 *     // Recorded once: a retry after a crash reads the charge back instead of charging again.
 *     const charge = await ctx.step('charge', (step) => gateway.charge(ctx.data.orderId, ctx.data.cents, { idempotencyKey: step.stepKey }));
 *     // The ledger row and the key's completion commit in one TypeORM transaction.
 *     return ctx.transaction(this.orm, async (manager) => {
 *       await manager.query('insert into ledger (order_id, cents, charge_id) values ($1, $2, $3)', [ctx.data.orderId, ctx.data.cents, charge.id]);
 *       return { chargeId: charge.id };
 *     });
 *   }
 * }
 * ```
 */
export abstract class IdempotentWorkerHost<P = unknown, R = unknown> {
  /** The job, once per key: its return value is stored and replayed to duplicates. */
  abstract process(ctx: JobContext<P>): Promise<R>;

  /** The worker running this processor (its events, `bullWorker`); there from `onApplicationBootstrap` on. */
  get worker(): IdempotentWorker<P, R> {
    return workerOf<P, R>(this);
  }
}

/**
 * The class a database-only processor extends: the whole job is `transaction(tx, ctx)`, one
 * transaction that also claims and completes the key (the fast path, and group commit where the
 * keys have it). `tx` is the transaction of `forRoot({ dataLayer })`'s data layer (TypeORM's
 * `EntityManager`, a Prisma transaction, …), or the keys' Kysely transaction without one. It
 * must touch nothing outside this database: a retry may run it again after a rollback.
 *
 * @example
 * ```ts
 * import type { EntityManager } from 'typeorm';
 * import type { DatabaseOnlyJobContext } from 'idempotent-jobs';
 * import { DatabaseOnlyWorkerHost, IdempotentProcessor } from 'idempotent-jobs/nestjs';
 *
 * @IdempotentProcessor('ledger')
 * export class LedgerProcessor extends DatabaseOnlyWorkerHost<{ cents: number }, { booked: number }, EntityManager> {
 *   async transaction(manager: EntityManager, ctx: DatabaseOnlyJobContext<{ cents: number }>) {
 *     await manager.query('insert into ledger (key, cents) values ($1, $2)', [ctx.key, ctx.data.cents]);
 *     return { booked: ctx.data.cents };
 *   }
 * }
 * ```
 */
export abstract class DatabaseOnlyWorkerHost<P = unknown, R = unknown, Tx = Transaction<any>> {
  /** The job as one transaction of the data layer: its return value is stored under the key. */
  abstract transaction(tx: Tx, ctx: DatabaseOnlyJobContext<P>): Promise<R>;

  /** The worker running this processor (its events, `bullWorker`); there from `onApplicationBootstrap` on. */
  get worker(): IdempotentWorker<P, R> {
    return workerOf<P, R>(this);
  }
}
