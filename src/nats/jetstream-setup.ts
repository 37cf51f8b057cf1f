import { AckPolicy, DeliverPolicy, jetstreamManager, type ConsumerConfig, type StreamConfig } from '@nats-io/jetstream';
import { connect, nanos, type NatsConnection } from '@nats-io/transport-node';

/** What {@link ensureJetStreamConsumer} creates when it is missing. */
export interface JetStreamConsumerSetup {
  /** The stream the messages are in. */
  readonly stream: string;
  /** Its subjects, to create the stream when it is missing. @defaultValue unset: the stream must exist */
  readonly subjects?: readonly string[];
  /** The durable pull consumer's name. */
  readonly consumer: string;
  /** JetStream's redelivery timer; the consumer's heartbeat must beat well within it. @defaultValue `30_000` */
  readonly ackWaitMs?: number;
  /** Where dead letters go, and the stream that keeps them (created when missing). @defaultValue unset: none */
  readonly deadLetter?: {
    /** The stream that keeps dead letters (created, capturing `subject`, when missing). */
    readonly stream: string;
    /** The subject dead letters are published to (the consumer's `deadLetterSubject`). */
    readonly subject: string;
  };
  /** Further stream settings for a stream created here. @defaultValue none (JetStream's defaults) */
  readonly streamConfig?: Partial<StreamConfig>;
  /** Further consumer settings. @defaultValue none (explicit acks, no delivery limit, AckWait `ackWaitMs`) */
  readonly consumerConfig?: Partial<ConsumerConfig>;
}

/**
 * Creates the stream (when `subjects` are given), the dead-letter stream and the durable pull
 * consumer unless they exist (an existing one is left as it is). The consumer acknowledges explicitly and has no
 * `max_deliver` limit: JetStream counts a delayed `nak` as a delivery, and a message deferred
 * while its key is in progress elsewhere must not run out of deliveries; the consumer counts
 * failed runs itself (`maxAttempts`, by the key's claims).
 */
export async function ensureJetStreamConsumer(connection: NatsConnection, setup: JetStreamConsumerSetup): Promise<void> {
  const jsm = await jetstreamManager(connection);
  if (setup.subjects) {
    await ensureStream(jsm, { ...setup.streamConfig, name: setup.stream, subjects: [...setup.subjects] });
  } else {
    await jsm.streams.info(setup.stream).catch((error: unknown) => {
      throw isNotFound(error) ? new Error(`JetStream stream "${setup.stream}" does not exist; create it (or pass its subjects to create it here).`, { cause: error }) : error;
    });
  }
  if (setup.deadLetter) await ensureStream(jsm, { name: setup.deadLetter.stream, subjects: [setup.deadLetter.subject] });
  try {
    await jsm.consumers.info(setup.stream, setup.consumer);
  } catch (error) {
    if (!isNotFound(error)) throw error;
    await jsm.consumers.add(setup.stream, {
      deliver_policy: DeliverPolicy.All,
      ...setup.consumerConfig,
      durable_name: setup.consumer,
      ack_policy: AckPolicy.Explicit,
      ack_wait: nanos(setup.ackWaitMs ?? 30_000),
      max_deliver: -1,
    });
  }
}

async function ensureStream(jsm: Awaited<ReturnType<typeof jetstreamManager>>, config: Partial<StreamConfig> & { name: string }): Promise<void> {
  try {
    await jsm.streams.info(config.name);
  } catch (error) {
    if (!isNotFound(error)) throw error;
    await jsm.streams.add(config);
  }
}

function isNotFound(error: unknown): boolean {
  return error instanceof Error && /not found/i.test(error.message);
}

/** {@link ensureJetStreamConsumer} over a connection of its own to `servers`, closed afterwards. */
export async function ensureJetStreamConsumerAt(servers: string, setup: JetStreamConsumerSetup): Promise<void> {
  const connection = await connect({ servers });
  try {
    await ensureJetStreamConsumer(connection, setup);
  } finally {
    await connection.close();
  }
}
