import { redisAnswerProblem } from '../bullmq/redis-answer.js';
import { postgresAnswerProblem } from '../store/postgres-answer.js';

/** Which of Postgres and Redis did not answer, each with a line naming its URL and the error. */
export interface ServicesAnswer {
  /** Set when Postgres did not answer. */
  readonly postgres?: string;
  /** Set when Redis did not answer. */
  readonly redis?: string;
}

/**
 * Asks Postgres and Redis once each, with a short timeout, whether they answer: for a starting
 * tool that chooses what to run on (the demo falls back to the Postgres queue backend, or to an
 * embedded Postgres).
 */
export async function servicesAnswer(databaseUrl: string, redisUrl: string, timeoutMs = 3000): Promise<ServicesAnswer> {
  const [postgres, redis] = await Promise.all([postgresAnswerProblem(databaseUrl, timeoutMs), redisAnswerProblem(redisUrl, timeoutMs)]);
  return {
    ...(postgres === undefined ? {} : { postgres: `Postgres at ${databaseUrl} did not answer: ${describe(postgres)}` }),
    ...(redis === undefined ? {} : { redis: `Redis at ${redisUrl} did not answer: ${describe(redis)}` }),
  };
}

/**
 * Asks Postgres and Redis once each, with a short timeout, whether they answer. Resolves to a
 * line per server that did not (empty when both did), each naming the URL and the error, so a
 * starting tool (the tests, the demo) can say in one message what is missing and how to get it
 * instead of failing later with a connection error's stack trace.
 */
export async function unansweredServices(databaseUrl: string, redisUrl: string, timeoutMs = 3000): Promise<string[]> {
  const answer = await servicesAnswer(databaseUrl, redisUrl, timeoutMs);
  return [answer.postgres, answer.redis].filter((problem): problem is string => problem !== undefined);
}

function describe(error: unknown): string {
  if (error instanceof AggregateError && error.errors.length > 0) return error.errors.map(describe).join('; ');
  return error instanceof Error ? error.message || error.name : String(error);
}
