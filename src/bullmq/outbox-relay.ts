import type { JobsOptions } from 'bullmq';
import type { Kysely } from 'kysely';
import type { Logger } from 'pino';
import type { FaultHook } from '../fault-hook.js';
import { sha256Fingerprint } from '../fingerprint.js';
import { relayMetrics } from './relay-metrics.js';
import { isTransientStoreError } from '../store/pg-errors.js';
import { OutboxStore } from '../store/outbox-store.js';
import { RelayBatchTracing } from './relay-tracing.js';
import { addOrReplaceFinished, type JobToAdd } from './add-or-replace-finished.js';
import { fingerprintOfJob } from './job-fingerprint.js';
import { QueuesByName } from './queues-by-name.js';
import type { QueueConnectionOptions } from './queue-connection.js';
import type { OutboxRow } from '../store/records.js';
import { defaultLogger } from '../default-logger.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';
import { QUEUE_CONNECTION_OPTION_NAMES, assertQueueBackend } from './queue-connection.js';

/** Options of {@link OutboxRelay}. */
export interface OutboxRelayOptions extends QueueConnectionOptions {
  /** Database holding the outbox. */
  readonly db: Kysely<any>;
  /** Postgres schema of the outbox table. @defaultValue `'idempotent_jobs'` */
  readonly schema?: string;
  /** Rows moved per transaction. @defaultValue `100` */
  readonly batchSize?: number;
  /** Pause between polls when the outbox is empty, and after a failed batch. @defaultValue `200` */
  readonly pollIntervalMs?: number;
  /**
   * How long a row whose job id is held by another request's pending job waits before it is
   * tried again (meanwhile the relay moves the rows behind it). @defaultValue `1_000`
   */
  readonly heldRowRetryMs?: number;
  /** Structured logger (batch errors, held rows). @defaultValue pino at `LOG_LEVEL`, else `warn` */
  readonly logger?: Logger;
  /** Chaos testing only. @defaultValue unset */
  readonly faultHook?: FaultHook;
}

const OUTBOX_RELAY_OPTION_NAMES = optionNames<OutboxRelayOptions>()([
  ...QUEUE_CONNECTION_OPTION_NAMES,
  'db', 'schema', 'batchSize', 'pollIntervalMs', 'heldRowRetryMs', 'logger', 'faultHook',
]);

/**
 * Moves committed outbox rows into BullMQ. Each batch: lock unsent rows (`SKIP LOCKED`, so
 * relays can run side by side), add them to BullMQ under their deterministic job ids, mark
 * them sent, commit. A crash between the add and the commit leaves the rows unsent; the next
 * relay adds them again, which BullMQ ignores while the job exists, and which the worker's
 * claim turns into a replay if it does not. Delivery is at least once; the effect, once.
 *
 * No row is marked sent unless BullMQ holds its job or one with the same fingerprint (job name
 * and payload). A job id depends on scope and key only, so it may still hold the finished job
 * of an earlier request with the same key and another payload (its key record expired since):
 * that job is removed and the row's added. If the id holds a pending job with another
 * payload, the row stays unsent and is tried again after `heldRowRetryMs`, until that job has
 * finished. A failed batch (database or Redis unreachable, a connection cut) is rolled back,
 * logged, and retried at the next poll.
 *
 * @example
 * ```ts
 * import { OutboxRelay } from 'idempotent-jobs';
 *
 * // One or more per deployment: relays lock their rows with SKIP LOCKED, so they can run side by side.
 * const relay = new OutboxRelay({ db, connection: { host: '127.0.0.1', port: 6379 }, batchSize: 500 });
 * relay.start();
 * process.once('SIGTERM', () => {
 *   void relay.stop();
 * });
 * ```
 */
export class OutboxRelay {
  readonly #options: OutboxRelayOptions;
  readonly #queues: QueuesByName;
  readonly #log: Logger;
  /** Rows held by another request's pending job, by row id: when to try each again (this process's clock). */
  readonly #heldUntil = new Map<string, number>();
  #running: Promise<void> | undefined;
  #stopping = false;
  #wake: (() => void) | undefined;

