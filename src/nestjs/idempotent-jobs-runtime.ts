import { setTimeout as sleep } from 'node:timers/promises';
import type { BeforeApplicationShutdown, OnApplicationBootstrap, OnApplicationShutdown } from '@nestjs/common';
import type { DiscoveryService, Reflector } from '@nestjs/core';
import type { Kysely } from 'kysely';
import type { Logger } from 'pino';
import { IdempotentProducer } from '../bullmq/idempotent-producer.js';
import type { IdempotentWorker } from '../bullmq/idempotent-worker.js';
import { rememberKeysOf } from '../bullmq/keys-by-queue.js';
import { OutboxRelay } from '../bullmq/outbox-relay.js';
import type { QueueConnectionOptions } from '../bullmq/queue-connection.js';
import { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { createPostgresDb } from '../store/create-postgres-db.js';
import { KeySettledListener } from '../store/key-settled-listener.js';
import { migrate } from '../store/migrate.js';
import type { WorkerEvent } from '../consumer/worker-event.js';
import { StoreWriteHealth } from '../runtime/store-write-health.js';
import type { IdempotentJobsModuleOptions, RegisterQueueOptions } from './module-options.js';
import { findProcessors, startProcessorWorker } from './processor-workers.js';
import { defaultLogger } from '../default-logger.js';

/** A processor's worker, by the queue it takes jobs from. */
export interface RunningProcessor {
  /** The processor's class name. */
  readonly name: string;
  /** Its worker. */
  readonly worker: IdempotentWorker<any, any>;
}

/**
 * What the module runs for the application: the keys' pool and claim protocol, the producers of
 * the registered queues, the processors' workers and the outbox relay, each opened and closed in
 * Nest's lifecycle. Opened by the module's provider factory (migrations included, so every
 * provider that injects the keys or a producer is built after them); the workers start once the
 * application has bootstrapped; SIGTERM (with `app.enableShutdownHooks()`) or `app.close()`
 * drains them, releases the keys of jobs still running after `shutdownTimeoutMs`, and closes
 * everything the module opened.
 */
export class IdempotentJobsRuntime implements OnApplicationBootstrap, BeforeApplicationShutdown, OnApplicationShutdown {
  /** The claim protocol. */
  readonly keys: IdempotencyKeys;
  /** The keys' Kysely instance. */
  readonly db: Kysely<any>;
  /** Wakes waiting duplicates, when `listenerConnectionString` is set. */
  readonly listener: KeySettledListener | undefined;
  /** Store write faults the workers met (the health indicator's "store writable"). */
  readonly #writeHealth = new StoreWriteHealth();
  readonly #options: IdempotentJobsModuleOptions;
  readonly #ownsDb: boolean;
  readonly #log: Logger;
  readonly #discovery: DiscoveryService;
  readonly #reflector: Reflector;
  readonly #queues = new Map<string, { readonly options: RegisterQueueOptions; readonly producer: IdempotentProducer }>();
  readonly #processors: RunningProcessor[] = [];
  #relay: OutboxRelay | undefined;
  #closed: Promise<void> | undefined;

  private constructor(options: IdempotentJobsModuleOptions, discovery: DiscoveryService, reflector: Reflector) {
    this.#options = options;
    this.#discovery = discovery;
    this.#reflector = reflector;
    this.#log = options.logger ?? defaultLogger();
    this.#ownsDb = options.db === undefined;
    this.db =
      options.db ??
      createPostgresDb(
        typeof options.database === 'string' ? { connectionString: options.database, applicationName: 'idempotent-jobs:nestjs' } : options.database!,
        (error) => this.#log.warn({ err: error }, 'idle Postgres connection of the keys failed; the pool opens another'),
      );
    this.keys = new IdempotencyKeys({ ...options.keys, db: this.db });
    this.listener = options.listenerConnectionString
      ? new KeySettledListener({
          connectionString: options.listenerConnectionString,
          schema: this.keys.options.schema,
          onError: (error) => this.#log.warn({ err: error }, 'listener connection failed; it reconnects at the next wait'),
        })
      : undefined;
  }

  /** Opens the runtime: the pool, and the migrations unless `migrate: false`. A failure closes what it opened. */
  static async open(options: IdempotentJobsModuleOptions, discovery: DiscoveryService, reflector: Reflector): Promise<IdempotentJobsRuntime> {
    const runtime = new IdempotentJobsRuntime(options, discovery, reflector);
    try {
      if (options.migrate ?? true) await migrate(runtime.db, { schema: runtime.keys.options.schema });
    } catch (error) {
      await runtime.#closeStores();
      throw error;
    }
    return runtime;
  }

  /** Throws, saying what Postgres answered, while jobs are being deferred because it refuses their writes (a full disk, a demoted primary). */
  assertWritesAccepted(): void {
    this.#writeHealth.check();
  }

  /** The processors' workers, started at bootstrap. */
  get processors(): readonly RunningProcessor[] {
    return this.#processors;
  }

  /** Whether the outbox relay runs. */
  get relayRunning(): boolean {
    return this.#relay !== undefined;
  }

  /** Opens the producer of a registered queue (on its own connection, or the module's). */
  openProducer(queue: RegisterQueueOptions): IdempotentProducer {
    if (this.#queues.has(queue.name)) {
      throw new Error(`Queue "${queue.name}" is registered twice (IdempotentJobsModule.registerQueue); register each queue once and import that module where it is needed.`);
    }
    const producer = new IdempotentProducer({
      ...this.#connectionOf(queue),
      queue: queue.name,
      schema: this.keys.options.schema,
      fingerprint: (identity) => this.keys.fingerprint(identity),
      ...(queue.defaultScope !== undefined ? { defaultScope: queue.defaultScope } : {}),
      ...(queue.defaultJobOptions !== undefined ? { defaultJobOptions: queue.defaultJobOptions } : {}),
      ...(queue.enqueueInTransaction !== undefined ? { enqueueInTransaction: queue.enqueueInTransaction } : {}),
    });
    // Bull Board's NestJS module builds its adapters from the queue alone: let the adapter find the keys.
    rememberKeysOf(producer.queue, this.keys);
    this.#queues.set(queue.name, { options: queue, producer });
    return producer;
  }

  /** Starts a worker per processor, then the relay; fails the bootstrap, having closed them, when one is not ready in time. */
  async onApplicationBootstrap(): Promise<void> {
    const settings = {
      keys: this.keys,
      dataLayer: this.#options.dataLayer,
      listener: this.listener,
      defaults: this.#options.worker ?? {},
      logger: this.#log,
    };
    try {
      for (const processor of findProcessors(this.#discovery, this.#reflector)) {
        const queue = this.#queues.get(processor.metadata.queue)?.options;
        const worker = startProcessorWorker(processor, this.#connectionOf(queue), settings);
        worker.on('event', (event: WorkerEvent) => this.#writeHealth.observe(event));
        this.#processors.push({ name: processor.name, worker });
      }
      await Promise.all(this.#processors.map(({ name, worker }) => this.#readyInTime(name, worker)));
    } catch (error) {
      // A failed bootstrap gets no shutdown hooks: close what the module opened now.
      await Promise.all(this.#processors.map(({ worker }) => worker.close({ force: true })));
      await this.onApplicationShutdown();
      throw error;
    }
    if (this.#wantsRelay()) {
      const tuning = typeof this.#options.relay === 'object' ? this.#options.relay : {};
      this.#relay = new OutboxRelay({ ...tuning, ...this.#connectionOf(undefined), db: this.db, schema: this.keys.options.schema, logger: this.#log });
      this.#relay.start();
    }
    this.#log.info({ processors: this.#processors.map(({ name, worker }) => `${name} (${worker.bullWorker.name})`), relay: this.relayRunning }, 'idempotent-jobs: workers started');
  }

  /**
   * Drains the workers: each stops taking jobs and lets its running ones finish within its
   * `shutdownTimeoutMs`, then aborts the rest and releases their keys (another instance takes
   * them over at once). Shut down by a signal, a second SIGTERM or SIGINT meanwhile forces it
   * (release now), as the library's own processes do.
   */
  async beforeApplicationShutdown(signal?: string): Promise<void> {
    const force = () => {
      this.#log.warn('second signal: releasing the keys of running jobs now');
      void Promise.all(this.#processors.map(({ worker }) => worker.close({ force: true })));
    };
    if (signal) for (const name of ['SIGTERM', 'SIGINT'] as const) process.once(name, force);
    try {
      await Promise.all(this.#processors.map(({ worker }) => worker.close()));
      await this.#relay?.stop();
    } finally {
      if (signal) for (const name of ['SIGTERM', 'SIGINT'] as const) process.off(name, force);
    }
  }

  /** Closes the producers, the listener and the pool the module opened (workers closed before, or now). */
  onApplicationShutdown(): Promise<void> {
    this.#closed ??= (async () => {
      await Promise.all(this.#processors.map(({ worker }) => worker.close()));
      await this.#relay?.stop();
      await Promise.all([...this.#queues.values()].map(({ producer }) => producer.close().catch(() => {})));
      await this.#closeStores();
    })();
    return this.#closed;
  }

  async #closeStores(): Promise<void> {
    await this.listener?.close();
    if (this.#ownsDb) await this.db.destroy();
  }

  /** A registered queue's connection, each part defaulting to the module's. */
  #connectionOf(queue: RegisterQueueOptions | undefined): QueueConnectionOptions {
    const root = this.#options;
    return {
      backend: queue?.backend ?? root.backend,
      connection: queue?.connection ?? root.connection,
      prefix: queue?.prefix ?? root.prefix,
    };
  }

  /** Whether a registered queue enqueues in a transaction through the outbox (on Redis, unless it said 'queue'). */
  #wantsRelay(): boolean {
    if (this.#options.relay === false) return false;
    return [...this.#queues.values()].some(({ options }) => (options.backend ?? this.#options.backend ?? 'redis') === 'redis' && options.enqueueInTransaction !== 'queue');
  }

  async #readyInTime(name: string, worker: IdempotentWorker<any, any>): Promise<void> {
    const timeoutMs = this.#options.startupTimeoutMs ?? 60_000;
    let lastError: unknown;
    const remember = (error: Error) => (lastError = error);
    worker.bullWorker.on('error', remember);
    const timedOut = Symbol('timed out');
    try {
      const outcome = await Promise.race([worker.waitUntilReady(), sleep(timeoutMs, timedOut, { ref: false })]);
      if (outcome === timedOut) {
        const why = lastError instanceof Error ? `: ${lastError.message}` : '';
        throw new Error(`${name}'s worker (queue "${worker.bullWorker.name}") was not ready within ${timeoutMs} ms (startupTimeoutMs)${why}.`, { cause: lastError });
      }
    } finally {
      worker.bullWorker.off('error', remember);
    }
  }
}
