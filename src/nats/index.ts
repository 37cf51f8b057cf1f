/**
 * idempotent-jobs/nats: the idempotent consumer for NATS JetStream. Needs the optional peer
 * dependencies `@nats-io/jetstream` and `@nats-io/transport-node`.
 *
 * @packageDocumentation
 * @module idempotent-jobs/nats
 */
export type { IdempotentNatsConsumerOptions, NatsConsumerEvent, NatsConsumerEventKind, NatsJobContext, NatsJobHandler } from './idempotent-nats-consumer.js';
export { IdempotentNatsConsumer, createIdempotentNatsConsumer } from './idempotent-nats-consumer.js';
export type { NatsKeySource, NatsMessageLike } from './nats-message-identity.js';
export { NATS_MSG_ID_HEADER, identityFromNatsMessage } from './nats-message-identity.js';
export type { DeadLetterReason } from './dead-letter.js';
export {
  DEAD_LETTER_ERROR_HEADER,
  DEAD_LETTER_REASON_HEADER,
  DEAD_LETTER_SEQUENCE_HEADER,
  DEAD_LETTER_STREAM_HEADER,
  DEAD_LETTER_SUBJECT_HEADER,
} from './dead-letter.js';
export type { JetStreamConsumerSetup } from './jetstream-setup.js';
export { ensureJetStreamConsumer } from './jetstream-setup.js';
export type { NatsConsumerProcess, NatsConsumerProcessOptions } from '../runtime/nats-consumer-process.js';
export { startNatsConsumerProcess } from '../runtime/nats-consumer-process.js';
