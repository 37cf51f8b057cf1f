import { Redis } from 'ioredis';
import pg from 'pg';

/**
 * Asks Postgres and Redis once each, with a short timeout, whether they answer. Resolves to a
 * line per server that did not (empty when both did), each naming the URL and the error, so a
 * starting tool (the tests, the demo) can say in one message what is missing and how to get it
 * instead of failing later with a connection error's stack trace.
 */
export async function unansweredServices(databaseUrl: string, redisUrl: string, timeoutMs = 3000): Promise<string[]> {
  const [postgres, redis] = await Promise.all([postgresProblem(databaseUrl, timeoutMs), redisProblem(redisUrl, timeoutMs)]);
  return [postgres, redis].filter((problem): problem is string => problem !== undefined);
}

async function postgresProblem(databaseUrl: string, timeoutMs: number): Promise<string | undefined> {
  const client = new pg.Client({ connectionString: databaseUrl, connectionTimeoutMillis: timeoutMs });
  client.on('error', () => {});
  try {
    await client.connect();
    await client.query('select 1');
    return undefined;
  } catch (error) {
    return `Postgres at ${databaseUrl} did not answer: ${describe(error)}`;
  } finally {
    await client.end().catch(() => {});
  }
}

async function redisProblem(redisUrl: string, timeoutMs: number): Promise<string | undefined> {
  const redis = new Redis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 0, connectTimeout: timeoutMs, retryStrategy: () => null });
  redis.on('error', () => {});
  try {
    await redis.connect();
    await redis.ping();
    return undefined;
  } catch (error) {
    return `Redis at ${redisUrl} did not answer: ${describe(error)}`;
  } finally {
    redis.disconnect();
  }
}

function describe(error: unknown): string {
  if (error instanceof AggregateError && error.errors.length > 0) return error.errors.map(describe).join('; ');
  return error instanceof Error ? error.message || error.name : String(error);
}
