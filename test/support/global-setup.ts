import type { TestProject } from 'vitest/node';
import { PgBouncer } from './pgbouncer.js';
import { resolveServiceUrls } from './service-urls.js';

declare module 'vitest' {
  export interface ProvidedContext {
    /** Where the store's pools connect: Postgres, or a PgBouncer in front of it (`TEST_PGBOUNCER=1`). */
    databaseUrl: string;
    /** Postgres itself, for what needs a session (migrations, advisory locks, LISTEN); `databaseUrl` without a pooler. */
    databaseDirectUrl: string;
    redisUrl: string;
  }
}

/** Server connections of the tests' PgBouncer: fewer than the test files' pools hold clients, so transactions share them. */
const PGBOUNCER_POOL_SIZE = 20;

/**
 * Resolves Postgres and Redis once for the whole run and hands the URLs to every test file.
 * With `TEST_PGBOUNCER=1`, starts a PgBouncer in transaction mode in front of that Postgres
 * (test/support/pgbouncer.ts) and hands its URL out as `databaseUrl`, Postgres's own as
 * `databaseDirectUrl`; it is stopped after the run.
 */
export default async function setup(project: TestProject) {
  const urls = await resolveServiceUrls().catch((error: Error) => {
    // One message that says how to get the servers, not a stack trace from inside the set-up.
    console.error(`\n${error.message}\n`);
    process.exit(1);
  });
  const bouncer = /^(1|true|yes)$/i.test(process.env.TEST_PGBOUNCER ?? '')
    ? await PgBouncer.start({ upstream: urls.databaseUrl, poolSize: PGBOUNCER_POOL_SIZE })
    : undefined;
  const databaseUrl = bouncer ? bouncer.url() : urls.databaseUrl;
  console.log(
    `[tests] Node ${process.version}; Postgres and Redis from ${urls.source}: ${urls.databaseUrl} ${urls.redisUrl}` +
      (bouncer ? `; the store through PgBouncer (transaction mode, ${PGBOUNCER_POOL_SIZE} server connections) at ${databaseUrl}` : ''),
  );
  project.provide('databaseUrl', databaseUrl);
  project.provide('databaseDirectUrl', urls.databaseUrl);
  project.provide('redisUrl', urls.redisUrl);
  return async () => {
    await bouncer?.stop();
    await urls.stop?.();
  };
}
