/**
 * The README's test command on a machine where neither Postgres nor Redis answers and none is
 * named: the set-up starts an embedded Postgres (the one `npm run demo` starts) and stops it
 * after the run; the files that run on Postgres alone pass on it; the files marked
 * `@module-tag redis` are skipped, with one line saying which and why, and so are the files
 * marked for a broker (`rabbitmq`, `nats`) that does not answer; under CI=true they fail instead. The shared servers are hidden from a nested vitest run by pointing the local
 * defaults at ports where nothing answers (TEST_LOCAL_POSTGRES_PORT, TEST_LOCAL_REDIS_PORT),
 * never by stopping them.
 */
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileNamed, runNestedVitest, type NestedRun } from './support/nested-vitest.js';
import { afterAll, describe, expect, it } from 'vitest';
import { redisFiles } from './support/redis-files.js';
import { redisAbsence, resolveServiceUrls } from './support/service-urls.js';
import { freePort } from './chaos/private-redis.js';

/** Files that need Postgres only. */
const POSTGRES_FILES = ['test/migrate.test.ts', 'test/tombstones.test.ts'];
/** Files marked `@module-tag redis`. */
const REDIS_FILES = ['test/producer.test.ts', 'test/payment-report.test.ts'];
/** Files marked `@module-tag rabbitmq` and `@module-tag nats`. */
const BROKER_FILES = { 'test/amqp-consumer.test.ts': 'RabbitMQ', 'test/nats-cli.test.ts': 'NATS with JetStream' } as const;
const reports = mkdtempSync(join(tmpdir(), 'ij-service-urls-'));
afterAll(() => rmSync(reports, { recursive: true, force: true }));

interface NestedRunWithoutServers extends NestedRun {
  readonly redisPort: number;
  readonly brokerPorts: { readonly amqp: number; readonly nats: number };
}

/** A port on which nothing answers: one the kernel just handed out and that was closed again. */
const deadPort = freePort;

/** The environment of a machine with no Postgres and no Redis at the local defaults, and none named, and no broker answering. */
async function withoutServers(): Promise<NodeJS.ProcessEnv & { TEST_LOCAL_REDIS_PORT: string; AMQP_URL: string; NATS_URL: string }> {
  return {
    ...process.env,
    DATABASE_URL: '',
    REDIS_URL: '',
    TEST_LOCAL_POSTGRES_PORT: String(await deadPort()),
    TEST_LOCAL_REDIS_PORT: String(await deadPort()),
    AMQP_URL: `amqp://guest:guest@127.0.0.1:${await deadPort()}`,
    NATS_URL: `127.0.0.1:${await deadPort()}`,
  };
}

/** `npm test -- <files>` as a nested vitest run on a machine without servers, with CI set or not. */
async function runTests(ci: boolean): Promise<NestedRunWithoutServers> {
  const env = await withoutServers();
  const files = [...POSTGRES_FILES, ...REDIS_FILES, ...Object.keys(BROKER_FILES)];
  const run = await runNestedVitest(files, { ...env, CI: ci ? 'true' : '', TEST_PGBOUNCER: '', NO_COLOR: '1' }, join(reports, `${ci ? 'ci' : 'local'}.json`));
  const brokerPorts = { amqp: Number(new URL(env.AMQP_URL).port), nats: Number(env.NATS_URL.split(':')[1]) };
  return { ...run, redisPort: Number(env.TEST_LOCAL_REDIS_PORT), brokerPorts };
}

/** The run's first line, when it started an embedded Postgres: where its data was. */
function embeddedDataDirectory(output: string): string | undefined {
  return /^\[tests\] Node \S+; Postgres embedded, started because none answered at the local defaults \(.*\); its data in (\S+), removed at the end: postgres:\/\/\S+; no Redis$/m.exec(output)?.[1];
}

function expectPostgresFilesPassed(run: NestedRunWithoutServers): void {
  for (const file of POSTGRES_FILES) {
    const report = fileNamed(run, file);
    expect(report.status, `${file}\n${run.output}`).toBe('passed');
    expect(report.assertionResults.length, file).toBeGreaterThan(0);
    expect(report.assertionResults.every((test) => test.status === 'passed'), file).toBe(true);
  }
}

