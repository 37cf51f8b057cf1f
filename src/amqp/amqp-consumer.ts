import { EventEmitter } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { connect, type ChannelModel, type ConfirmChannel, type ConsumeMessage, type Options } from 'amqplib';
import type { Logger } from 'pino';
import { positiveIntegerOption } from '../consumer/consumer-options.js';
import { resolveWorkerTiming, type ResolvedWorkerTiming, type WorkerTimingOptions } from '../consumer/worker-timing.js';
import { KeyedJobRunner } from '../consumer/keyed-job-runner.js';
import type { Delivery, KeyedJobContext } from '../consumer/job-context.js';
import type { RunOutcome } from '../consumer/run-outcome.js';
import { defaultErrorDisposition, type ErrorDisposition } from '../consumer/runner-options.js';
import type { WorkerEvent } from '../consumer/worker-event.js';
import { brokerQueueName } from '../consumer/broker-queue-names.js';
import type { KeyedJobHandler } from '../consumer/database-only-handler.js';
import type { FaultHook } from '../fault-hook.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import type { KeySettledListener } from '../store/key-settled-listener.js';
import type { JobIdentity } from '../consumer/wire-contract.js';
import { describeError } from '../describe-error.js';
import { ConfigError, type DataLayerElsewhereError } from '../errors.js';
import type { DataLayer } from '../store/data-layer.js';
import { checkDataLayersAtStart, dataLayersToCheck } from '../consumer/data-layer-check.js';
import { amqpIdentityReader, type AmqpIdentityOptions } from './amqp-identity.js';
import { amqpTopology, declareDelayQueue, declareTopology, type AmqpTopology } from './amqp-topology.js';
import { defaultLogger } from '../default-logger.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** Header counting a message's failed deliveries (handler errors that were retried). */
export const ATTEMPTS_HEADER = 'x-idempotent-attempts';
/** Header counting a message's deferrals (in-progress duplicates, store faults): no attempt used. */
export const DEFERRALS_HEADER = 'x-idempotent-deferrals';
/** On a dead-lettered message: `invalid-message`, `key-reused`, `failed` or `replayed-failure`. */
export const REASON_HEADER = 'x-idempotent-reason';
/** On a dead-lettered message: the error's message. */
export const ERROR_HEADER = 'x-idempotent-error';

/** Why a message was dead-lettered (the {@link REASON_HEADER} value). */
export type DeadLetterReason = 'invalid-message' | 'key-reused' | 'failed' | 'replayed-failure';

/** What an AMQP handler receives: the same `ctx` as the BullMQ worker's, with the AMQP message. */
export type AmqpJobContext<P = unknown> = KeyedJobContext<P, ConsumeMessage>;
/** The user's message handler. Its return value is stored (when it never calls `ctx.transaction`) and replayed to duplicates. */
export type AmqpJobHandler<P = unknown, R = unknown> = (ctx: AmqpJobContext<P>) => Promise<R>;

