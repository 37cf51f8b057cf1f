/**
 * Where the tests find Postgres and Redis, in this order:
 *   1. DATABASE_URL / REDIS_URL from the environment (each must answer when set);
 *   2. testcontainers, when a container runtime is present (DOCKER_HOST or a docker socket) and
 *      no local port is named;
 *   3. the local defaults: 127.0.0.1:5432 as postgres or root, 127.0.0.1:6379 (other ports with
 *      TEST_LOCAL_POSTGRES_PORT / TEST_LOCAL_REDIS_PORT, which also choose them over testcontainers).
 * Where no Postgres answers at the local defaults, an embedded one is started (demo/embedded-postgres.ts,
 * the one `npm run demo` starts) and stopped after the run. Where no Redis answers there, the run
 * goes on without it: vitest.config.ts asks {@link redisAbsence} before the set-up and skips
 * the files marked `@module-tag redis` (./redis-files.ts).
 */
import { existsSync } from 'node:fs';
import { startEmbeddedPostgres } from '../../demo/embedded-postgres.js';
import { servicesAnswer } from '../../src/runtime/services-answer.js';

export interface ServiceUrls {
  databaseUrl: string;
  /** Redis's URL; when the run has no Redis, the one that did not answer. */
  redisUrl: string;
  /** Where Postgres came from, for the run's first line: "from DATABASE_URL", "embedded (…)". */
  postgresFrom: string;
  /** Where Redis came from, the same way (unused when the run has no Redis). */
  redisFrom: string;
  stop?: () => Promise<void>;
}

interface LocalDefaults {
  readonly databaseUrls: readonly string[];
  readonly redisUrl: string;
}

/** The local defaults, on the ports the environment names (5432 and 6379 unless it names others). */
function localDefaults(env: NodeJS.ProcessEnv): LocalDefaults {
  const postgresPort = portFrom('TEST_LOCAL_POSTGRES_PORT', env.TEST_LOCAL_POSTGRES_PORT, 5432);
  const redisPort = portFrom('TEST_LOCAL_REDIS_PORT', env.TEST_LOCAL_REDIS_PORT, 6379);
  return {
    databaseUrls: [`postgres://postgres@127.0.0.1:${postgresPort}/postgres`, `postgres://root@127.0.0.1:${postgresPort}/postgres`],
    redisUrl: `redis://127.0.0.1:${redisPort}`,
  };
}

function portFrom(variable: string, value: string | undefined, fallback: number): number {
  if (value === undefined || value === '') return fallback;
  const port = Number(value);
  if (!Number.isInteger(port) || port < 1 || port > 65_535) throw new Error(`${variable} must be a TCP port (1-65535), got "${value}"`);
  return port;
}

/** Whether testcontainers starts what the environment does not name. */
function containersChosen(env: NodeJS.ProcessEnv): boolean {
  const localPortNamed = Boolean(env.TEST_LOCAL_POSTGRES_PORT) || Boolean(env.TEST_LOCAL_REDIS_PORT);
  return !localPortNamed && (Boolean(env.DOCKER_HOST) || existsSync('/var/run/docker.sock'));
}

/**
 * Why this run will have no Redis (the local default's URL and the error), or undefined when it
 * will have one: REDIS_URL is set (the set-up then insists that it answers), testcontainers
 * will start one, or the local default answers. Asked by vitest.config.ts, before the set-up,
 * because which files run depends on it.
 */
export async function redisAbsence(env: NodeJS.ProcessEnv = process.env): Promise<string | undefined> {
  if (env.REDIS_URL || containersChosen(env)) return undefined;
  const local = localDefaults(env);
  return (await servicesAnswer(local.databaseUrls[0]!, local.redisUrl)).redis;
}

/**
 * Finds Postgres and Redis (or starts them) for the run. `redisMissing`: what vitest.config.ts
 * found ({@link redisAbsence}); when set, the run has no Redis and Redis is not asked again.
 */