  constructor(options: OutboxRelayOptions) {
    refuseUnknownOptions(options, OUTBOX_RELAY_OPTION_NAMES, 'new OutboxRelay(options)');
    assertQueueBackend(options, 'new OutboxRelay(options)');
    this.#options = Object.freeze({ ...options });
    this.#log = (options.logger ?? defaultLogger()).child({ component: 'outbox-relay' });
    this.#queues = new QueuesByName({
      ...options,
      onError: (error, queue) => this.#log.warn({ err: error, queue }, 'queue connection error; the relay retries its batch'),
    });
    // The series exist from the start, so that a rate or increase() sees the first error.
    const schema = options.schema ?? 'idempotent_jobs';
    relayMetrics().relayed.inc({ schema }, 0);
    relayMetrics().errors.inc({ schema }, 0);
  }

  /**
   * Relays one batch; returns how many rows were delivered. Throws what failed the batch (it
   * was rolled back, and its rows stay unsent); {@link OutboxRelay.start}'s loop logs that and
   * tries again instead.
   */
  async relayOnce(): Promise<number> {
    const schema = this.#options.schema ?? 'idempotent_jobs';
    const outbox = new OutboxStore(schema);
    const now = Date.now();
    for (const [id, until] of this.#heldUntil) if (until <= now) this.#heldUntil.delete(id);
    // Each row's trace goes on from the outbox insert through the relay into its job.
    let tracing: RelayBatchTracing | undefined;
    const { sent, held } = await this.#options.db
      .transaction()
      .execute(async (tx) => {
        const rows = await outbox.lockUnsent(tx, this.#options.batchSize ?? 100, [...this.#heldUntil.keys()]);
        const delivered: OutboxRow[] = [];
        const waiting: OutboxRow[] = [];
        if (rows.length === 0) return { sent: delivered, held: waiting };
        tracing = new RelayBatchTracing(rows);
        const byQueue = new Map<string, OutboxRow[]>();
        for (const row of rows) byQueue.set(row.queue, [...(byQueue.get(row.queue) ?? []), row]);
        for (const [queueName, queueRows] of byQueue) {
          const data = tracing.send(queueName, queueRows);
          const jobs = queueRows.map((row, i) => jobOfRow(row, data[i]));
          const outcomes = await addOrReplaceFinished(this.#queues.get(queueName), jobs, sha256Fingerprint, { inIdOrder: this.#options.backend === 'postgres' });
          tracing.sent(queueName, outcomes);
          queueRows.forEach((row, i) => (outcomes[i] === 'held-by-other' ? waiting : delivered).push(row));
        }
        if (this.#options.faultHook) await this.#options.faultHook('relay-after-add', {});
        await outbox.markSent(tx, delivered.map((row) => row.id));
        return { sent: delivered, held: waiting };
      })
      .catch((error: unknown) => {
        tracing?.end(error);
        throw error;
      });
    tracing?.end();
    for (const row of held) {
      if (!this.#heldUntil.has(row.id)) {
        this.#log.warn(
          { outboxRowId: row.id, queue: row.queue, jobId: row.jobId },
          `Outbox row ${row.id} waits: its job id ${row.jobId} in queue "${row.queue}" holds another request's job ` +
            '(same scope and key, another payload) that has not finished. The row is added once that job has finished; ' +
            "the worker then refuses it as reused while the key's record is kept.",
        );
      }
      this.#heldUntil.set(row.id, now + (this.#options.heldRowRetryMs ?? 1_000));
    }
    relayMetrics().relayed.inc({ schema }, sent.length); // counted once committed
    return sent.length;
  }

  /** Starts relaying in the background until {@link stop}. */
  start(): void {
    this.#running ??= this.#loop();
  }

  /** Stops after the current batch and closes the queues' connections. */
  async stop(): Promise<void> {
    this.#stopping = true;
    this.#wake?.();
    await this.#running;
    await this.#queues.close();
  }

  async #loop(): Promise<void> {
    while (!this.#stopping) {
      let relayed = 0;
      try {
        relayed = await this.relayOnce();
        if (relayed > 0) this.#log.debug({ relayed }, 'relayed outbox rows');
      } catch (error) {
        // Nothing is lost: the batch's transaction rolled back, so its rows are still unsent.
        if (isTransientStoreError(error)) this.#log.warn({ err: error }, 'outbox relay batch failed on a connection fault; retrying at the next poll');
        else this.#log.error({ err: error }, 'outbox relay batch failed; retrying at the next poll');
        relayMetrics().errors.inc({ schema: this.#options.schema ?? 'idempotent_jobs' });
      }
      if (relayed === 0 && !this.#stopping) {
        await new Promise<void>((resolve) => {
          this.#wake = resolve;
          setTimeout(resolve, this.#options.pollIntervalMs ?? 200).unref();
        });
      }
    }
  }
}

/**
 * A coalescing job's timestamp, which its worker takes for when it was sent (newer payloads win):
 * when its row was written, not when the relay adds it. Added late (a relay held up, a batch
 * failed) or added again (the relay's mark of the row as sent lost after its add, the first job
 * run and removed since), it is still older than what was enqueued after it, and is folded
 * instead of running after it. Other jobs keep the add's own timestamp, which tells the relay
 * whether the job an id holds is its add (`add-timestamps.ts`): two rows of one transaction may
 * share a job id, never a coalescing job's, which is each arrival's own.
 */
function sendTime(row: OutboxRow): { timestamp?: number } {
  const coalescing = (row.data as { coalesce?: unknown } | null)?.coalesce === true;
  return coalescing ? { timestamp: row.createdAtMs } : {};
}

/**
 * The job a row stands for (with `data`: the row's data carrying the relay's trace context);
 * its fingerprint is compared with whatever job its id holds.
 */
function jobOfRow(row: OutboxRow, data: unknown): JobToAdd {
  const job = { name: row.jobName, data };
  return {
    ...job,
    opts: { ...(row.opts as JobsOptions), jobId: row.jobId, ...sendTime(row) },
    // Rows are written by the producer under the wire contract; should one not be, it is
    // still told apart from any job whose data is.
    fingerprint: fingerprintOfJob(job, sha256Fingerprint) ?? sha256Fingerprint({ notWireContract: job }),
  };
}
