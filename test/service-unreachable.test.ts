/**
 * A server down at start, as a user meets it: the README's example, run as it is written (its
 * import pointed at this checkout's source), with Redis or Postgres at a port where nothing
 * listens. It waits `STARTUP_WAIT_MS`, one warning line per try and no stack, then ends with one
 * `ServiceUnreachableError` naming the service, its address without password and what to do.
 * And the library's own logger: `warn` by default, `LOG_LEVEL` when set.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defaultLogger } from '../src/default-logger.js';
import { IdempotencyKeys, IdempotentProducer, ServiceUnreachableError, ValidationError, createIdempotentWorker } from '../src/index.js';
import { DEFAULT_STARTUP_WAIT_MS, startupWaitMs } from '../src/service-unreachable.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const STARTUP_WAIT_MS = 1_500;
/** Past the wait, the example must have ended: loading it under tsx takes a few seconds on a busy machine. */
const ENDS_WITHIN_MS = 45_000;

let env: TestEnv;
let dir: string;
let databaseUrl: string;
const database = `ij_unreachable_${Math.random().toString(16).slice(2, 10)}`;

beforeAll(async () => {
  env = await createTestEnv('unreachable');
  // The example uses the default schema and a `ledger` table: a database of its own.
  await sql`create database ${sql.id(database)}`.execute(env.db);
  const url = new URL(env.databaseDirectUrl);
  url.pathname = `/${database}`;
  databaseUrl = url.toString();
  dir = mkdtempSync(join(tmpdir(), 'ij-unreachable-'));
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const example = /^```ts\n([\s\S]*?)^```$/m.exec(readme)![1]!;
  expect(example).toContain("from 'idempotent-jobs'");
  writeFileSync(join(dir, 'example.mts'), example.replace("from 'idempotent-jobs'", `from ${JSON.stringify(join(ROOT, 'src/index.ts'))}`));
});

afterAll(async () => {
  rmSync(dir, { recursive: true, force: true });
  await sql`drop database if exists ${sql.id(database)} with (force)`.execute(env.db);
  await env?.teardown();
});

/** A local port where nothing listens. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** Runs the README's example under tsx; kills it if it has not ended in time (the bug: it never does). */
function runExample(extraEnv: Record<string, string>): Promise<{ code: number | null; ms: number; stdout: string; stderr: string }> {
  const startedAt = Date.now();
  const child = spawn(process.execPath, ['--import', 'tsx', join(dir, 'example.mts')], {
    cwd: ROOT,
    env: { ...process.env, STARTUP_WAIT_MS: String(STARTUP_WAIT_MS), LOG_LEVEL: '', ...extraEnv },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const timer = setTimeout(() => child.kill('SIGKILL'), ENDS_WITHIN_MS);
  return new Promise((resolve) =>
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, ms: Date.now() - startedAt, stdout, stderr });
    }),
  );
}

/**
 * The error names the service at `address` and how long the start waited: at least
 * `STARTUP_WAIT_MS` (1.5 s, shown as 2 s), more on a loaded machine, where the tries' own time
 * adds to the wait (a full suite once took it past 2.5 s, shown as 3 s).
 */
function expectUnreachableAfterTheWait(stderr: string, address: string): void {
  const escaped = address.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const waited = new RegExp(`ServiceUnreachableError: ${escaped} did not answer for (\\d+) s`).exec(stderr);
  expect(waited, stderr).not.toBeNull();
  expect(Number(waited![1])).toBeGreaterThanOrEqual(Math.round(STARTUP_WAIT_MS / 1000));
}

/** Lines of a stack trace. */
const stackLines = (text: string) => text.split('\n').filter((line) => /^\s+at /.test(line));

