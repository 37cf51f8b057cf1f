import type { TestProject } from 'vitest/node';
import { PgBouncer } from './pgbouncer.js';
import { BROKER_TAGS, missingBrokerLine, type BrokerTag } from './broker-files.js';
import { missingRedisLine } from './redis-files.js';
import { resolveServiceUrls } from './service-urls.js';
import { SYSTEM_TOOLS, findSystemTool, missingToolLine, type SystemToolName } from './system-tools.js';

declare module 'vitest' {
  export interface ProvidedContext {
    /** Where the store's pools connect: Postgres, or a PgBouncer in front of it (`TEST_PGBOUNCER=1`). */
    databaseUrl: string;
    /** Postgres itself, for what needs a session (migrations, advisory locks, LISTEN); `databaseUrl` without a pooler. */
    databaseDirectUrl: string;
    redisUrl: string;
    /**
     * Why this run has no Redis (the URL tried and the error), from vitest.config.ts; '' when it
     * has one. Without one the files marked `@module-tag redis` are skipped (under CI=true, fail).
     */
    redisMissing: string;
    /** Per broker file tag, why this run has no such broker ('' when it has one); see ./broker-files.ts. */
    brokersMissing: Record<BrokerTag, string>;
    /** Hash partitions of each test file's keys table (`TEST_KEYS_PARTITIONS=16`); 0: one plain table. */
    keysPartitions: number;
  }
}

/** Server connections of the tests' PgBouncer: fewer than the test files' pools hold clients, so transactions share them. */
const PGBOUNCER_POOL_SIZE = 20;

/**
 * Resolves Postgres and Redis once for the whole run and hands the URLs to every test file;
 * where no Postgres answers and none is named, starts an embedded one and stops it after the
 * run, and where no Redis answers, says in one line that the files that need it are skipped
 * (./service-urls.ts, ./redis-files.ts). With `TEST_PGBOUNCER=1`, starts a PgBouncer in transaction mode in front of that Postgres
 * (test/support/pgbouncer.ts) and hands its URL out as `databaseUrl`, Postgres's own as
 * `databaseDirectUrl`; it is stopped after the run. With `TEST_KEYS_PARTITIONS=<n>`, every test
 * file's keys table is hash-partitioned in n partitions (the protocol's tests on that layout).
 */
export default async function setup(project: TestProject) {
  const redisMissing = project.getProvidedContext().redisMissing;
  const urls = await resolveServiceUrls(redisMissing || undefined).catch((error: Error) => {
    // One message that says how to get the servers, not a stack trace from inside the set-up.
    console.error(`\n${error.message}\n`);
    process.exit(1);
  });
  const bouncer = /^(1|true|yes)$/i.test(process.env.TEST_PGBOUNCER ?? '')
    ? await PgBouncer.start({ upstream: urls.databaseUrl, poolSize: PGBOUNCER_POOL_SIZE })
    : undefined;
  const databaseUrl = bouncer ? bouncer.url() : urls.databaseUrl;
  const keysPartitions = keysPartitionsFromEnv();
  console.log(
    `[tests] Node ${process.version}; Postgres ${urls.postgresFrom}: ${urls.databaseUrl}; ${redisMissing ? 'no Redis' : `Redis ${urls.redisFrom}: ${urls.redisUrl}`}` +
      (bouncer ? `; the store through PgBouncer (transaction mode, ${PGBOUNCER_POOL_SIZE} server connections) at ${databaseUrl}` : '') +
      (keysPartitions > 0 ? `; keys tables in ${keysPartitions} hash partitions` : ''),
  );
  if (redisMissing) console.log(`[tests] ${missingRedisLine(redisMissing)}`);
  const brokersMissing = project.getProvidedContext().brokersMissing;
  for (const tag of BROKER_TAGS) if (brokersMissing[tag]) console.log(`[tests] ${missingBrokerLine(tag, brokersMissing[tag])}`);
  // One line per program a test file needs and does not find (./system-tools.ts): outside CI
  // its tests are skipped, under CI=true the file fails.
  for (const name of Object.keys(SYSTEM_TOOLS) as SystemToolName[]) {
    if (findSystemTool(name) === undefined) console.log(`[tests] ${missingToolLine(name)}`);
  }
  project.provide('databaseUrl', databaseUrl);
  project.provide('databaseDirectUrl', urls.databaseUrl);
  project.provide('redisUrl', urls.redisUrl);
  project.provide('keysPartitions', keysPartitions);
  return async () => {
    await bouncer?.stop();
    await urls.stop?.();
  };
}

function keysPartitionsFromEnv(): number {
  const value = process.env.TEST_KEYS_PARTITIONS ?? '';
  if (value === '') return 0;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0) throw new Error(`TEST_KEYS_PARTITIONS must be a whole number of partitions, got "${value}"`);
  return n;
}
