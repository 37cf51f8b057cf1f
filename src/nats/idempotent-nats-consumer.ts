import { EventEmitter } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { AckPolicy, jetstream, type ConsumerMessages, type JetStreamClient, type JsMsg } from '@nats-io/jetstream';
import { connect, millis, type NatsConnection, type NodeConnectionOptions } from '@nats-io/transport-node';
import type { Kysely } from 'kysely';
import type { Logger } from 'pino';
import { positiveIntegerOption } from '../consumer/consumer-options.js';
import { resolveWorkerTiming, storeRetryDelayMs, type ResolvedWorkerTiming, type WorkerTimingOptions } from '../consumer/worker-timing.js';
import { ValidationError } from '../errors.js';
import type { DataLayer } from '../store/data-layer.js';
import { checkDataLayersAtStart, dataLayersToCheck } from '../consumer/data-layer-check.js';
import type { FaultHook } from '../fault-hook.js';
import type { JobIdentity } from '../consumer/wire-contract.js';
import { KeyedJobRunner } from '../consumer/keyed-job-runner.js';
import type { Delivery, KeyedJobContext } from '../consumer/job-context.js';
import type { RunOutcome } from '../consumer/run-outcome.js';
import type { ErrorDisposition } from '../consumer/runner-options.js';
import type { WorkerEvent, WorkerEventKind } from '../consumer/worker-event.js';
import { brokerQueueName } from '../consumer/broker-queue-names.js';
import { handlerForm, withDatabaseOnlyContext, type DatabaseOnlyContext, type DatabaseOnlyHandler, type KeyedJobHandler } from '../consumer/database-only-handler.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { publishDeadLetter, type DeadLetterReason } from './dead-letter.js';
import { identityFromNatsMessage, type NatsKeySource } from './nats-message-identity.js';
import { defaultLogger } from '../default-logger.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** What a handler receives: the BullMQ worker's context, with the JetStream message as `message`. */
export type NatsJobContext<P = unknown> = KeyedJobContext<P, JsMsg>;

/** The user's message handler. Its return value is stored (when it never calls `ctx.transaction`). */
export type NatsJobHandler<P = unknown, R = unknown> = (ctx: NatsJobContext<P>) => Promise<R>;

