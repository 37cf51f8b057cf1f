import type { Job } from 'bullmq';
import type { KeyedJobContext } from '../consumer/job-context.js';
import type { KeyedJobRunnerOptions } from '../consumer/runner-options.js';
import { handlerForm, isDataLayerHandler, withDatabaseOnlyContext, type DataLayerHandler, type DatabaseOnlyContext, type DatabaseOnlyHandler } from '../consumer/database-only-handler.js';
import type { JobFinishInEffect } from './finish-in-effect.js';

/**
 * What a handler receives for one job whose key this worker holds: the broker-agnostic
 * context ({@link KeyedJobContext}, where `message` is the job too) and the BullMQ job.
 */
export interface JobContext<P = unknown> extends KeyedJobContext<P, Job> {
  /** The BullMQ job being run (the same object as `message`). */
  readonly job: Job;
}

/** The user's job handler. Its return value is stored (when it never calls `ctx.transaction`). */
export type JobHandler<P = unknown, R = unknown> = (ctx: JobContext<P>) => Promise<R>;

/** What a database-only handler's transaction receives: {@link JobContext} without `transaction` and `step`. */
export type DatabaseOnlyJobContext<P = unknown> = Omit<JobContext<P>, 'transaction' | 'step'>;

/** A database-only handler for the BullMQ worker (see {@link DatabaseOnlyHandler}). */
export type DatabaseOnlyJobHandler<P = unknown, R = unknown> = DatabaseOnlyHandler<P, R, DatabaseOnlyJobContext<P>>;

/** A database-only handler written in a data layer of your own, for the BullMQ worker (see {@link DataLayerHandler}). */
export type DataLayerJobHandler<P = unknown, R = unknown> = DataLayerHandler<P, R, DatabaseOnlyJobContext<P>, any>;

/**
 * The BullMQ worker's handler as the runner takes it: the context gains `job` (the same object as
 * `message`), and with `finishJobInEffect` the job's move to completed joins the effect's
 * transaction (not a data layer's: the ORM's transaction is out of BullMQ's reach, so that job is
 * finished as BullMQ finishes any job, after the commit).
 */
export function runnerHandler<P, R>(
  handler: JobHandler<P, R> | DatabaseOnlyJobHandler<P, R> | DataLayerJobHandler<P, R>,
  inEffect: JobFinishInEffect | undefined,
): KeyedJobRunnerOptions<P, R, Job>['handler'] {
  if (handlerForm(handler) === 'database-only') {
    if (isDataLayerHandler(handler)) {
      return withDatabaseOnlyContext(handler as DataLayerJobHandler<P, R>, (ctx: DatabaseOnlyContext<P, Job>) => ({ ...ctx, job: ctx.message }));
    }
    return {
      transaction: async (tx, ctx) => {
        const result = await (handler as DatabaseOnlyJobHandler<P, R>).transaction(tx, { ...ctx, job: ctx.message });
        await inEffect?.finish(tx, ctx, result);
        return result;
      },
    };
  }
  return (ctx: KeyedJobContext<P, Job>) =>
    (handler as JobHandler<P, R>)({
      ...ctx,
      job: ctx.message,
      transaction: inEffect ? inEffect.transactionOf(ctx) : ctx.transaction,
    });
}