export async function resolveServiceUrls(redisMissing: string | undefined, env: NodeJS.ProcessEnv = process.env): Promise<ServiceUrls> {
  const envDb = env.DATABASE_URL || undefined;
  const envRedis = env.REDIS_URL || undefined;
  const local = localDefaults(env);
  if (envDb && envRedis) {
    const answer = await servicesAnswer(envDb, envRedis);
    const problems = [answer.postgres, answer.redis].filter(Boolean).map((problem) => `${problem} (DATABASE_URL / REDIS_URL)`);
    if (problems.length > 0) throw noServices(`Tried DATABASE_URL / REDIS_URL: ${problems.join('; ')}`);
    return { databaseUrl: envDb, redisUrl: envRedis, postgresFrom: 'from DATABASE_URL', redisFrom: 'from REDIS_URL' };
  }
  if (containersChosen(env)) return startContainers(envDb, envRedis);

  const redisUrl = envRedis ?? local.redisUrl;
  if (redisMissing === undefined) {
    const redisProblem = (await servicesAnswer(envDb ?? local.databaseUrls[0]!, redisUrl)).redis;
    // REDIS_URL names the Redis the run must use; the local default was seen answering by the
    // config a moment ago. Either way, one that does not answer now stops the run.
    if (redisProblem) throw noServices(`Tried ${envRedis ? 'REDIS_URL' : 'the local default'}: ${redisProblem}`);
  }
  const redisFrom = envRedis ? 'from REDIS_URL' : 'from the local default';

  if (envDb) {
    const problem = (await servicesAnswer(envDb, redisUrl)).postgres;
    if (problem) throw noServices(`Tried DATABASE_URL: ${problem}`);
    return { databaseUrl: envDb, redisUrl, postgresFrom: 'from DATABASE_URL', redisFrom };
  }
  const failures: string[] = [];
  for (const databaseUrl of local.databaseUrls) {
    const problem = (await servicesAnswer(databaseUrl, redisUrl)).postgres;
    if (problem === undefined) return { databaseUrl, redisUrl, postgresFrom: 'from the local default', redisFrom };
    failures.push(problem);
  }
  // No Postgres anywhere: the one `npm run demo` starts in the same case.
  const embedded = await startEmbeddedPostgres({ purpose: 'tests', trust: true }).catch((error: Error) => {
    throw noServices(`Tried the local defaults: ${failures.join('; ')}; and ${error.message}`);
  });
  return {
    databaseUrl: embedded.url,
    redisUrl,
    postgresFrom: `embedded, started because none answered at the local defaults (${failures.join('; ')}); its data in ${embedded.directory}, removed at the end`,
    redisFrom,
    stop: () => embedded.stop(),
  };
}

/** The one message the test run prints when it cannot have Postgres (or a Redis it was told to use): what it tried and the ways to provide them. */
function noServices(tried: string): Error {
  return new Error(
    'No Postgres/Redis for the tests. Provide them one of three ways:\n' +
      '  1. set DATABASE_URL and REDIS_URL (e.g. postgres://postgres@127.0.0.1:5432/postgres, redis://127.0.0.1:6379);\n' +
      '  2. run a container runtime (Docker/Podman) so testcontainers can start postgres:16 and redis:7;\n' +
      '  3. run Postgres on 127.0.0.1:5432 (trust auth, user postgres or root) and Redis on 127.0.0.1:6379\n' +
      '     (Debian/Ubuntu: apt-get install postgresql redis-server; or `docker compose up -d postgres redis`).\n' +
      'Without 1 or 2, an embedded Postgres (the embedded-postgres dev dependency) stands in for a local Postgres that does not answer, and\n' +
      'the files that need Redis are skipped when a local Redis does not answer.\n' +
      tried,
  );
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
    postgresFrom: envDb ? 'from DATABASE_URL' : 'from testcontainers',
    redisFrom: envRedis ? 'from REDIS_URL' : 'from testcontainers',
    stop: async () => {
      for (const stop of stops) await stop();
    },
  };
}
