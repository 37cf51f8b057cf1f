import { Job, type WorkerOptions } from 'bullmq';
import type { Transaction } from 'kysely';
import type { KeyedJobContext, TransactionOptions } from '../consumer/job-context.js';
import { serializeResult } from '../protocol/validate.js';
import type { DataLayer } from '../store/data-layer.js';
import { openTransactionQueue, type FinishedJobOptions } from './transaction-queue.js';
import { QueueLockLostError, isLockRefusal } from './queue-lock-lost-error.js';

/** What finishing a job in its effect's transaction needs to know of the run. */
export interface EffectRun {
  readonly message: Job;
  readonly scope: string;
  readonly key: string;
}

/**
 * Finishes BullMQ jobs inside their effect's transaction (the Postgres backend's
 * `finishJobInEffect`): BullMQ's own move to completed, run on the effect's Kysely transaction,
 * so the job's completion commits with the effect or not at all.
 */
export class JobFinishInEffect {
  readonly #queue: string;
  readonly #schema: string;
  readonly #tokenOf: (job: Job) => string | undefined;
  readonly #maxResultBytes: number;
  readonly #finishedJobs: FinishedJobOptions;
  /** Jobs whose move to completed ran in an effect transaction (it committed if the run completed). */
  readonly #finished = new WeakSet<Job>();

  /**
   * `maxResultBytes`: the keys' bound on a stored result. `worker`: the worker's options, whose
   * `removeOnComplete` and `metrics` BullMQ's move applies as the worker's own move would.
   */
  constructor(queue: string, schema: string, tokenOf: (job: Job) => string | undefined, maxResultBytes: number, worker: Pick<WorkerOptions, 'removeOnComplete' | 'metrics'> = {}) {
    this.#queue = queue;
    this.#schema = schema;
    this.#tokenOf = tokenOf;
    this.#maxResultBytes = maxResultBytes;
    this.#finishedJobs = {
      ...(worker.removeOnComplete !== undefined ? { removeOnComplete: worker.removeOnComplete } : {}),
      ...(worker.metrics !== undefined ? { metrics: worker.metrics } : {}),
    };
  }

  /**
   * Moves the run's job to completed on `tx`, with the token this worker holds it under. Refused
   * because the lock was lost, it throws a {@link QueueLockLostError}, which rolls the effect
   * back and defers like a store fault (no attempt used, the key released) instead of failing
   * the key.
   */
  async finish(tx: Transaction<any>, run: EffectRun, result: unknown): Promise<void> {
    // The key stores the result too, once the move is done: a result it cannot store (not JSON,
    // a NUL, too big) is refused first, as the key's own error, which fails the job once. Left to
    // BullMQ's move, it failed in the middle of the transaction as any error, and each attempt
    // ran the effect again to fail the same way.
    serializeResult(run.scope, run.key, result, this.#maxResultBytes);
    const job = run.message;
    const queue = openTransactionQueue(this.#queue, tx, this.#schema, this.#finishedJobs);
    try {
      const bound = Job.fromJSON(queue as never, job.asJSON(), job.id);
      await bound.moveToCompleted(result, this.#tokenOf(job) ?? '', false);
      job.returnvalue = result;
      job.finishedOn = bound.finishedOn;
    } catch (error) {
      if (isLockRefusal(error)) throw new QueueLockLostError(run.scope, run.key, job.id, { cause: error });
      throw error;
    } finally {
      await queue.close();
    }
    this.#finished.add(job);
  }

  /** Whether `job`'s move to completed ran in its effect's transaction (so BullMQ must not move it again). */
  finished(job: Job): boolean {
    return this.#finished.has(job);
  }

  /**
   * `ctx.transaction` that also finishes the job in the effect's transaction: `ctx.transaction(fn)`
   * runs on the worker's Kysely transaction, where BullMQ's move to completed can join it;
   * `ctx.transaction(dataLayer, fn)` runs on the data layer's own, which BullMQ cannot reach, so
   * the job is then finished as BullMQ finishes any job, after the commit.
   */
  transactionOf<P>(ctx: KeyedJobContext<P, Job>): KeyedJobContext<P, Job>['transaction'] {
    // `second` is the data layer's callback, or the options of `ctx.transaction(fn, options)`.
    const transaction = (first: DataLayer<unknown> | ((tx: Transaction<any>) => Promise<unknown>), second?: unknown) => {
      if (typeof first !== 'function') return ctx.transaction(first, second as (tx: unknown) => Promise<unknown>);
      const finishing = async (tx: Transaction<any>) => {
        const result = await first(tx);
        await this.finish(tx, ctx, result);
        return result;
      };
      return ctx.transaction(finishing, second as TransactionOptions | undefined);
    };
    return transaction as KeyedJobContext<P, Job>['transaction'];
  }
}
