import { Queue, type ConnectionOptions } from 'bullmq';
import { assertKeysFitConnection } from './redis-connection.js';

/**
 * BullMQ `Queue` handles opened on first use, one per queue name, for components that write to
 * whichever queue a row names (the outbox relay, the sweeper). Each handle holds a Redis
 * connection, so they are kept and closed together.
 */
export class QueuesByName {
  readonly #queues = new Map<string, Queue>();

  constructor(
    private readonly options: {
      readonly connection: ConnectionOptions;
      readonly prefix?: string;
      /** Told of each queue's Redis connection errors (ioredis reconnects by itself). */
      readonly onError?: (error: Error, queue: string) => void;
    },
  ) {}

  /** The queue named `name`, opened on first use. */
  get(name: string): Queue {
    let queue = this.#queues.get(name);
    if (!queue) {
      assertKeysFitConnection(this.options.connection, this.options.prefix, name);
      queue = new Queue(name, { connection: this.options.connection, prefix: this.options.prefix });
      const { onError } = this.options;
      if (onError) queue.on('error', (error) => onError(error, name));
      this.#queues.set(name, queue);
    }
    return queue;
  }

  /** Closes every queue opened so far. */
  async close(): Promise<void> {
    const queues = [...this.#queues.values()];
    this.#queues.clear();
    await Promise.all(queues.map((queue) => queue.close()));
  }
}
