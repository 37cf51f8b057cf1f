import { Redis } from 'ioredis';

/**
 * Connects to Redis once, with a short timeout and no retries, and sends PING: undefined when it
 * answered, else the error. A connection of its own, closed before returning.
 */
export async function redisAnswerProblem(redisUrl: string, timeoutMs: number): Promise<unknown> {
  const redis = new Redis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 0, connectTimeout: timeoutMs, retryStrategy: () => null });
  redis.on('error', () => {});
  try {
    await redis.connect();
    await redis.ping();
    return undefined;
  } catch (error) {
    return error;
  } finally {
    redis.disconnect();
  }
}