/** Options of {@link createAmqpConsumer}. */
export interface AmqpConsumerOptions<P = unknown, R = unknown> extends Omit<WorkerTimingOptions, 'lockDurationMs' | 'stalledIntervalMs' | 'maxStalledCount'> {
  /** amqplib connection URL or options. @defaultValue `'amqp://guest:guest@127.0.0.1:5672'` */
  readonly url?: string | Options.Connect;
  /** The queue to consume (declared durable if missing). */
  readonly queue: string;
  /** Where poison, key-reused and failed messages go. @defaultValue `'<queue>.dead-letter'` */
  readonly deadLetterQueue?: string;
  /** Prefix of the delay queues (see `amqp-topology.ts`). @defaultValue `'<queue>.delay'` */
  readonly delayQueuePrefix?: string;
  /** The claim protocol (its Kysely instance is where transactional effects run). */
  readonly keys: IdempotencyKeys;
  /**
   * The message's job: a function (an {@link AmqpJobHandler}), or a database-only handler
   * `{ transaction: async (tx, ctx) => result }` (see `DatabaseOnlyHandler`: fast path and group
   * commit unless turned off).
   */
  readonly handler: KeyedJobHandler<P, R, ConsumeMessage>;
  /**
   * The data layers the handler writes in (`ctx.transaction(dataLayer, fn)`): each is checked
   * at start, in one transaction, to meet the keys in one database. One on another database
   * stops the start with `DataLayerElsewhereError`, which names the fix, before any message is
   * taken. A database-only handler's own data layer is checked without being named here.
   * @defaultValue none
   */
  readonly dataLayers?: readonly DataLayer<any>[];
  /** Messages run at once (the channel's prefetch). @defaultValue `1` */
  readonly concurrency?: number;
  /** Where the key comes from: the body (wire contract), a header or the message id. @defaultValue `{ source: 'body' }` */
  readonly identity?: AmqpIdentityOptions;
  /** Reads the identity yourself (overrides `identity`). @defaultValue unset (`identity` decides) */
  readonly identityOf?: (message: ConsumeMessage) => JobIdentity<P>;
  /** Deliveries a message may fail (handler errors) before its error is stored. @defaultValue `3` */
  readonly maxAttempts?: number;
  /** Delay before the first redelivery after a handler error; doubles with each. @defaultValue `1_000` */
  readonly retryDelayMs?: number;
  /** Which handler errors are stored at once. @defaultValue validation and unstorable-result errors */
  readonly errorDisposition?: (error: unknown, message: ConsumeMessage) => ErrorDisposition;
  /** See `IdempotentWorkerOptions.fastPath`. @defaultValue `true` for a database-only handler, `false` for a function */
  readonly fastPath?: boolean;
  /** Needed for `waitMs > 0`: wakes a waiting duplicate when the owner finishes. @defaultValue unset (a duplicate is delayed at once) */
  readonly listener?: KeySettledListener;
  /** Keep each message's payload on its key. @defaultValue `false` */
  readonly storePayload?: boolean;
  /** First wait before reconnecting after the connection or channel closed; doubles up to 5 s. @defaultValue `100` */
  readonly reconnectMinMs?: number;
  /** Structured logger. @defaultValue pino at `LOG_LEVEL`, else `warn` */
  readonly logger?: Logger;
  /** Chaos testing only. @defaultValue unset */
  readonly faultHook?: FaultHook;
}

/** One open connection and its confirm channel. */
interface Session {
  readonly connection: ChannelModel;
  readonly channel: ConfirmChannel;
  consumerTag: string;
  readonly declaredDelays: Set<string>;
}

const AMQP_CONSUMER_OPTION_NAMES = optionNames<AmqpConsumerOptions>()([
  'url', 'queue', 'deadLetterQueue', 'delayQueuePrefix', 'keys', 'handler', 'dataLayers', 'concurrency', 'identity', 'identityOf',
  'maxAttempts', 'retryDelayMs', 'errorDisposition', 'fastPath', 'listener', 'storePayload', 'reconnectMinMs', 'logger', 'faultHook',
  'leaseMs', 'heartbeatMs', 'deferMaxMs', 'deferMinMs', 'deferJitterRatio', 'waitMs', 'shutdownTimeoutMs', 'storeRetryMinMs',
  'storeRetryMaxMs', 'storeRetryWindowMs', 'concurrencyStarvationMs', 'concurrencySlotReuseMs',
]);

/**
 * Consumes a RabbitMQ queue with the same guarantee as the BullMQ worker: each message's effect
 * happens once per idempotency key. A message is acknowledged after its effect committed (or when
 * its key was completed before); a duplicate whose key another consumer holds, and a message
 * that met a Postgres fault, go to a delay queue and come back, without counting as a failed
 * delivery; unreadable, key-reused and permanently failed messages go to the dead-letter queue
 * with the reason in a header. Reconnects when the connection or the channel closes.
 *
 * @example
 * ```ts
 * import { IdempotencyKeys } from 'idempotent-jobs';
 * import { createAmqpConsumer } from 'idempotent-jobs/amqp';
 *
 * const consumer = createAmqpConsumer<{ orderId: string; amount: number }>({
 *   url: 'amqp://guest:guest@127.0.0.1:5672',
 *   queue: 'payments',
 *   keys: new IdempotencyKeys({ db }),
 *   handler: (ctx) =>
 *     ctx.transaction((tx) => tx.insertInto('ledger').values({ order_id: ctx.data.orderId, amount: ctx.data.amount }).execute()),
 * });
 * await consumer.start();
 * ```
 */
