import type { JobsOptions } from 'bullmq';
import { KeyReusedError } from '../errors.js';
import type { Fingerprinter } from '../fingerprint.js';
import { IdempotentProducer } from './idempotent-producer.js';
import type { QueueConnectionOptions } from './queue-connection.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';
import { QUEUE_CONNECTION_OPTION_NAMES, assertQueueBackend } from './queue-connection.js';

/** The job of one schedule tick (the scheduler's `ScheduledTick` has these fields and more). */
export interface TickJob {
  /** The BullMQ queue. */
  readonly queue: string;
  /** The job name. */
  readonly name: string;
  /** The idempotency scope, `schedule:<name>`. */
  readonly scope: string;
  /** The idempotency key, the tick's time. */
  readonly key: string;
  /** The payload. */
  readonly data: unknown;
}

/** Options of {@link BullmqTickEnqueuer}. */
export interface BullmqTickEnqueuerOptions extends QueueConnectionOptions {
  /** Must match the workers' fingerprinter. @defaultValue SHA-256 of canonical JSON */
  readonly fingerprint?: Fingerprinter;
  /** BullMQ options of every tick's job (attempts, backoff, removeOnComplete…) in a queue without options of its own in {@link queueJobOptions}. @defaultValue none (BullMQ's defaults) */
  readonly defaultJobOptions?: Omit<JobsOptions, 'jobId'>;
  /**
   * BullMQ options of the tick jobs of each queue named, instead of {@link defaultJobOptions}:
   * each schedule's ticks get the retry policy of its queue, `{ reports: { attempts: 5 } }`.
   * @defaultValue `{}`
   */
  readonly queueJobOptions?: Readonly<Record<string, Omit<JobsOptions, 'jobId'>>>;
}

/**
 * The scheduler's way into BullMQ (it satisfies the scheduler's `TickEnqueuer`): adds each tick
 * through an {@link IdempotentProducer} of the tick's queue, so the job id is the one derived
 * from the tick's scope and key, and a second add of the same tick is a duplicate. Keeps one
 * producer per queue; {@link close} closes them.
 *
 * @example
 * ```ts
 * import { BullmqTickEnqueuer, Scheduler } from 'idempotent-jobs/process';
 *
 * const enqueuer = new BullmqTickEnqueuer({
 *   connection: { url: 'redis://127.0.0.1:6379' },
 *   queueJobOptions: { reports: { attempts: 5, backoff: { type: 'exponential', delay: 1_000 } } },
 * });
 * const report = await new Scheduler({ db, enqueuer }).runOnce();
 * console.log(`${report.enqueued} ticks enqueued`);
 * await enqueuer.close();
 * ```
 */
export class BullmqTickEnqueuer {
  readonly #options: BullmqTickEnqueuerOptions;
  readonly #producers = new Map<string, IdempotentProducer>();

  constructor(options: BullmqTickEnqueuerOptions) {
    refuseUnknownOptions(
      options,
      optionNames<BullmqTickEnqueuerOptions>()([...QUEUE_CONNECTION_OPTION_NAMES, 'fingerprint', 'defaultJobOptions', 'queueJobOptions']),
      'new BullmqTickEnqueuer(options)',
    );
    assertQueueBackend(options, 'new BullmqTickEnqueuer(options)');
    this.#options = Object.freeze({ ...options });
  }

  /**
   * Adds the tick's job. `'duplicate'` when the queue already has it, also when it has it with
   * the payload of an earlier definition of the schedule (a tick enqueued before the schedule
   * changed keeps its payload; the new one applies from the next tick).
   */
  async enqueue(tick: TickJob): Promise<'added' | 'duplicate'> {
    try {
      const result = await this.#producer(tick.queue).enqueue({ name: tick.name, scope: tick.scope, key: tick.key, data: tick.data });
      return result.status === 'added' ? 'added' : 'duplicate';
    } catch (error) {
      if (error instanceof KeyReusedError) return 'duplicate';
      throw error;
    }
  }

  /** Closes the producers' queues. */
  async close(): Promise<void> {
    const producers = [...this.#producers.values()];
    this.#producers.clear();
    await Promise.all(producers.map((producer) => producer.close()));
  }

  #producer(queue: string): IdempotentProducer {
    let producer = this.#producers.get(queue);
    if (!producer) {
      const { fingerprint, defaultJobOptions, queueJobOptions, ...connection } = this.#options;
      const jobOptions = queueJobOptions && Object.hasOwn(queueJobOptions, queue) ? queueJobOptions[queue] : defaultJobOptions;
      // The scheduler runs for as long as its process: its producers outlast an outage at their start too.
      producer = new IdempotentProducer({ ...connection, queue, fingerprint, defaultJobOptions: jobOptions, enqueueInTransaction: 'outbox', startupWaitMs: Infinity });
      this.#producers.set(queue, producer);
    }
    return producer;
  }
}