/** Options of {@link createIdempotentNatsConsumer}. */
export interface IdempotentNatsConsumerOptions<P = unknown, R = unknown> extends Omit<WorkerTimingOptions, 'lockDurationMs' | 'stalledIntervalMs' | 'maxStalledCount' | 'waitMs'> {
  /** NATS servers, e.g. `'127.0.0.1:4222'`. The consumer opens (and reopens) its own connection. */
  readonly servers: string | string[];
  /** Further connection options (credentials, TLS, name). Reconnection is always on. @defaultValue none */
  readonly connectionOptions?: Omit<NodeConnectionOptions, 'servers' | 'maxReconnectAttempts'>;
  /** The stream, and its durable pull consumer with explicit acks (see `ensureJetStreamConsumer`). */
  readonly stream: string;
  /** The durable pull consumer's name on `stream`; it must acknowledge explicitly. */
  readonly consumer: string;
  /**
   * Subject that invalid, key-reused and failed messages are copied to (with a reason header)
   * before they are terminated; a stream must capture it. Unset: they are only terminated
   * (JetStream then publishes its `MSG_TERMINATED` advisory).
   * @defaultValue unset
   */
  readonly deadLetterSubject?: string;
  /** The claim protocol (its Kysely instance is where transactional effects run). */
  readonly keys: IdempotencyKeys;
  /**
   * The message's job: a function (a {@link NatsJobHandler}), or a database-only handler
   * `{ transaction: async (tx, ctx) => result }` (see `DatabaseOnlyHandler`: fast path and group
   * commit unless turned off).
   */
  readonly handler: KeyedJobHandler<P, R, JsMsg>;
  /**
   * The data layers the handler writes in (`ctx.transaction(dataLayer, fn)`): each is checked
   * at start, in one transaction, to meet the keys in one database. One on another database
   * stops the start with `DataLayerElsewhereError`, which names the fix, before any message is
   * taken. A database-only handler's own data layer is checked without being named here.
   * @defaultValue none
   */
  readonly dataLayers?: readonly DataLayer<any>[];
  /** Where the key comes from: the wire-contract body, or the `Nats-Msg-Id` header. @defaultValue `'wire-contract'` */
  readonly keyFrom?: NatsKeySource;
  /** The scope of keys read from `Nats-Msg-Id`. @defaultValue `'default'` */
  readonly scope?: string;
  /** Reads key, scope and payload from a message, in place of `keyFrom`. @defaultValue unset */
  readonly keyOf?: (message: JsMsg) => JobIdentity<P>;
  /** Messages run at once. @defaultValue `1` */
  readonly concurrency?: number;
  /** Messages pulled ahead of the handlers (each pull asks for this many). @defaultValue `max(10, 2 × concurrency)` */
  readonly prefetch?: number;
  /**
   * Claims of a key before a retryable error is stored for good. Counted on the key, not by
   * JetStream's delivery count, so redeliveries of a deferred duplicate or after a store fault
   * use none. On the fast path, a failed run's claim rolls back with its transaction, so the
   * consumer records the attempt on the key (claimed and released at once) before it naks.
   * @defaultValue `5`
   */
  readonly maxAttempts?: number;
  /** Redelivery delay after a retryable error, doubled per claim of the key. @defaultValue `1_000` */
  readonly retryDelayMs?: number;
  /** Longest redelivery delay after a retryable error. @defaultValue `60_000` */
  readonly retryDelayMaxMs?: number;
  /** Which handler errors are stored (`'fail'`) and which are retried. @defaultValue `'fail'` for validation errors and unstorable results; else `'retry'` */
  readonly errorDisposition?: (error: unknown, message: JsMsg) => ErrorDisposition;
  /**
   * Single-transaction fast path for handlers whose effects only touch this database: claim,
   * effect and completion commit once; no lease, no heartbeat.
   * @defaultValue `true` for a database-only handler, `false` for a function
   */
  readonly fastPath?: boolean;
  /** Keep each message's payload on its key. @defaultValue `false` */
  readonly storePayload?: boolean;
  /** Structured logger. @defaultValue pino at `LOG_LEVEL`, else `warn` */
  readonly logger?: Logger;
  /** Chaos testing only: called at named protocol points. @defaultValue unset */
  readonly faultHook?: FaultHook;
}

/** Kinds of {@link NatsConsumerEvent}: the BullMQ worker's, and `dead-lettered`. */
export type NatsConsumerEventKind = WorkerEventKind | 'dead-lettered';

/**
 * One thing that happened to a message, emitted as `'event'`: the BullMQ worker's events (with
 * the message's stream sequence as `jobId`), and `dead-lettered` with its `reason`.
 */
export interface NatsConsumerEvent extends Omit<WorkerEvent, 'kind'> {
  /** What happened: see {@link NatsConsumerEventKind}. */
  readonly kind: NatsConsumerEventKind;
  /** On `dead-lettered`. */
  readonly reason?: DeadLetterReason;
}

const RECONNECT_PAUSE_MS = 500;
const PULL_EXPIRES_MS = 5_000;

/** The claim count of each message's last run (its `ctx.attempt`), read by `Delivery.lastAttempt`. */
const attemptOf = new WeakMap<JsMsg, number>();

