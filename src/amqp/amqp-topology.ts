import type { Channel } from 'amqplib';

/**
 * The queues one consumer uses, all on the default exchange:
 *
 * - `queue`: where publishers send; the consumer reads it.
 * - `<queue>.delay.<ms>`: delay queues, one per power of two of milliseconds. Each has a
 *   queue-wide `x-message-ttl` and dead-letters expired messages back to `queue`. A deferred
 *   message goes to the smallest tier not shorter than its delay.
 * - `<queue>.dead-letter`: poison, key-reused and permanently failed messages, with the reason
 *   in the `x-idempotent-reason` header.
 *
 * Why tiers and not one retry queue with a per-message `expiration`: RabbitMQ expires messages
 * only at the head of a queue, so one long delay (a store-fault backoff of 15 s) would hold up
 * every short one (a 100 ms deferral) queued behind it. A queue per tier has one TTL, so its
 * head always expires first. Why not the delayed-message exchange: it is a plugin, not on every
 * server, and it keeps delayed messages on one node only; TTL and dead-lettering are core.
 */
export interface AmqpTopology {
  /** The queue publishers send to and the consumer reads. */
  readonly queue: string;
  /** Where poison, key-reused and permanently failed messages go. */
  readonly deadLetterQueue: string;
  /** The delay queue for a delay of `delayMs`, and its TTL (`delayMs` rounded up to a tier). */
  delayQueueFor(delayMs: number): {
    /** The delay queue's name, `<prefix>.<ttlMs>`. */
    readonly name: string;
    /** Its messages' time to live: the tier's delay. */
    readonly ttlMs: number;
  };
  /** Every delay queue name, shortest first (for operators and cleanup). */
  readonly delayQueues: readonly string[];
}

/** Shortest delay tier (2^6 ms). */
const MIN_TIER_EXPONENT = 6;
/** Longest delay tier (2^22 ms, about 70 minutes); longer delays are capped to it. */
const MAX_TIER_EXPONENT = 22;

/** The topology of a consumer of `queue`. */
export function amqpTopology(queue: string, options: { deadLetterQueue?: string; delayQueuePrefix?: string } = {}): AmqpTopology {
  const prefix = options.delayQueuePrefix ?? `${queue}.delay`;
  const tiers: number[] = [];
  for (let exponent = MIN_TIER_EXPONENT; exponent <= MAX_TIER_EXPONENT; exponent++) tiers.push(2 ** exponent);
  return {
    queue,
    deadLetterQueue: options.deadLetterQueue ?? `${queue}.dead-letter`,
    delayQueueFor(delayMs) {
      const ttlMs = tiers.find((tier) => tier >= delayMs) ?? tiers.at(-1)!;
      return { name: `${prefix}.${ttlMs}`, ttlMs };
    },
    delayQueues: tiers.map((tier) => `${prefix}.${tier}`),
  };
}

/** Declares the consumer's queue and dead-letter queue (durable). Delay queues are declared when first used. */
export async function declareTopology(channel: Channel, topology: AmqpTopology): Promise<void> {
  await channel.assertQueue(topology.queue, { durable: true });
  await channel.assertQueue(topology.deadLetterQueue, { durable: true });
}

/** Declares one delay queue: its TTL, and dead-lettering back to the consumer's queue. */
export async function declareDelayQueue(channel: Channel, topology: AmqpTopology, delay: { name: string; ttlMs: number }): Promise<void> {
  await channel.assertQueue(delay.name, {
    durable: true,
    arguments: {
      'x-message-ttl': delay.ttlMs,
      'x-dead-letter-exchange': '',
      'x-dead-letter-routing-key': topology.queue,
    },
  });
}