export function createAmqpConsumer<P = unknown, R = unknown>(options: AmqpConsumerOptions<P, R>): AmqpConsumer<P, R> {
  return new AmqpConsumer(options);
}

/**
 * A RabbitMQ consumer whose messages take effect once per idempotency key: what
 * {@link createAmqpConsumer} returns (see there for what it does with each message). Call
 * {@link AmqpConsumer.start} to consume and {@link AmqpConsumer.close} to stop. Emits `'event'`
 * ({@link WorkerEvent}) for every outcome.
 *
 * @example
 * ```ts
 * import { IdempotencyKeys } from 'idempotent-jobs';
 * import { AmqpConsumer, REASON_HEADER } from 'idempotent-jobs/amqp';
 *
 * // Foreign publishers: the key in a header, the whole JSON body as the payload.
 * const consumer = new AmqpConsumer<{ email: string }>({
 *   queue: 'emails',
 *   keys: new IdempotencyKeys({ db }),
 *   identity: { source: 'header', scope: 'emails' },
 *   maxAttempts: 5,
 *   handler: async (ctx) => {
 *     const sent = await ctx.step('send', (step) => mailer.send({ to: ctx.data.email, idempotencyKey: step.stepKey }));
 *     return ctx.transaction((tx) => tx.insertInto('sent_emails').values({ message_id: sent.id }).execute());
 *   },
 * });
 * consumer.on('event', (event) => {
 *   if (event.kind === 'failed') console.warn(`key ${event.key} failed; the message is dead-lettered with ${REASON_HEADER}`);
 * });
 * await consumer.start();
 * process.once('SIGTERM', () => {
 *   void consumer.close();
 * });
 * ```
 */
