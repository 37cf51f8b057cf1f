import { openQueue, type AnyQueue, type QueueConnectionOptions } from './queue-connection.js';
import { assertKeysFitConnection } from './redis-connection.js';

/**
 * BullMQ `Queue` handles opened on first use, one per queue name, for components that write to
 * whichever queue a row names (the outbox relay, the sweeper). Each handle holds a connection
 * (Redis, or a Postgres pool), so they are kept and closed together.
 */
export class QueuesByName {
  readonly #queues = new Map<string, AnyQueue>();

  constructor(
    private readonly options: QueueConnectionOptions & {
      /** Told of each queue's connection errors (ioredis and node-postgres reconnect by themselves). */
      readonly onError?: (error: Error, queue: string) => void;
    },
  ) {}

  /** The queue named `name`, opened on first use. */
  get(name: string): AnyQueue {
    let queue = this.#queues.get(name);
    if (!queue) {
      assertKeysFitConnection(this.options, name);
      queue = openQueue(name, this.options);
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