describe('the test run on a machine without Postgres and Redis', () => {
  it('asks for Redis only where the run would use the local default, and refuses a local port that is not one', async () => {
    const env = await withoutServers();
    expect(await redisAbsence(env)).toMatch(new RegExp(`^Redis at redis://127\\.0\\.0\\.1:${env.TEST_LOCAL_REDIS_PORT} did not answer: `));
    // A Redis the environment names is the run's, answering or not: the set-up insists on it.
    expect(await redisAbsence({ ...env, REDIS_URL: `redis://127.0.0.1:${env.TEST_LOCAL_REDIS_PORT}` })).toBeUndefined();
    await expect(resolveServiceUrls(undefined, { ...env, TEST_LOCAL_POSTGRES_PORT: 'abc' })).rejects.toThrow('TEST_LOCAL_POSTGRES_PORT must be a TCP port (1-65535), got "abc"');
    // A Postgres the environment names is not stood in for by an embedded one.
    await expect(resolveServiceUrls('no Redis', { ...env, DATABASE_URL: `postgres://postgres@127.0.0.1:${env.TEST_LOCAL_POSTGRES_PORT}/postgres` })).rejects.toThrow(
      /^No Postgres\/Redis for the tests\.[^]*Tried DATABASE_URL: Postgres at \S+ did not answer/,
    );
  });

  it('outside CI: runs the Postgres files on an embedded Postgres, skips the Redis files with one line saying which and why, passes, and removes the embedded Postgres', async () => {
    const run = await runTests(false);
    expect(run.code, run.output).toBe(0);
    const directory = embeddedDataDirectory(run.output);
    expect(directory, run.output).toBeDefined();
    expect(existsSync(directory!)).toBe(false);
    expectPostgresFilesPassed(run);
    for (const file of REDIS_FILES) {
      const report = fileNamed(run, file);
      expect(report.assertionResults.length, file).toBeGreaterThan(0);
      expect(report.assertionResults.every((test) => test.status === 'skipped' || test.status === 'pending'), file).toBe(true);
    }
    const lines = run.output.split('\n').filter((line) => line.includes('@module-tag redis'));
    expect(lines).toEqual([
      expect.stringMatching(
        new RegExp(
          `^\\[tests\\] the ${redisFiles().length} test files marked \`@module-tag redis\` skipped: Redis at redis://127\\.0\\.0\\.1:${run.redisPort} did not answer: .+; ` +
            'start Redis there \\(`apt-get install redis-server`\\), or set REDIS_URL to one that answers\\.$',
        ),
      ),
    ]);
    for (const file of Object.keys(BROKER_FILES)) {
      const report = fileNamed(run, file);
      expect(report.assertionResults.length, file).toBeGreaterThan(0);
      expect(report.assertionResults.every((test) => test.status === 'skipped' || test.status === 'pending'), file).toBe(true);
    }
    expect(run.output).toContain(
      `[tests] the tests tagged \`rabbitmq\` (files marked \`@module-tag rabbitmq\`, and single tests) skipped: RabbitMQ did not answer (127.0.0.1:${run.brokerPorts.amqp}: ECONNREFUSED); ` +
        'install it with `apt-get install rabbitmq-server`, or set AMQP_URL to one that answers.',
    );
    expect(run.output).toContain(`[tests] the tests tagged \`nats\` (files marked \`@module-tag nats\`, and single tests) skipped: NATS with JetStream did not answer (127.0.0.1:${run.brokerPorts.nats}: ECONNREFUSED)`);
    expect(run.output).not.toMatch(/^\s+at /m);
  }, 240_000);

  it('under CI=true: the Postgres files pass on the embedded Postgres and each Redis file fails, saying why', async () => {
    const run = await runTests(true);
    expect(run.code).not.toBe(0);
    expect(embeddedDataDirectory(run.output), run.output).toBeDefined();
    expectPostgresFilesPassed(run);
    for (const file of REDIS_FILES) {
      const report = fileNamed(run, file);
      expect(report.status, file).toBe('failed');
      expect(report.message, file).toMatch(new RegExp(`^${file.replaceAll('.', '\\.')} fails under CI=true: Redis at redis://127\\.0\\.0\\.1:${run.redisPort} did not answer: `));
    }
    for (const [file, title] of Object.entries(BROKER_FILES)) {
      const report = fileNamed(run, file);
      expect(report.status, file).toBe('failed');
      expect(report.message, file).toContain(`${file} fails under CI=true: ${title} did not answer (`);
    }
  }, 240_000);
});
