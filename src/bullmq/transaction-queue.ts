import { PostgresConnection, PostgresQueueBackend, Queue, type BackendFactory, type PgPool, type WorkerOptions } from 'bullmq';
import type { Kysely } from 'kysely';
import { QueueTransactionStore } from '../store/queue-transaction-store.js';
import type { AnyQueue } from './queue-connection.js';

/**
 * BullMQ's PostgreSQL connection, bound to one caller's transaction: every statement BullMQ's
 * backend sends runs on that transaction (in the queue's schema), so what it writes commits or
 * rolls back with the caller's own rows. It never connects, migrates or LISTENs: the queue's own
 * connection did (or does) that; this one only carries statements.
 *
 * Depends on BullMQ's PostgreSQL backend sending every statement through `connection.pool.query`
 * (BullMQ 6.7; package.json pins `>=6.7.0 <7`, and test/postgres-queue-backend.test.ts holds
 * the coupling).
 */
class TransactionBoundConnection extends PostgresConnection {
  constructor(tx: Kysely<any>, store: QueueTransactionStore) {
    const pool = {
      query: (text: string, parameters?: unknown[]) => store.query(tx, text, parameters ?? []),
      connect: () => Promise.reject(new Error('a transaction-bound BullMQ connection lends no client')),
      end: () => Promise.resolve(),
      on: () => pool,
    };
    super(pool as unknown as PgPool);
    // BullMQ takes a given pool's schema to be its default; this connection's is the queue's.
    Object.defineProperty(this, 'schema', { value: store.queueSchema });
  }

  override waitUntilReady(): Promise<void> {
    return Promise.resolve();
  }

  override close(): Promise<void> {
    return Promise.resolve();
  }
}

/**
 * BullMQ's functions a move of a job to completed calls on the Postgres backend: the move, then,
 * with the worker's `metrics` option, the metrics collected. Each reads and writes the queue's
 * rows of that job (and the queue's counters), nothing a job's statements touch.
 */
const FINISHING_CALLS: ReadonlySet<string> = new Set(['move_to_completed', 'collect_metrics']);

/**
 * A BullMQ `Queue` named `name` whose statements run in `tx`, on the Postgres backend, for one
 * transactional enqueue: the jobs it adds exist if and only if `tx` commits. It leaves the
 * queue's metadata alone (`skipMetasUpdate`): writing it would make every caller's transaction
 * touch one shared row. Close it when done (it closes nothing of the transaction's).
 * `finishing`, for a worker that moves its job to completed on it as the last statements of the
 * job's transaction (those go as the job's group postludes): the worker's options the move applies.
 */
export function openTransactionQueue(name: string, tx: Kysely<any>, queueSchema: string, finishing?: FinishedJobOptions): AnyQueue {
  const store = new QueueTransactionStore(queueSchema, finishing && FINISHING_CALLS);
  const connection = new TransactionBoundConnection(tx, store);
  const factory: BackendFactory<PostgresQueueBackend, unknown> = (queueName, opts) => new PostgresQueueBackend(connection, queueName, opts as never, false);
  // BullMQ's move of a job to completed reads the worker's options from its queue's.
  return new Queue(name, { connection, skipMetasUpdate: true, ...finishing } as never, factory) as unknown as AnyQueue;
}

/** A worker's options that BullMQ's move of a job to completed applies (read from the queue it runs on). */
export type FinishedJobOptions = Pick<WorkerOptions, 'removeOnComplete' | 'metrics'>;
