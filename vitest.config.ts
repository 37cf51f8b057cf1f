import { readFileSync } from 'node:fs';
import { join, resolve as resolvePath } from 'node:path';
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';
import { BROKERS, BROKER_TAGS, brokerAbsence, type BrokerTag } from './test/support/broker-files.js';
import { REDIS_TAG } from './test/support/redis-files.js';
import { redisAbsence } from './test/support/service-urls.js';
import { inCi } from './test/support/system-tools.js';

/** The package's entry points (package.json "exports"), by the specifier users import. */
const entryPoints: Record<string, string> = {
  'idempotent-jobs': './src/index.ts',
  'idempotent-jobs/amqp': './src/amqp/index.ts',
  'idempotent-jobs/nats': './src/nats/index.ts',
  'idempotent-jobs/otel': './src/otel/index.ts',
  'idempotent-jobs/process': './src/process/index.ts',
  'idempotent-jobs/store': './src/store/index.ts',
  'idempotent-jobs/typeorm': './src/typeorm/index.ts',
  'idempotent-jobs/nestjs': './src/nestjs/index.ts',
  'idempotent-jobs/bull-board': './src/bull-board/index.ts',
  'idempotent-jobs/http-idempotency': './src/http-idempotency/index.ts',
};

/**
 * `--exclude` globs given on the command line (`npm test -- --exclude test/x.test.ts`, as
 * `.ci/run` does): Vitest applies them to the root configuration only, not to its projects, so
 * they are passed on to each project here.
 */
function excludesFromCommandLine(argv: readonly string[] = process.argv): string[] {
  const globs: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--exclude' && i + 1 < argv.length) globs.push(argv[++i]!);
    else if (arg.startsWith('--exclude=')) globs.push(arg.slice('--exclude='.length));
  }
  return globs;
}
const excluded = ['test/chaos/**', 'node_modules/**', ...excludesFromCommandLine()];

/** The files that start a Patroni cluster (test/support/patroni-cluster.ts). */
const failoverClusterFiles = ['test/patroni-cluster.test.ts', 'test/patroni-async.test.ts', 'test/read-only-store.test.ts'];

// The examples import the library as its users do; inside the repository that is its source.
// Each specifier matches exactly: a plain string alias would also rewrite 'idempotent-jobs/amqp'
// as a path under the root's file.
const resolve = {
  alias: [
    ...Object.entries(entryPoints).map(([specifier, file]) => ({
      find: new RegExp(`^${specifier}$`),
      replacement: fileURLToPath(new URL(file, import.meta.url)),
    })),
    ...postgresJsAlias(process.env.TEST_POSTGRES_JS_DIR),
  ],
};

/**
 * `TEST_POSTGRES_JS_DIR`: the package directory of another postgres.js release, imported by the
 * tests as `postgres` in place of the installed one, so that CI runs the postgres.js data
 * layer's tests on each major the optional peer range accepts.
 */
function postgresJsAlias(directory: string | undefined): Array<{ find: RegExp; replacement: string }> {
  if (!directory) return [];
  const manifest = JSON.parse(readFileSync(join(directory, 'package.json'), 'utf8')) as {
    exports?: { '.'?: { import?: string; default?: string } };
    main?: string;
  };
  const entry = manifest.exports?.['.'];
  const esm = entry?.import ?? entry?.default ?? manifest.main;
  if (!esm) throw new Error(`TEST_POSTGRES_JS_DIR=${directory}: its package.json names no entry point`);
  return [{ find: /^postgres$/, replacement: resolvePath(directory, esm) }];
}

// Which files run depends on whether the run will have Redis, so it is asked here, before the
// set-up (test/support/service-urls.ts): without one, the files marked `@module-tag redis` are
// skipped, or under CI=true fail at their start (test/support/redis-files.ts).
const redisMissing = await redisAbsence();

// The brokers are optional integrations: a run without one skips (under CI=true, fails) the files
// marked for it (test/support/broker-files.ts).
const brokersMissing = Object.fromEntries(await Promise.all(BROKER_TAGS.map(async (tag) => [tag, (await brokerAbsence(tag)) ?? ''] as const))) as Record<BrokerTag, string>;

/** The file tags: a file marked `// @module-tag <name>` has the tag on each of its tests. */
const tags = [
  { name: REDIS_TAG, description: 'the file needs Redis', skip: redisMissing !== undefined && !inCi() },
  ...BROKER_TAGS.map((tag) => ({ name: tag, description: `the file needs ${BROKERS[tag].title}`, skip: brokersMissing[tag] !== '' && !inCi() })),
];

/** What every project shares. The set-up (Postgres, Redis, PgBouncer) is the root's: it runs once for all. */
const shared = { pool: 'forks', testTimeout: 60_000, hookTimeout: 60_000, tags, setupFiles: 'test/support/redis-guard.ts' } as const;

export default defineConfig({
  test: {
    globalSetup: ['test/support/global-setup.ts'],
    // For the set-up and the guard: why this run has no Redis ('' when it has one).
    provide: { redisMissing: redisMissing ?? '', brokersMissing },
    projects: [
      {
        resolve,
        test: {
          ...shared,
          name: 'tests',
          include: ['test/**/*.test.ts'],
          exclude: [...failoverClusterFiles, ...excluded],
          // Two cores here; files run in pairs. Each file has its own schema and Redis prefix.
          maxWorkers: 2,
          sequence: { groupOrder: 0 },
        },
      },
      {
        resolve,
        test: {
          ...shared,
          name: 'failover clusters',
          include: failoverClusterFiles,
          exclude: excluded,
          // Each file starts a cluster of its own (etcd, Patroni members, HAProxy) and times
          // failovers against Patroni's lock TTL: one file at a time, after the rest, so that no
          // other load stretches a failover past its test's time.
          maxWorkers: 1,
          sequence: { groupOrder: 1 },
        },
      },
    ],
  },
});
