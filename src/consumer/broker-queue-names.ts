/**
 * How a broker consumer names where a key's message came from, in the key's `queue` column:
 * `amqp:<queue>` on RabbitMQ, `nats:<stream>/<consumer>` on JetStream. BullMQ refuses a colon
 * in a queue name, so such a name never names a BullMQ queue: the sweeper, which asks BullMQ
 * about a stuck key's job, tells broker keys from BullMQ ones by it and leaves them to their
 * broker's redelivery.
 */
export function brokerQueueName(broker: 'amqp' | 'nats', source: string): string {
  return `${broker}:${source}`;
}

/** True when a key's recorded queue is a broker consumer's ({@link brokerQueueName}), not a BullMQ queue. */
export function isBrokerQueueName(queue: string): boolean {
  return queue.startsWith('amqp:') || queue.startsWith('nats:');
}
