/**
 * `idempotent-jobs/amqp`: the RabbitMQ consumer (needs the optional peer dependency `amqplib`).
 *
 * @packageDocumentation
 * @module idempotent-jobs/amqp
 */
export type { AmqpConsumerOptions, AmqpJobContext, AmqpJobHandler, DeadLetterReason } from './amqp-consumer.js';
export { AmqpConsumer, ATTEMPTS_HEADER, DEFERRALS_HEADER, ERROR_HEADER, REASON_HEADER, createAmqpConsumer } from './amqp-consumer.js';
export type { AmqpIdentityOptions } from './amqp-identity.js';
export { amqpIdentityReader } from './amqp-identity.js';
export type { AmqpTopology } from './amqp-topology.js';
export { amqpTopology } from './amqp-topology.js';
export type { AmqpConsumerProcess, AmqpConsumerProcessOptions } from '../runtime/amqp-consumer-process.js';
export { startAmqpConsumerProcess } from '../runtime/amqp-consumer-process.js';