export class AmqpConsumer<P = unknown, R = unknown> extends EventEmitter<{
  /** Every outcome of every message: claims, completions, replays, deferrals, failures, steps. */
  event: [WorkerEvent];
}> {
  readonly #options: AmqpConsumerOptions<P, R>;
  readonly #timing: ResolvedWorkerTiming;
  readonly #log: Logger;
  readonly #runner: KeyedJobRunner<P, R, ConsumeMessage>;
  readonly #topology: AmqpTopology;
  readonly #maxAttempts: number;
  readonly #inFlight = new Set<Promise<void>>();
  #session: Session | undefined;
  #connecting: Promise<void> | undefined;
  #closing: Promise<void> | undefined;
  #started = false;
  #dataLayersChecked: Promise<DataLayerElsewhereError | undefined> | undefined;
  #closed = false;
  /** Set once a first connection consumed: a declaration refused before that ends the start. */
  #consumedOnce = false;

  constructor(options: AmqpConsumerOptions<P, R>) {
    super();
    refuseUnknownOptions(options, AMQP_CONSUMER_OPTION_NAMES, 'createAmqpConsumer(options)');
    this.#options = Object.freeze({ ...options });
    this.#timing = resolveWorkerTiming(options, options.keys.options.leaseMs);
    this.#maxAttempts = positiveIntegerOption('maxAttempts', options.maxAttempts ?? 3);
    positiveIntegerOption('concurrency', options.concurrency ?? 1);
    positiveIntegerOption('retryDelayMs', options.retryDelayMs ?? 1_000);
    this.#log = (options.logger ?? defaultLogger()).child({ queue: options.queue });
    this.#topology = amqpTopology(options.queue, options);
    this.#runner = new KeyedJobRunner<P, R, ConsumeMessage>({
      keys: options.keys,
      timing: this.#timing,
      handler: options.handler,
      identityOf: options.identityOf ?? amqpIdentityReader<P>(options.identity),
      errorDisposition: options.errorDisposition ?? defaultErrorDisposition,
      fastPath: options.fastPath,
      listener: options.listener,
      storePayload: options.storePayload,
      logger: this.#log,
      faultHook: options.faultHook,
      events: { wanted: () => this.listenerCount('event') > 0, emit: (event) => this.emit('event', event) },
    });
  }

  /** The queues this consumer uses. */
  get topology(): AmqpTopology {
    return this.#topology;
  }

  /** The resolved timing options. */
  get timing(): ResolvedWorkerTiming {
    return this.#timing;
  }

  /** The channel consuming now (undefined while reconnecting), e.g. to publish on the same connection. */
  get channel(): ConfirmChannel | undefined {
    return this.#session?.channel;
  }

  /** True while a channel is open and consuming. */
  get isConsuming(): boolean {
    return this.#session !== undefined;
  }

  /** True from {@link start} until {@link close}: consuming, or connecting to consume. */
  get isRunning(): boolean {
    return this.#started && !this.#closed;
  }

  /**
   * Connects, declares the queues and starts consuming. Resolves once consuming; while the
   * broker is unreachable it keeps trying (with a warning per try) until {@link close}. Rejects
   * with `DataLayerElsewhereError`, before connecting, when a data layer it was given is on
   * another database than the keys (see {@link AmqpConsumerOptions.dataLayers}).
   */
  start(): Promise<void> {
    this.#started = true;
    this.#connecting ??= this.#checkDataLayers()
      .then(() => this.#connectUntilConsuming())
      .finally(() => {
        this.#connecting = undefined;
      });
    return this.#connecting;
  }

  /** Checks the data layers once, before the first connection: one on another database ends the start. */
  async #checkDataLayers(): Promise<void> {
    this.#dataLayersChecked ??= checkDataLayersAtStart(this.#options.keys, dataLayersToCheck(this.#options.dataLayers, this.#options.handler), this.#log);
    const refused = await this.#dataLayersChecked;
    if (refused) {
      this.#started = false;
      throw refused;
    }
  }

  /**
   * Graceful shutdown: stop taking messages, let active ones finish within `shutdownTimeoutMs`;
   * then abort the rest (their `ctx.signal` fires), release their keys, give their messages back
   * to the broker, and close the connection. Does not close the IdempotencyKeys' database.
   */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#closed = true;
      const session = this.#session;
      this.#log.info({ active: this.#runner.activeCount }, 'closing: waiting for active messages');
      if (session) await session.channel.cancel(session.consumerTag).catch(() => {});
      const drained = Promise.all([...this.#inFlight]).then(() => true);
      const finished = await Promise.race([drained, sleep(this.#timing.shutdownTimeoutMs, false, { ref: false })]);
      if (!finished) {
        // The handlers' signals fire and their keys are released; their messages go back now,
        // without waiting for handlers that ignore the signal.
        const abandoned = await this.#runner.abandonActive();
        if (session) for (const { message } of abandoned) await this.#acknowledge(session, message, () => session.channel.nack(message, false, true));
      }
      await this.#runner.close();
      this.#session = undefined;
      if (session) {
        // The channel first: its close-ok comes after every acknowledgement sent on it, which a
        // connection close alone may drop.
        await session.channel.close().catch(() => {});
        await session.connection.close().catch(() => {});
      }
      this.#log.info('closed');
    })();
    return this.#closing;
  }

  async #connectUntilConsuming(): Promise<void> {
    let waitMs = this.#options.reconnectMinMs ?? 100;
    while (!this.#closed) {
      try {
        this.#session = await this.#openSession();
        this.#consumedOnce = true;
        this.#log.info({ concurrency: this.#options.concurrency ?? 1 }, 'consuming');
        return;
      } catch (error) {
        if (isPreconditionFailed(error)) {
          // The queue exists with other settings: waiting cannot fix that at start. Later (a
          // reconnect), an operator may be fixing it: say so at error level and keep trying.
          const refused = declarationRefused(this.#topology, error);
          if (!this.#consumedOnce) throw refused;
          this.#log.error({ error: refused.message, retryInMs: waitMs }, 'RabbitMQ refused the queue declaration: connecting again');
        } else {
          // One line per try; the stack only at debug: a broker that is down is not a defect.
          this.#log.warn({ error: describeError(error), retryInMs: waitMs }, 'RabbitMQ unavailable: connecting again');
          this.#log.debug({ err: error }, 'RabbitMQ connection error');
        }
        await sleep(waitMs);
        waitMs = Math.min(5_000, waitMs * 2);
      }
    }
  }

  async #openSession(): Promise<Session> {
    const connection = await connect(this.#options.url ?? 'amqp://guest:guest@127.0.0.1:5672');
    // Before anything else: an unhandled 'error' would end the process.
    connection.on('error', (error) => this.#log.warn({ err: error }, 'RabbitMQ connection error'));
    try {
      const channel = await connection.createConfirmChannel();
      channel.on('error', (error) => this.#log.warn({ err: error }, 'RabbitMQ channel error'));
      await declareTopology(channel, this.#topology);
      await channel.prefetch(this.#options.concurrency ?? 1);
      // Made before consuming: deliveries may arrive before consume() resolves.
      const session: Session = { connection, channel, consumerTag: '', declaredDelays: new Set() };
      const consumer = await channel.consume(this.#topology.queue, (message) => {
        // null: the broker cancelled the consumer (the queue was deleted); reconnecting redeclares it.
        if (message === null) return void channel.close().catch(() => {});
        this.#track(this.#receive(session, message));
      });
      session.consumerTag = consumer.consumerTag;
      // A closed channel (consumer_timeout, a channel error, an operator) or connection: start over.
      const lost = () => this.#onSessionLost(session);
      channel.once('close', lost);
      connection.once('close', lost);
      return session;
    } catch (error) {
      await connection.close().catch(() => {});
      throw error;
    }
  }

  #onSessionLost(session: Session): void {
    if (this.#session !== session) return;
    this.#session = undefined;
    void session.connection.close().catch(() => {});
    if (this.#closed) return;
    // Unacknowledged messages go back to the queue; those running here finish, and their
    // acknowledgements fail: each comes back and replays.
    this.#log.warn({ active: this.#runner.activeCount }, 'RabbitMQ channel or connection closed: reconnecting');
    void this.start();
  }

  #track(work: Promise<void>): void {
    this.#inFlight.add(work);
    void work.finally(() => this.#inFlight.delete(work));
  }

  async #receive(session: Session, message: ConsumeMessage): Promise<void> {
    if (this.#closed) {
      await this.#acknowledge(session, message, () => session.channel.nack(message, false, true));
      return;
    }
    const headers = message.properties.headers ?? {};
    const attempts = countHeader(headers[ATTEMPTS_HEADER]);
    const delivery: Delivery<ConsumeMessage> = {
      message,
      id: typeof message.properties.messageId === 'string' ? message.properties.messageId : undefined,
      label: `Message ${message.properties.messageId ?? `#${message.fields.deliveryTag}`} on queue "${this.#topology.queue}"`,
      // Marked as RabbitMQ's on the key's row, so that a sweeper does not take it for a BullMQ queue.
      queue: brokerQueueName('amqp', this.#topology.queue),
      name: typeof message.properties.type === 'string' ? message.properties.type : '',
      lastAttempt: attempts + 1 >= this.#maxAttempts,
      deferrals: countHeader(headers[DEFERRALS_HEADER]),
    };
    let outcome: RunOutcome;
    try {
      outcome = await this.#runner.run(delivery);
    } catch (error) {
      this.#log.error({ err: error }, 'unexpected error running a message: retrying it');
      outcome = { kind: 'retry', error };
    }
    await this.#answer(session, message, outcome, attempts);
  }

  /** Says the outcome in RabbitMQ's vocabulary. */
  async #answer(session: Session, message: ConsumeMessage, outcome: RunOutcome, attempts: number): Promise<void> {
    const { channel } = session;
    switch (outcome.kind) {
      case 'completed':
      case 'replayed':
        return this.#acknowledge(session, message, () => channel.ack(message));
      case 'deferred':
      case 'store-unavailable':
        return this.#republishDelayed(session, message, outcome.retryAfterMs, { [DEFERRALS_HEADER]: countHeader(message.properties.headers?.[DEFERRALS_HEADER]) + 1 });
      case 'retry': {
        const delayMs = (this.#options.retryDelayMs ?? 1_000) * 2 ** Math.min(attempts, 20);
        return this.#republishDelayed(session, message, delayMs, { [ATTEMPTS_HEADER]: attempts + 1 });
      }
      case 'invalid-message':
        return this.#deadLetter(session, message, 'invalid-message', outcome.reason);
      case 'key-reused':
        return this.#deadLetter(session, message, 'key-reused', outcome.error.message);
      case 'replayed-failure':
        return this.#deadLetter(session, message, 'replayed-failure', outcome.error.message);
      case 'failed-permanently':
        return this.#deadLetter(session, message, 'failed', outcome.description);
      case 'abandoned':
        return; // close() gave the message back already
    }
  }

  /**
   * A copy to the delay queue, confirmed by the broker before the original is acknowledged: a
   * crash in between leaves both, and the duplicate replays.
   */
  async #republishDelayed(session: Session, message: ConsumeMessage, delayMs: number, headers: Record<string, unknown>): Promise<void> {
    const delay = this.#topology.delayQueueFor(delayMs);
    await this.#acknowledge(session, message, async () => {
      if (!session.declaredDelays.has(delay.name)) {
        await declareDelayQueue(session.channel, this.#topology, delay);
        session.declaredDelays.add(delay.name);
      }
      await publishConfirmed(session.channel, delay.name, message, headers);
      session.channel.ack(message);
    });
  }

  async #deadLetter(session: Session, message: ConsumeMessage, reason: DeadLetterReason, error: string): Promise<void> {
    await this.#acknowledge(session, message, async () => {
      await publishConfirmed(session.channel, this.#topology.deadLetterQueue, message, { [REASON_HEADER]: reason, [ERROR_HEADER]: error });
      session.channel.ack(message);
    });
  }

  /**
   * Runs an acknowledgement. When the channel it came on has closed, nothing can be said for
   * the message any more: the broker gives it to a consumer again, where it replays.
   */
  async #acknowledge(session: Session, message: ConsumeMessage, answer: () => unknown): Promise<void> {
    try {
      await answer();
    } catch (error) {
      this.#log.warn({ err: error, deliveryTag: message.fields.deliveryTag }, 'could not answer the broker for a message (channel closed); it will be delivered again');
      if (this.#session === session) this.#onSessionLost(session);
    }
  }
}

/** Publishes a copy of `message` (body and properties, `headers` merged in) and waits for the broker's confirm. */
function publishConfirmed(channel: ConfirmChannel, queue: string, message: ConsumeMessage, headers: Record<string, unknown>): Promise<void> {
  const { properties } = message;
  const options: Options.Publish = {
    contentType: properties.contentType,
    contentEncoding: properties.contentEncoding,
    correlationId: properties.correlationId,
    replyTo: properties.replyTo,
    messageId: properties.messageId,
    timestamp: properties.timestamp,
    type: properties.type,
    appId: properties.appId,
    priority: properties.priority,
    persistent: true,
    headers: { ...withoutDeathHistory(properties.headers ?? {}), ...headers },
  };
  return new Promise((resolve, reject) => {
    channel.sendToQueue(queue, message.content, options, (error) => (error ? reject(error) : resolve()));
  });
}

/** RabbitMQ's own dead-lettering history (`x-death`, …) would grow with every delay; it is the broker's, not ours. */
function withoutDeathHistory(headers: Record<string, unknown>): Record<string, unknown> {
  const kept: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(headers)) if (!name.startsWith('x-death') && !name.startsWith('x-first-death') && !name.startsWith('x-last-death')) kept[name] = value;
  return kept;
}

function countHeader(value: unknown): number {
  const count = typeof value === 'number' ? value : typeof value === 'string' ? Number.parseInt(value, 10) : 0;
  return Number.isFinite(count) && count > 0 ? Math.floor(count) : 0;
}

/** RabbitMQ's 406 PRECONDITION_FAILED: a declaration that does not match the existing queue. */
function isPreconditionFailed(error: unknown): boolean {
  return (error as { code?: unknown } | undefined)?.code === 406;
}

/** The consumer's queues exist with other settings than it declares them with: what to do. */
function declarationRefused(topology: AmqpTopology, error: unknown): ConfigError {
  return new ConfigError(
    `RabbitMQ refused the declaration of queue "${topology.queue}" or "${topology.deadLetterQueue}" (${describeError(error)}): ` +
      'the consumer declares both durable, with no arguments (docs/brokers.md#the-queues-it-declares). Declare them that way, ' +
      'or delete the queue that was declared otherwise and let the consumer declare it.',
    { cause: error },
  );
}