/** The handler, in its own form, recording each run's `ctx.attempt` first. */
function recordingAttempts<P, R>(handler: KeyedJobHandler<P, R, JsMsg>): KeyedJobHandler<P, R, JsMsg> {
  if (handlerForm(handler) === 'function') {
    const run = handler as (ctx: NatsJobContext<P>) => Promise<R>;
    return (ctx) => {
      attemptOf.set(ctx.message, ctx.attempt);
      return run(ctx);
    };
  }
  return withDatabaseOnlyContext(handler as DatabaseOnlyHandler<P, R, DatabaseOnlyContext<P, JsMsg>>, (ctx: DatabaseOnlyContext<P, JsMsg>) => {
    attemptOf.set(ctx.message, ctx.attempt);
    return ctx;
  });
}

const NATS_CONSUMER_OPTION_NAMES = optionNames<IdempotentNatsConsumerOptions>()([
  'servers', 'connectionOptions', 'stream', 'consumer', 'deadLetterSubject', 'keys', 'handler', 'dataLayers', 'keyFrom', 'scope', 'keyOf',
  'concurrency', 'prefetch', 'maxAttempts', 'retryDelayMs', 'retryDelayMaxMs', 'errorDisposition', 'fastPath', 'storePayload', 'logger',
  'faultHook', 'leaseMs', 'heartbeatMs', 'deferMaxMs', 'deferMinMs', 'deferJitterRatio', 'shutdownTimeoutMs', 'storeRetryMinMs',
  'storeRetryMaxMs', 'storeRetryWindowMs', 'concurrencyStarvationMs', 'concurrencySlotReuseMs',
]);

/**
 * A JetStream pull consumer that makes each message's effect happen once per idempotency key.
 * Every outcome becomes JetStream's own word: `ack` after the commit or for a replay; `nak`
 * with a delay for a key in progress elsewhere, a retry or a Postgres fault; a copy to the
 * dead-letter subject and `term` for a message that must never run; `working()` at every lease
 * heartbeat.
 *
 * @example
 * ```ts
 * import { IdempotencyKeys } from 'idempotent-jobs';
 * import { createIdempotentNatsConsumer } from 'idempotent-jobs/nats';
 *
 * const consumer = createIdempotentNatsConsumer<{ orderId: string; amount: number }>({
 *   servers: '127.0.0.1:4222',
 *   stream: 'ORDERS',
 *   consumer: 'payments',
 *   deadLetterSubject: 'orders.dead',
 *   keys: new IdempotencyKeys({ db }),
 *   handler: (ctx) =>
 *     ctx.transaction((tx) => tx.insertInto('ledger').values({ order_id: ctx.data.orderId, amount: ctx.data.amount }).execute()),
 * });
 * await consumer.waitUntilReady();
 * ```
 */
export function createIdempotentNatsConsumer<P = unknown, R = unknown>(options: IdempotentNatsConsumerOptions<P, R>): IdempotentNatsConsumer<P, R> {
  return new IdempotentNatsConsumer(options);
}

/**
 * A JetStream pull consumer whose messages take effect once per idempotency key: what
 * {@link createIdempotentNatsConsumer} returns (see there for what it does with each message).
 * It connects and starts pulling when constructed; {@link IdempotentNatsConsumer.waitUntilReady}
 * says when it is, and rejects when the JetStream consumer cannot be used as configured. Emits
 * `'event'` ({@link NatsConsumerEvent}) for every outcome.
 *
 * @example
 * ```ts
 * import { IdempotencyKeys } from 'idempotent-jobs';
 * import { IdempotentNatsConsumer, ensureJetStreamConsumer } from 'idempotent-jobs/nats';
 * import { connect } from '@nats-io/transport-node';
 *
 * // Once, at deploy time: the stream, a dead-letter stream, and a durable consumer with explicit acks.
 * const admin = await connect({ servers: '127.0.0.1:4222' });
 * await ensureJetStreamConsumer(admin, {
 *   stream: 'ORDERS',
 *   subjects: ['orders.>'],
 *   consumer: 'payments',
 *   deadLetter: { stream: 'ORDERS_DEAD', subject: 'orders.dead' },
 * });
 * await admin.close();
 *
 * // Producers set Nats-Msg-Id; it is the key here, and JetStream's own dedup id too.
 * const consumer = new IdempotentNatsConsumer<{ orderId: string }>({
 *   servers: '127.0.0.1:4222',
 *   stream: 'ORDERS',
 *   consumer: 'payments',
 *   deadLetterSubject: 'orders.dead',
 *   keyFrom: 'nats-msg-id',
 *   scope: 'orders',
 *   concurrency: 4,
 *   keys: new IdempotencyKeys({ db }),
 *   handler: (ctx) => ctx.transaction((tx) => tx.insertInto('shipments').values({ order_id: ctx.data.orderId }).execute()),
 * });
 * consumer.on('event', (event) => {
 *   if (event.kind === 'dead-lettered') console.warn(`message ${event.jobId} dead-lettered: ${event.reason}`);
 * });
 * await consumer.waitUntilReady();
 * process.once('SIGTERM', () => {
 *   void consumer.close();
 * });
 * ```
 */
