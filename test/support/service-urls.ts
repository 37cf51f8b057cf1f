/**
 * Where the tests find Postgres and Redis, in this order:
 *   1. DATABASE_URL / REDIS_URL from the environment;
 *   2. testcontainers, when a container runtime is present (DOCKER_HOST or a docker socket);
 *   3. the local default ports (127.0.0.1:5432 as postgres or root, 127.0.0.1:6379).
 * If none answers, one error names all three ways.
 */
import { existsSync } from 'node:fs';
import { unansweredServices } from '../../src/runtime/services-answer.js';

export interface ServiceUrls {
  databaseUrl: string;
  redisUrl: string;
  source: 'environment' | 'testcontainers' | 'local defaults';
  stop?: () => Promise<void>;
}

const LOCAL_DATABASE_URLS = ['postgres://postgres@127.0.0.1:5432/postgres', 'postgres://root@127.0.0.1:5432/postgres'];
const LOCAL_REDIS_URL = 'redis://127.0.0.1:6379';

export async function resolveServiceUrls(): Promise<ServiceUrls> {
  const envDb = process.env.DATABASE_URL;
  const envRedis = process.env.REDIS_URL;
  if (envDb && envRedis) {
    try {
      await assertAnswers(envDb, envRedis, 'DATABASE_URL / REDIS_URL');
    } catch (error) {
      throw noServices(`Tried DATABASE_URL / REDIS_URL: ${(error as Error).message}`);
    }
    return { databaseUrl: envDb, redisUrl: envRedis, source: 'environment' };
  }
  if (containerRuntimePresent()) {
    return startContainers(envDb, envRedis);
  }
  const failures: string[] = [];
  for (const databaseUrl of envDb ? [envDb] : LOCAL_DATABASE_URLS) {
    const redisUrl = envRedis ?? LOCAL_REDIS_URL;
    try {
      await assertAnswers(databaseUrl, redisUrl, 'local defaults');
      return { databaseUrl, redisUrl, source: 'local defaults' };
    } catch (error) {
      failures.push((error as Error).message);
    }
  }
  throw noServices(`Tried the local defaults: ${failures.join('; ')}`);
}

/** The one message the test run prints when it has no Postgres or Redis: what it tried and the three ways to provide them. */
function noServices(tried: string): Error {
  return new Error(
    'No Postgres/Redis for the tests. Provide them one of three ways:\n' +
      '  1. set DATABASE_URL and REDIS_URL (e.g. postgres://postgres@127.0.0.1:5432/postgres, redis://127.0.0.1:6379);\n' +
      '  2. run a container runtime (Docker/Podman) so testcontainers can start postgres:16 and redis:7;\n' +
      '  3. run Postgres on 127.0.0.1:5432 (trust auth, user postgres or root) and Redis on 127.0.0.1:6379\n' +
      '     (Debian/Ubuntu: apt-get install postgresql redis-server; or `docker compose up -d postgres redis`).\n' +
      tried,
  );
}

function containerRuntimePresent(): boolean {
  return Boolean(process.env.DOCKER_HOST) || existsSync('/var/run/docker.sock');
}

async function startContainers(envDb?: string, envRedis?: string): Promise<ServiceUrls> {
  const stops: Array<() => Promise<unknown>> = [];
  let databaseUrl = envDb;
  let redisUrl = envRedis;
  if (!databaseUrl) {
    const { PostgreSqlContainer } = await import('@testcontainers/postgresql');
    const container = await new PostgreSqlContainer('postgres:16-alpine').start();
    stops.push(() => container.stop());
    databaseUrl = container.getConnectionUri();
  }
  if (!redisUrl) {
    const { RedisContainer } = await import('@testcontainers/redis');
    const container = await new RedisContainer('redis:7-alpine').start();
    stops.push(() => container.stop());
    redisUrl = container.getConnectionUrl();
  }
  return {
    databaseUrl,
    redisUrl,
    source: 'testcontainers',
    stop: async () => {
      for (const stop of stops) await stop();
    },
  };
}

async function assertAnswers(databaseUrl: string, redisUrl: string, via: string): Promise<void> {
  const problems = await unansweredServices(databaseUrl, redisUrl);
  if (problems.length > 0) throw new Error(problems.map((problem) => `${problem} (${via})`).join('; '));
}
