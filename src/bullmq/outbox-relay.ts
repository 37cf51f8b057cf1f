import type { ConnectionOptions, JobsOptions } from 'bullmq';
import type { Kysely } from 'kysely';
import { pino, type Logger } from 'pino';
import type { FaultHook } from '../fault-hook.js';
import { relayMetrics } from '../metrics/relay-metrics.js';
import { lockUnsentOutboxRows, markOutboxRowsSent } from '../store/sql/outbox.js';
import { QueuesByName } from './queues-by-name.js';

/** Options of {@link OutboxRelay}. */
export interface OutboxRelayOptions {
  /** Database holding the outbox. */
  readonly db: Kysely<any>;
  /** @defaultValue `'idempotent_jobs'` */
  readonly schema?: string;
  /** BullMQ connection for the queues the rows name. */
  readonly connection: ConnectionOptions;
  /** BullMQ key prefix. @defaultValue `'bull'` */
  readonly prefix?: string;
  /** Rows moved per transaction. @defaultValue `100` */
  readonly batchSize?: number;
  /** Pause between polls when the outbox is empty. @defaultValue `200` */
  readonly pollIntervalMs?: number;
  readonly logger?: Logger;
  /** Chaos testing only. @defaultValue unset */
  readonly faultHook?: FaultHook;
}

/**
 * Moves committed outbox rows into BullMQ. Each batch: lock unsent rows (`SKIP LOCKED`, so
 * relays can run side by side), add them to BullMQ under their deterministic job ids, mark
 * them sent, commit. A crash between the add and the commit leaves the rows unsent; the next
 * relay adds them again, which BullMQ ignores while the job exists, and which the worker's
 * claim turns into a replay if it does not. Delivery is at least once; the effect, once.
 *
 * @example
 * ```ts
 * const relay = new OutboxRelay({ db, connection: { host: '127.0.0.1' } });
 * relay.start();
 * ```
 */
export class OutboxRelay {
  readonly #options: OutboxRelayOptions;
  readonly #queues: QueuesByName;
  readonly #log: Logger;
  #running: Promise<void> | undefined;
  #stopping = false;
  #wake: (() => void) | undefined;

  constructor(options: OutboxRelayOptions) {
    this.#options = Object.freeze({ ...options });
    this.#queues = new QueuesByName(options);
    this.#log = (options.logger ?? pino()).child({ component: 'outbox-relay' });
  }

  /** Relays one batch; returns how many rows were delivered. */
  async relayOnce(): Promise<number> {
    const schema = this.#options.schema ?? 'idempotent_jobs';
    const relayed = await this.#options.db.transaction().execute(async (tx) => {
      const rows = await lockUnsentOutboxRows(tx, schema, this.#options.batchSize ?? 100);
      if (rows.length === 0) return 0;
      const byQueue = new Map<string, typeof rows>();
      for (const row of rows) byQueue.set(row.queue, [...(byQueue.get(row.queue) ?? []), row]);
      for (const [queueName, queueRows] of byQueue) {
        await this.#queues.get(queueName).addBulk(
          queueRows.map((row) => ({ name: row.jobName, data: row.data, opts: { ...(row.opts as JobsOptions), jobId: row.jobId } })),
        );
      }
      if (this.#options.faultHook) await this.#options.faultHook('relay-after-add', {});
      await markOutboxRowsSent(tx, schema, rows.map((row) => row.id));
      return rows.length;
    });
    relayMetrics().relayed.inc({ schema }, relayed); // counted once committed
    return relayed;
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
        this.#log.error({ err: error }, 'outbox relay batch failed; retrying');
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