export class IdempotentNatsConsumer<P = unknown, R = unknown> extends EventEmitter<{
  /** Every outcome of every message: claims, completions, replays, deferrals, dead letters, steps. */
  event: [NatsConsumerEvent];
}> {
  readonly #options: IdempotentNatsConsumerOptions<P, R>;
  readonly #timing: ResolvedWorkerTiming;
  readonly #log: Logger;
  readonly #runner: KeyedJobRunner<P, R, JsMsg>;
  readonly #maxAttempts: number;
  readonly #retryDelayMs: number;
  readonly #retryDelayMaxMs: number;
  readonly #concurrency: number;
  readonly #inFlight = new Set<Promise<void>>();
  readonly #ready: Promise<void>;
  #readyResolve!: () => void;
  #readyReject!: (error: unknown) => void;
  #connection: NatsConnection | undefined;
  /** False from a `disconnect` of the connection until its `reconnect`. */
  #connected = false;
  #messages: ConsumerMessages | undefined;
  /** True while the pull loop iterates a `consume()`. */
  #pulling = false;
  #closingRequested = false;
  #closing: Promise<void> | undefined;
  readonly #loop: Promise<void>;

  constructor(options: IdempotentNatsConsumerOptions<P, R>) {
    super();
    refuseUnknownOptions(options, NATS_CONSUMER_OPTION_NAMES, 'createIdempotentNatsConsumer(options)');
    this.#options = Object.freeze({ ...options });
    this.#timing = resolveWorkerTiming(options, options.keys.options.leaseMs);
    this.#concurrency = positiveIntegerOption('concurrency', options.concurrency ?? 1);
    this.#maxAttempts = positiveIntegerOption('maxAttempts', options.maxAttempts ?? 5);
    this.#retryDelayMs = positiveIntegerOption('retryDelayMs', options.retryDelayMs ?? 1_000);
    this.#retryDelayMaxMs = positiveIntegerOption('retryDelayMaxMs', options.retryDelayMaxMs ?? 60_000);
    this.#log = (options.logger ?? defaultLogger()).child({ stream: options.stream, consumer: options.consumer });
    const keyFrom = options.keyFrom ?? 'wire-contract';
    const scope = options.scope;
    const identityOf = options.keyOf ?? ((message: JsMsg) => identityFromNatsMessage(message, keyFrom, scope) as JobIdentity<P>);
    this.#runner = new KeyedJobRunner<P, R, JsMsg>({
      keys: options.keys,
      timing: this.#timing,
      handler: recordingAttempts(options.handler),
      identityOf,
      errorDisposition: options.errorDisposition,
      fastPath: options.fastPath,
      storePayload: options.storePayload ?? false,
      // JetStream's delivery count cannot say how many runs failed: it also counts every nak
      // this consumer sent to defer a message without using an attempt (a duplicate whose key
      // is in progress elsewhere, a store fault), and a nak cannot carry a count of its own.
      // Those deferrals could only be subtracted if counted somewhere durable, and a store
      // fault's are counted when Postgres cannot be written. So attempts are the key's claims,
      // as on the leased path; a fast-path run that failed has its attempt recorded on the key.
      countAttemptsOnKey: true,
      logger: this.#log,
      faultHook: options.faultHook,
      events: { wanted: () => this.listenerCount('event') > 0, emit: (event) => this.emit('event', event) },
    });
    this.#ready = new Promise((resolve, reject) => {
      this.#readyResolve = resolve;
      this.#readyReject = reject;
    });
    this.#ready.catch(() => {});
    this.#loop = this.#consumeUntilClosed();
  }

  /** The resolved timing options. */
  get timing(): ResolvedWorkerTiming {
    return this.#timing;
  }

  /** The Kysely instance effects run on. */
  get db(): Kysely<any> {
    return this.#options.keys.db;
  }

  /** True until {@link close} (or a JetStream consumer it cannot use) stops it. */
  get isRunning(): boolean {
    return !this.#closingRequested;
  }

  /**
   * True while messages can arrive: the connection is open and connected (not waiting to
   * reconnect) and the pull loop iterates its `consume()`.
   */
  get isConsuming(): boolean {
    return this.#pulling && this.#connected && this.#connection !== undefined && !this.#connection.isClosed();
  }

  /**
   * Resolves once the consumer is pulling messages; rejects when the JetStream consumer cannot
   * be used as configured (not explicit acks, an AckWait the heartbeat cannot keep at bay), or
   * with `DataLayerElsewhereError` when a data layer it was given is on another database than
   * the keys (see {@link IdempotentNatsConsumerOptions.dataLayers}).
   */
  waitUntilReady(): Promise<void> {
    return this.#ready;
  }

  /**
   * Graceful shutdown: stop pulling, let running messages finish within `shutdownTimeoutMs`;
   * then abort the rest (their `ctx.signal` fires), release their keys and `nak` them so
   * another consumer takes them at once; drain the connection (every ack flushed) and close it.
   * Does not close the IdempotencyKeys' database.
   */
  close(options: { force?: boolean } = {}): Promise<void> {
    this.#closingRequested = true;
    this.#closing ??= (async () => {
      this.#log.info({ active: this.#runner.activeCount }, 'closing: waiting for running messages');
      await this.#messages?.close().catch(() => {});
      const drained = Promise.all([...this.#inFlight]).then(() => true);
      const finished = options.force ? false : await Promise.race([drained, sleep(this.#timing.shutdownTimeoutMs, false, { ref: false })]);
      if (!finished) {
        if (this.#runner.activeCount > 0) this.#log.warn({ active: this.#runner.activeCount }, 'shutdown deadline passed: releasing keys of unfinished messages');
        await this.#runner.abandonActive();
        await drained;
      }
      await this.#runner.close();
      await this.#loop;
      await this.#connection?.drain().catch(() => {});
      this.#log.info('closed');
    })();
    return this.#closing;
  }

  async #consumeUntilClosed(): Promise<void> {
    const refused = await checkDataLayersAtStart(this.#options.keys, dataLayersToCheck(this.#options.dataLayers, this.#options.handler), this.#log);
    if (refused) {
      this.#readyReject(refused);
      this.#closingRequested = true;
      return;
    }
    while (!this.#closingRequested) {
      try {
        const connection = await this.#connect();
        const js = jetstream(connection);
        const consumer = await js.consumers.get(this.#options.stream, this.#options.consumer);
        this.#checkConsumer((await consumer.info()).config);
        if (this.#closingRequested) break;
        // Short pulls: a pull the server lost (it restarted, the connection was cut) is noticed
        // by missed idle heartbeats (half of expires) and pulled again within seconds.
        const messages = await consumer.consume({ max_messages: this.#options.prefetch ?? Math.max(10, 2 * this.#concurrency), expires: PULL_EXPIRES_MS });
        this.#messages = messages;
        this.#pulling = true;
        this.#readyResolve();
        try {
          for await (const message of messages) {
            if (this.#closingRequested) {
              message.nak();
              continue;
            }
            await this.#freeSlot();
            const handled = this.#handle(js, message).catch((error) => this.#log.error({ err: error }, 'message handling failed'));
            this.#inFlight.add(handled);
            void handled.finally(() => this.#inFlight.delete(handled));
          }
        } finally {
          this.#pulling = false;
        }
        if (!this.#closingRequested) this.#log.warn('the consumer stopped delivering; subscribing again');
      } catch (error) {
        if (error instanceof ValidationError) {
          this.#readyReject(error);
          this.#closingRequested = true;
          break;
        }
        if (!this.#closingRequested) this.#log.warn({ err: error }, 'JetStream consumer unavailable; trying again');
      }
      if (!this.#closingRequested) await sleep(RECONNECT_PAUSE_MS);
    }
  }

  /** The consumer's connection: the same one while nats.js reconnects it, a new one once it closed. */
  async #connect(): Promise<NatsConnection> {
    if (this.#connection && !this.#connection.isClosed()) return this.#connection;
    const connection = await connect({
      ...this.#options.connectionOptions,
      servers: this.#options.servers,
      maxReconnectAttempts: -1,
      reconnectTimeWait: this.#options.connectionOptions?.reconnectTimeWait ?? 250,
    });
    this.#connection = connection;
    this.#connected = true;
    void this.#followStatus(connection);
    return connection;
  }

  /** Keeps {@link isConsuming} told of the connection's disconnections and reconnections, until it closes. */
  async #followStatus(connection: NatsConnection): Promise<void> {
    try {
      for await (const status of connection.status()) {
        if (connection !== this.#connection) return;
        if (status.type === 'disconnect') {
          this.#connected = false;
          if (!this.#closingRequested) this.#log.warn({ server: status.server }, 'NATS connection lost; reconnecting');
        } else if (status.type === 'reconnect') {
          this.#connected = true;
          this.#log.info({ server: status.server }, 'NATS connection restored');
        }
      }
    } catch {
      // The iterator ends (or fails) with the connection; a new connection gets its own.
    }
  }

  /** Refuses a JetStream consumer this one cannot run correctly; warns of a delivery limit. */
  #checkConsumer(config: { ack_policy?: AckPolicy; ack_wait?: number; max_deliver?: number }): void {
    if (config.ack_policy !== AckPolicy.Explicit) {
      throw new ValidationError(
        'INVALID_OPTIONS',
        'consumer',
        `JetStream consumer "${this.#options.consumer}" on stream "${this.#options.stream}" has ack_policy "${config.ack_policy}"; ` +
          'an idempotent consumer needs "explicit" (ensureJetStreamConsumer creates one).',
      );
    }
    const ackWaitMs = config.ack_wait ? millis(config.ack_wait) : 30_000;
    if (this.#timing.heartbeatMs * 2 > ackWaitMs) {
      throw new ValidationError(
        'INVALID_OPTIONS',
        'heartbeatMs',
        `heartbeatMs (${this.#timing.heartbeatMs}) must be at most half of the JetStream consumer's ack_wait (${ackWaitMs} ms), ` +
          'so that working() reaches JetStream before it redelivers a running message. Lower heartbeatMs (or leaseMs), or raise ack_wait.',
      );
    }
    if (config.max_deliver !== undefined && config.max_deliver > 0) {
      this.#log.warn(
        { maxDeliver: config.max_deliver },
        'the JetStream consumer has max_deliver set: JetStream counts every delayed nak as a delivery, so a message deferred while its key ' +
          'is in progress elsewhere can run out of deliveries and be dropped. Use max_deliver -1 (ensureJetStreamConsumer does); maxAttempts limits failed runs.',
      );
    }
  }

  async #freeSlot(): Promise<void> {
    while (this.#inFlight.size >= this.#concurrency) await Promise.race(this.#inFlight);
  }

  async #handle(js: JetStreamClient, message: JsMsg): Promise<void> {
    const maxAttempts = this.#maxAttempts;
    const delivery: Delivery<JsMsg> = {
      message,
      id: String(message.seq),
      label: `Message ${message.seq} of stream "${this.#options.stream}"`,
      queue: brokerQueueName('nats', `${this.#options.stream}/${this.#options.consumer}`),
      name: message.subject,
      // Read when the handler has thrown, once its claim's count is known: attempts are the key's
      // claims (on the fast path too: the runner records a failed run's attempt, countAttemptsOnKey),
      // so the redeliveries of a deferred duplicate use none (JetStream's delivery count counts them too).
      get lastAttempt() {
        return (attemptOf.get(message) ?? 1) >= maxAttempts;
      },
      deferrals: message.info.deliveryCount - 1,
      deliveryCount: message.info.deliveryCount,
      sentAtMs: message.info.timestampNanos / 1e6,
    };
    // JetStream's redelivery timer is reset while the handler runs, as the runner's heartbeat
    // extends the lease; a lost lease aborts the handler, which ends the run and the beats.
    const working = setInterval(() => message.working(), this.#timing.heartbeatMs);
    working.unref();
    let outcome: RunOutcome;
    try {
      outcome = await this.#runner.run(delivery);
    } catch (error) {
      // Neither the handler's error nor a store fault (a bug): redeliver, as a retry.
      this.#log.error({ err: error, message: delivery.label }, 'unexpected error running a message; redelivering it');
      outcome = { kind: 'retry', error };
    } finally {
      clearInterval(working);
    }
    await this.#answer(js, message, outcome, attemptOf.get(message) ?? 1);
  }

  /** Says the outcome to JetStream. */
  async #answer(js: JetStreamClient, message: JsMsg, outcome: RunOutcome, attempt: number): Promise<void> {
    switch (outcome.kind) {
      case 'completed':
      case 'replayed':
        message.ack();
        return;
      case 'deferred':
      case 'store-unavailable':
        message.nak(outcome.retryAfterMs);
        return;
      case 'retry':
        message.nak(Math.min(this.#retryDelayMaxMs, this.#retryDelayMs * 2 ** Math.min(30, attempt - 1)));
        return;
      case 'abandoned':
        message.nak();
        return;
      case 'invalid-message':
        return this.#deadLetter(js, message, 'invalid-message', outcome.reason);
      case 'key-reused':
      case 'replayed-failure':
        return this.#deadLetter(js, message, outcome.kind, outcome.error.message);
      case 'failed-permanently':
        return this.#deadLetter(js, message, 'failed', outcome.description);
    }
  }

  /** Copies the message to the dead-letter subject (when set), then terminates it. */
  async #deadLetter(js: JetStreamClient, message: JsMsg, reason: DeadLetterReason, detail: string): Promise<void> {
    const label = `Message ${message.seq} of stream "${this.#options.stream}"`;
    if (this.#options.deadLetterSubject) {
      try {
        await publishDeadLetter(js, this.#options.deadLetterSubject, message, reason, detail);
      } catch (error) {
        const delayMs = storeRetryDelayMs(this.#timing, message.info.deliveryCount - 1);
        this.#log.error({ message: label, err: error, delayMs }, `could not dead-letter the message to "${this.#options.deadLetterSubject}"; redelivering it later`);
        message.nak(delayMs);
        return;
      }
    }
    // No reason with the term: servers before 2.11 do not read one, and 2.9 takes "+TERM <reason>" for no term at all.
    message.term();
    if (this.listenerCount('event') > 0) this.emit('event', { kind: 'dead-lettered', jobId: String(message.seq), reason });
    this.#log.warn({ message: label, reason }, 'message dead-lettered and terminated');
  }
}
