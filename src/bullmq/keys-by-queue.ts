import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';

/**
 * Which claim protocol a BullMQ queue's jobs are claimed under, for the queues a framework
 * integration opened itself (the NestJS module's `registerQueue`): Bull Board's NestJS module
 * builds each queue adapter from the queue alone (`new adapter(queue, options)`), so the Bull
 * Board adapter finds the keys of such a queue here. Weak: a closed, dropped queue leaves nothing.
 */
const keysByQueue = new WeakMap<object, IdempotencyKeys>();

/** Records that `queue`'s jobs are claimed under `keys`. */
export function rememberKeysOf(queue: object, keys: IdempotencyKeys): void {
  keysByQueue.set(queue, keys);
}

/** The keys recorded for `queue` by {@link rememberKeysOf}, if any. */
export function keysOfQueue(queue: object): IdempotencyKeys | undefined {
  return keysByQueue.get(queue);
}
