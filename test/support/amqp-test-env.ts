/**
 * Per-test-file RabbitMQ isolation: queue names of the file's own (a random suffix), every
 * queue a consumer declared deleted at teardown. Nothing else on the shared broker is touched.
 */
import { randomBytes } from 'node:crypto';
import { connect, type Channel, type ChannelModel, type GetMessage, type Options } from 'amqplib';
import { amqpTopology } from '../../src/amqp/amqp-topology.js';

export const AMQP_URL = process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672';

export interface AmqpTestEnv {
  readonly channel: Channel;
  /** A queue name unique to this file and call; its consumer's queues are deleted at teardown. */
  queueName(label: string): string;
  /** Publishes a JSON (or raw) body to `queue`, persistent. */
  publish(queue: string, body: unknown, options?: Options.Publish): void;
  /** Reads up to `max` messages from `queue`, acknowledging them. */
  drain(queue: string, max?: number): Promise<GetMessage[]>;
  /** Messages ready in `queue`. */
  depth(queue: string): Promise<number>;
  teardown(): Promise<void>;
}

export async function createAmqpTestEnv(name: string): Promise<AmqpTestEnv> {
  const suffix = randomBytes(4).toString('hex');
  const connection: ChannelModel = await connect(AMQP_URL);
  const channel = await connection.createChannel();
  channel.on('error', () => {});
  const queues: string[] = [];
  // A channel per inspection: a missing queue closes the channel it was asked on.
  const withChannel = async <T>(use: (reader: Channel) => Promise<T>): Promise<T> => {
    const reader = await connection.createChannel();
    reader.on('error', () => {});
    try {
      return await use(reader);
    } finally {
      await reader.close().catch(() => {});
    }
  };
  return {
    channel,
    queueName(label) {
      const queue = `ijtest.${name}.${label}.${suffix}`;
      queues.push(queue);
      return queue;
    },
    publish(queue, body, options = {}) {
      const content = Buffer.isBuffer(body) ? body : Buffer.from(JSON.stringify(body));
      channel.sendToQueue(queue, content, { persistent: true, contentType: 'application/json', ...options });
    },
    async drain(queue, max = 1_000) {
      return withChannel(async (reader) => {
        const got: GetMessage[] = [];
        while (got.length < max) {
          const message = await reader.get(queue, { noAck: true });
          if (message === false) break;
          got.push(message);
        }
        return got;
      });
    },
    async depth(queue) {
      return withChannel(async (reader) => (await reader.checkQueue(queue)).messageCount);
    },
    async teardown() {
      for (const queue of queues) {
        const topology = amqpTopology(queue);
        for (const each of [queue, topology.deadLetterQueue, ...topology.delayQueues]) {
          await withChannel((cleaner) => cleaner.deleteQueue(each)).catch(() => {});
        }
      }
      await connection.close().catch(() => {});
    },
  };
}