describe("the README's example with a server down", () => {
  it('Redis down: waits STARTUP_WAIT_MS with one warning line per try, then ends with one ServiceUnreachableError naming Redis', async () => {
    const port = await closedPort();
    const run = await runExample({ DATABASE_URL: databaseUrl, REDIS_URL: `redis://:s3cret@127.0.0.1:${port}` });
    expect(run.code, run.stderr).toBe(1);
    // One error, printed once by the example's catch: its own stack and its cause's, nothing repeated.
    expect(run.stderr.match(/ServiceUnreachableError: /g)).toHaveLength(1);
    expectUnreachableAfterTheWait(run.stderr, `Redis at redis://:***@127.0.0.1:${port}`);
    expect(run.stderr).toContain(`Start Redis there, or point REDIS_URL at one that runs; STARTUP_WAIT_MS sets how long to wait`);
    expect(run.stderr).toContain("code: 'SERVICE_UNREACHABLE'");
    expect(run.stderr.match(/ECONNREFUSED/g)!.length).toBeLessThanOrEqual(3); // the message, the cause's message and its code
    expect(stackLines(run.stderr).filter((line) => line.includes('TCPConnectWrap'))).toHaveLength(1);
    expect(`${run.stdout}${run.stderr}`).not.toContain('s3cret');
    // stdout: only warning lines (level 40) of the default logger, none with a stack.
    const lines = run.stdout.split('\n').filter(Boolean);
    expect(lines.length).toBeGreaterThan(0);
    expect(lines.length).toBeLessThan(20);
    for (const line of lines) {
      const entry = JSON.parse(line) as { level: number; err?: unknown; msg: string };
      expect(entry.level, line).toBe(40);
      expect(entry.err, line).toBeUndefined();
      expect(entry.msg).toMatch(/Redis/);
    }
  }, ENDS_WITHIN_MS + 15_000);

  it('Postgres down: the migrations wait STARTUP_WAIT_MS, then one ServiceUnreachableError naming Postgres and its URL without password', async () => {
    const port = await closedPort();
    const run = await runExample({ DATABASE_URL: `postgres://postgres:s3cret@127.0.0.1:${port}/postgres`, REDIS_URL: 'redis://127.0.0.1:1' });
    expect(run.code, run.stderr).toBe(1);
    expect(run.stderr.match(/ServiceUnreachableError: /g)).toHaveLength(1);
    expectUnreachableAfterTheWait(run.stderr, `Postgres at postgres://postgres:***@127.0.0.1:${port}/postgres`);
    expect(run.stderr).toContain('point DATABASE_URL at one that runs');
    expect(`${run.stdout}${run.stderr}`).not.toContain('s3cret');
    const lines = run.stdout.split('\n').filter(Boolean);
    expect(lines.length).toBeGreaterThan(0);
    for (const line of lines) {
      const entry = JSON.parse(line) as { level: number; service: string; address: string };
      expect(entry).toMatchObject({ level: 40, service: 'Postgres', address: `postgres://postgres:***@127.0.0.1:${port}/postgres` });
    }
  }, ENDS_WITHIN_MS + 15_000);

  it('LOG_LEVEL=silent: the same end, and not a line on stdout', async () => {
    const port = await closedPort();
    const run = await runExample({ DATABASE_URL: databaseUrl, REDIS_URL: `redis://127.0.0.1:${port}`, LOG_LEVEL: 'silent' });
    expect(run.code, run.stderr).toBe(1);
    expect(run.stderr).toContain(`ServiceUnreachableError: Redis at redis://127.0.0.1:${port}`);
    expect(run.stdout).toBe('');
  }, ENDS_WITHIN_MS + 15_000);
});

describe("the library's default logger", () => {
  it('logs at warn when LOG_LEVEL is unset or empty', () => {
    expect(defaultLogger({}).level).toBe('warn');
    expect(defaultLogger({ LOG_LEVEL: '' }).level).toBe('warn');
  });

  it('honours LOG_LEVEL when it names a pino level', () => {
    for (const level of ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']) expect(defaultLogger({ LOG_LEVEL: level }).level).toBe(level);
    expect(defaultLogger({ LOG_LEVEL: 'DEBUG' }).level).toBe('debug');
  });

  it('falls back to warn for a name that is no level', () => {
    expect(defaultLogger({ LOG_LEVEL: 'verbose' }).level).toBe('warn');
  });
});

describe('the wait, as set', () => {
  it('STARTUP_WAIT_MS: a whole number of milliseconds; unset or empty, the default; anything else refused, naming it', () => {
    expect(startupWaitMs({ STARTUP_WAIT_MS: '1500' })).toBe(1500);
    expect(startupWaitMs({ STARTUP_WAIT_MS: ' 0 ' })).toBe(0);
    expect(startupWaitMs({})).toBe(DEFAULT_STARTUP_WAIT_MS);
    expect(startupWaitMs({ STARTUP_WAIT_MS: '' })).toBe(DEFAULT_STARTUP_WAIT_MS);
    for (const raw of ['5s', '-1', '1.5', 'NaN', 'Infinity']) {
      expect(() => startupWaitMs({ STARTUP_WAIT_MS: raw }), raw).toThrow(ValidationError);
      expect(() => startupWaitMs({ STARTUP_WAIT_MS: raw }), raw).toThrow(`STARTUP_WAIT_MS="${raw}" is not a whole number of milliseconds`);
    }
  });

  it('startupWaitMs of a worker or producer: a whole number of milliseconds or Infinity; a NaN (whose deadline never passed: the start retried for ever), a negative number or a string refused', () => {
    const connection = { host: '127.0.0.1', port: 1 };
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
    for (const bad of [Number.NaN, -1, 2.5, '5s']) {
      expect(() => new IdempotentProducer({ queue: 'unreachable', connection, startupWaitMs: bad as number }), String(bad)).toThrow(ValidationError);
      expect(() => createIdempotentWorker({ queue: 'unreachable', connection, keys, handler: async () => null, startupWaitMs: bad as number }), String(bad)).toThrow(
        /createIdempotentWorker\(options\): startupWaitMs must be a whole number of milliseconds/,
      );
    }
  });
});

describe('ServiceUnreachableError', () => {
  it('is an exported IdempotencyError with a stable code', () => {
    const error = new ServiceUnreachableError('Redis', 'redis://127.0.0.1:6390', 2_000, { cause: new Error('connect ECONNREFUSED 127.0.0.1:6390') });
    expect(error).toMatchObject({ name: 'ServiceUnreachableError', code: 'SERVICE_UNREACHABLE', service: 'Redis', address: 'redis://127.0.0.1:6390' });
    expect(error.message).toBe(
      'Redis at redis://127.0.0.1:6390 did not answer for 2 s (last error: connect ECONNREFUSED 127.0.0.1:6390). ' +
        'Start Redis there, or point REDIS_URL at one that runs; STARTUP_WAIT_MS sets how long to wait (milliseconds).',
    );
  });
});
