// @module-tag redis
/**
 * A worker process starting while Postgres or Redis is down waits for it (a warning per try)
 * for at most STARTUP_WAIT_MS, then exits with an error naming the server; errors that waiting
 * cannot fix end the start at once. The restarting server is a private cluster (the shared
 * one is never stopped).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createServer, type AddressInfo } from 'node:net';
import { createInterface } from 'node:readline';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { IdempotentProducer } from '../src/index.js';
import { StoreUnreachableAtStartError, waitForStore } from '../src/runtime/wait-for-store.js';
import { PrivatePostgres } from './chaos/private-postgres.js';
import { freePort } from './chaos/private-redis.js';
import { waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

/** A logger that keeps the messages of its warnings. */
function recordingLogger() {
  const warnings: string[] = [];
  const logger = pino({ level: 'warn' }, { write: (line: string) => void warnings.push(JSON.parse(line).msg) });
  return { logger, warnings };
}

const refused = () => Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:1'), { code: 'ECONNREFUSED' });

describe('waitForStore', () => {
  it('tries again after each transient failure, with a warning per try, until it succeeds', async () => {
    const { logger, warnings } = recordingLogger();
    let calls = 0;
    const value = await waitForStore(
      async () => {
        if (++calls < 4) throw refused();
        return 'up';
      },
      { what: 'Postgres (migrations)', deadline: Date.now() + 60_000, logger, firstDelayMs: 1, maxDelayMs: 4 },
    );
    expect(value).toBe('up');
    expect(calls).toBe(4);
    expect(warnings).toEqual(Array(3).fill(expect.stringMatching(/^Postgres \(migrations\) is not reachable yet; trying again in \d+ ms$/)));
  });

  it('logs one warning line per try, with the error\'s message and no stack; the stack goes to debug', async () => {
    const entries: Array<Record<string, unknown>> = [];
    const logger = pino({ level: 'debug' }, { write: (line: string) => void entries.push(JSON.parse(line)) });
    let calls = 0;
    await waitForStore(
      async () => {
        if (++calls < 3) throw refused();
        return 'up';
      },
      { what: 'Postgres (migrations)', deadline: Date.now() + 60_000, logger, firstDelayMs: 1, maxDelayMs: 4 },
    );
    const warnings = entries.filter((entry) => entry.level === 40);
    expect(warnings.map(({ tries, error }) => ({ tries, error }))).toEqual([
      { tries: 1, error: 'connect ECONNREFUSED 127.0.0.1:1' },
      { tries: 2, error: 'connect ECONNREFUSED 127.0.0.1:1' },
    ]);
    for (const warning of warnings) expect(JSON.stringify(warning)).not.toMatch(/"err"|stack|\\n\s+at /);
    const debug = entries.filter((entry) => entry.level === 20);
    expect(debug).toHaveLength(2);
    expect((debug[0]!.err as { stack: string }).stack).toMatch(/ECONNREFUSED[\s\S]*\n\s+at /);
  });

  it('throws an error that waiting cannot fix at once, without a warning', async () => {
    const { logger, warnings } = recordingLogger();
    let calls = 0;
    const wrongPassword = Object.assign(new Error('password authentication failed for user "app"'), { code: '28P01' });
    await expect(
      waitForStore(
        async () => {
          calls++;
          throw wrongPassword;
        },
        { what: 'Postgres (migrations)', deadline: Date.now() + 60_000, logger, firstDelayMs: 1 },
      ),
    ).rejects.toBe(wrongPassword);
    expect(calls).toBe(1);
    expect(warnings).toEqual([]);
  });

  it('gives up at the deadline with an error naming the server, the last error and the setting', async () => {
    const { logger } = recordingLogger();
    const failure = waitForStore(
      async () => {
        throw refused();
      },
      { what: 'Redis', deadline: Date.now() + 30, logger, firstDelayMs: 1, maxDelayMs: 5 },
    );
    await expect(failure).rejects.toBeInstanceOf(StoreUnreachableAtStartError);
    await expect(failure).rejects.toThrow(/^Redis was still unreachable after \d+ tries over \d+ s \(last error: connect ECONNREFUSED 127\.0\.0\.1:1\); giving up\..*STARTUP_WAIT_MS/);
  });

  it('gives up at the deadline on a try that never answers (a frozen server)', async () => {
    const { logger } = recordingLogger();
    const failure = waitForStore(() => new Promise<never>(() => {}), { what: 'Postgres (migrations)', deadline: Date.now() + 30, logger });
    await expect(failure).rejects.toThrow(/^Postgres \(migrations\) was still unreachable after 1 tries .*\(last error: no answer/);
  });
});

describe('a worker process starting while a server is down', () => {
  let env: TestEnv;
  let producer: IdempotentProducer;

  beforeAll(async () => {
    env = await createTestEnv('wait_for_store');
    producer = new IdempotentProducer({ queue: 'echo', connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  });
  afterAll(async () => {
    await producer?.close();
    await env?.teardown();
  });
  // A worker a failed assertion left running (one hanging on a server that never comes up).
  const started: ChildProcess[] = [];
  afterEach(() => {
    for (const child of started.splice(0)) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });

  /** The CLI worker with the echo handler; `lines` holds stdout's lines as they come. */
  function startWorker(extraEnv: Record<string, string>) {
    const child = spawn(process.execPath, ['bin/idempotent-jobs.js', 'worker', '--queue', 'echo', '--handler', 'test/support/echo-handler.mjs'], {
      env: { ...process.env, DATABASE_URL: env.databaseUrl, REDIS_URL: env.redisUrl, SCHEMA: env.schema, REDIS_PREFIX: env.redisPrefix, ...extraEnv },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    started.push(child);
    const lines: string[] = [];
    const waiters: Array<() => void> = [];
    let stderr = '';
    child.stderr!.on('data', (chunk) => (stderr += chunk));
    createInterface({ input: child.stdout! }).on('line', (line) => {
      lines.push(line);
      for (const check of [...waiters]) check();
    });
    /** Resolves once `times` stdout lines match `pattern`. */
    const seen = (pattern: RegExp, times = 1) =>
      new Promise<void>((resolve, reject) => {
        const check = () => {
          if (lines.filter((line) => pattern.test(line)).length < times) return;
          waiters.splice(waiters.indexOf(check), 1);
          resolve();
        };
        waiters.push(check);
        check();
        child.once('exit', (code) => reject(new Error(`worker exited with ${code} before logging ${pattern}:\n${stderr}`)));
      });
    const exited = once(child, 'exit').then(([code]) => ({ code: code as number | null, stderr, stdout: lines.join('\n') }));
    return { child, seen, exited, lines };
  }

  it('waits for a Postgres that comes up later, then runs jobs', async () => {
    const server = await PrivatePostgres.start({ maxConnections: 20 });
    await server.crash(); // down before the worker's first connection
    const worker = startWorker({ DATABASE_URL: server.url, STARTUP_WAIT_MS: '120000' });
    try {
      await worker.seen(/Postgres \(migrations\) is not reachable yet/, 2); // still trying after a first wait
      await server.crashAndRecover(0); // up again (crash recovery of a cluster with nothing in it)
      await worker.seen(/worker ready/);
      const { jobId } = await producer.enqueue({ name: 'echo', scope: 's', key: 'after-start', data: { n: 1 } });
      const { job } = await waitForJobState(producer.queue, jobId, ['completed']);
      expect(job.returnvalue).toMatchObject({ echoed: { n: 1 }, key: 'after-start' });
      worker.child.kill('SIGTERM');
      expect((await worker.exited).code).toBe(0);
    } finally {
      await server.destroy();
    }
  });

  it('exits non-zero naming Postgres when it never comes up: one warning line per try, without a stack, then the last line', async () => {
    const closedPort = await freePort();
    const worker = startWorker({ DATABASE_URL: `postgres://postgres@127.0.0.1:${closedPort}/postgres`, STARTUP_WAIT_MS: '1500' });
    const { code, stderr, stdout } = await worker.exited;
    expect(code).toBe(1);
    expect(stderr.trim()).toMatch(/^Postgres \(migrations\) was still unreachable after (\d+) tries .*ECONNREFUSED.*STARTUP_WAIT_MS sets how long a starting process waits\.$/);
    const tries = Number(/after (\d+) tries/.exec(stderr)![1]);
    const lines = stdout.split('\n').map((line) => JSON.parse(line) as Record<string, unknown>);
    expect(lines.map(({ level, msg, tries: n }) => ({ level, msg, tries: n }))).toEqual(
      Array.from({ length: tries - 1 }, (_, i) => ({ level: 40, msg: expect.stringMatching(/^Postgres \(migrations\) is not reachable yet; trying again in \d+ ms$/), tries: i + 1 })),
    );
    for (const line of lines) expect(line).toMatchObject({ error: expect.stringContaining('ECONNREFUSED') });
    expect(stdout).not.toMatch(/"err"|stack/);
  });

  it('exits non-zero naming Postgres when it accepts connections but never answers (frozen)', async () => {
    const silent = createServer(() => {}); // accepts, never replies: a server stopped by SIGSTOP
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    try {
      const { port } = silent.address() as AddressInfo;
      const worker = startWorker({ DATABASE_URL: `postgres://postgres@127.0.0.1:${port}/postgres`, STARTUP_WAIT_MS: '1500' });
      const { code, stderr } = await worker.exited;
      expect(code).toBe(1);
      expect(stderr).toMatch(/Postgres \(migrations\) was still unreachable after 1 tries .*no answer.*STARTUP_WAIT_MS/);
    } finally {
      silent.close();
    }
  });

  it('exits non-zero naming Redis when it never comes up: BullMQ\'s connection errors as one warning line per try, without a stack', async () => {
    const closedPort = await freePort();
    const worker = startWorker({ REDIS_URL: `redis://127.0.0.1:${closedPort}`, STARTUP_WAIT_MS: '4000' });
    const { code, stderr, stdout } = await worker.exited;
    expect(code).toBe(1);
    expect(stderr.trim()).toMatch(/^Redis was still unreachable after \d+ tries .*ECONNREFUSED.*STARTUP_WAIT_MS sets how long a starting process waits\.$/);
    const lines = stdout.split('\n').map((line) => JSON.parse(line) as Record<string, unknown>);
    const warnings = lines.filter((line) => line.level === 40);
    // No error-level "BullMQ worker error" entries, no stacks: warnings, and the info lines of closing.
    expect(lines.filter((line) => (line.level as number) >= 50)).toEqual([]);
    expect(stdout).not.toMatch(/BullMQ worker error|"err"|stack/);
    expect(warnings.length).toBeGreaterThan(0);
    for (const warning of warnings) {
      expect(warning).toMatchObject({ msg: 'Redis is not reachable; BullMQ reconnects by itself', error: `connect ECONNREFUSED 127.0.0.1:${closedPort}` });
    }
    // One line per reconnect try: the worker's connections fail together, and count once.
    const times = warnings.map((warning) => warning.time as number);
    for (let i = 1; i < times.length; i++) expect(times[i]! - times[i - 1]!).toBeGreaterThanOrEqual(500);
  });

  it('exits at once on an error waiting cannot fix, saying what to do: a database that does not exist', async () => {
    const url = new URL(env.databaseDirectUrl);
    url.pathname = '/ij_no_such_database';
    const worker = startWorker({ DATABASE_URL: url.toString(), STARTUP_WAIT_MS: '600000' });
    const { code, stderr, stdout } = await worker.exited;
    expect(code).toBe(2);
    expect(stderr.trim()).toBe(
      `Postgres has no database "ij_no_such_database", which DATABASE_URL (${url}) names. ` +
        `Create it (createdb -h ${url.hostname} -p ${url.port} -U ${url.username} ij_no_such_database), or point DATABASE_URL at a database that exists.`,
    );
    expect(stdout).not.toMatch(/not reachable yet/);
  });

  it('exits at once on a schema never migrated when MIGRATE is off, naming SCHEMA and `idempotent-jobs migrate`', async () => {
    const worker = startWorker({ SCHEMA: `${env.schema}_never_migrated`, MIGRATE: 'false', STARTUP_WAIT_MS: '600000' });
    const { code, stderr } = await worker.exited;
    expect(code).toBe(2);
    expect(stderr.trim()).toMatch(
      new RegExp(`^Schema "${env.schema}_never_migrated" in DATABASE_URL \\(.*\\) has no idempotency tables \\(no ${env.schema}_never_migrated\\.idempotency_keys table\\)\\. Create them with \`idempotent-jobs migrate\``),
    );
  });

  it('says once that it is ready: the pid once (pino\'s own field), and the metrics port it bound', async () => {
    const worker = startWorker({ METRICS_PORT: '0' });
    await worker.seen(/worker ready/);
    const ready = worker.lines.find((line) => line.includes('worker ready'))!;
    expect(ready.match(/"pid":/g)).toHaveLength(1);
    const { metricsPort } = JSON.parse(ready) as { metricsPort: number };
    expect((await fetch(`http://127.0.0.1:${metricsPort}/healthz`)).status).toBe(200);
    worker.child.kill('SIGTERM');
    expect((await worker.exited).code).toBe(0);
  });
});
