/**
 * What the private servers of the failover set-ups (etcd, Patroni, HAProxy, Redis Sentinel)
 * share: spare ports, the OS user Postgres runs as when this process is root, a long-running
 * process started with its output in a log file and stopped for certain (also when this process
 * exits without stopping it), and waiting until a condition holds.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { closeSync, openSync, readdirSync, readFileSync } from 'node:fs';
import { connect, createServer, type Server } from 'node:net';

/** An OS user a server runs as. */
export interface OsUser {
  readonly name: string;
  readonly uid: number;
  readonly gid: number;
}

/**
 * The user Postgres (and Patroni, which starts it) must run as: Postgres refuses to run as root.
 * `undefined` when this process is not root (the servers then run as this process's user).
 */
export function postgresOsUser(): OsUser | undefined {
  if (process.getuid?.() !== 0) return undefined;
  const name = process.env.PG_OS_USER ?? 'postgres';
  try {
    const uid = Number(execFileSync('id', ['-u', name], { encoding: 'utf8' }).trim());
    const gid = Number(execFileSync('id', ['-g', name], { encoding: 'utf8' }).trim());
    return { name, uid, gid };
  } catch {
    throw new Error(`running as root, Postgres needs the OS user "${name}" (set PG_OS_USER)`);
  }
}

/**
 * `count` distinct TCP ports free on 127.0.0.1 right now. All are held open until every one is
 * chosen, so no two are the same.
 */
export async function freePorts(count: number): Promise<number[]> {
  const servers: Server[] = [];
  try {
    for (let i = 0; i < count; i++) {
      const server = createServer();
      servers.push(server);
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(0, '127.0.0.1', resolve);
      });
    }
    return servers.map((server) => (server.address() as { port: number }).port);
  } finally {
    await Promise.all(servers.map((server) => new Promise((resolve) => server.close(resolve))));
  }
}

const exitCleanups = new Set<() => void>();
let exitHookInstalled = false;

/**
 * Runs `cleanup` (synchronous: signals only) when this process exits, also on an uncaught
 * error, so that a test runner or script that dies leaves no server behind. Returns a function
 * that unregisters it, for an orderly stop.
 */
export function killOnExit(cleanup: () => void): () => void {
  if (!exitHookInstalled) {
    exitHookInstalled = true;
    process.once('exit', () => {
      for (const each of exitCleanups) each();
    });
  }
  exitCleanups.add(cleanup);
  return () => exitCleanups.delete(cleanup);
}

/** How to start a {@link Daemon}. */
export interface DaemonOptions {
  /** What the daemon is, for error messages ("etcd", "patroni n1"). */
  readonly label: string;
  readonly binary: string;
  readonly args: readonly string[];
  /** Its stdout and stderr are appended here. */
  readonly logFile: string;
  /** Runs as this user (and HOME is `home`). */
  readonly user?: OsUser | undefined;
  readonly home?: string;
  readonly env?: NodeJS.ProcessEnv;
}

/**
 * A long-running process whose output goes to a log file. It runs in its own process group, so
 * a test runner's Ctrl-C does not reach it before the test's teardown does, and so SIGKILL of
 * the group also reaches what it started in that group.
 */
export class Daemon {
  readonly label: string;
  readonly logFile: string;
  readonly #child: ChildProcess;
  readonly #exited: Promise<unknown>;

  private constructor(options: DaemonOptions, child: ChildProcess) {
    this.label = options.label;
    this.logFile = options.logFile;
    this.#child = child;
    const forget = killOnExit(() => signalGroup(child.pid!, 'SIGKILL'));
    this.#exited = once(child, 'exit').finally(forget);
  }

  /** Starts the process; rejects at once when the binary cannot be run. */
  static async start(options: DaemonOptions): Promise<Daemon> {
    const log = openSync(options.logFile, 'a');
    let child: ChildProcess;
    try {
      child = spawn(options.binary, options.args, {
        stdio: ['ignore', log, log],
        detached: true,
        env: { ...process.env, ...options.env, ...(options.home ? { HOME: options.home } : {}) },
        // Run as another user, it starts in a directory that user can enter: the checkout may be
        // one only root can (a clone under /root, a `mktemp -d`), where initdb, run by Patroni,
        // fails to find its current directory, and the cluster never bootstraps.
        ...(options.user ? { uid: options.user.uid, gid: options.user.gid, cwd: options.home ?? '/' } : {}),
      });
    } finally {
      closeSync(log);
    }
    const started = new Promise<void>((resolve, reject) => {
      child.once('spawn', resolve);
      child.once('error', (error) => reject(new Error(`could not start ${options.label} (${options.binary}): ${error.message}`)));
    });
    child.on('error', () => {});
    await started;
    return new Daemon(options, child);
  }

  get pid(): number | undefined {
    return this.running ? this.#child.pid : undefined;
  }

  get running(): boolean {
    return this.#child.exitCode === null && this.#child.signalCode === null;
  }

  /** Rejects when the process exits (with the tail of its log): race it against a readiness check. */
  exitedEarly(): Promise<never> {
    const failed = this.#exited.then(() => {
      throw new Error(`${this.label} exited (${this.#child.exitCode ?? this.#child.signalCode}):\n${this.logTail()}`);
    });
    failed.catch(() => {});
    return failed;
  }

  /** SIGKILL to its whole process group, and waits for it to exit. */
  async kill(): Promise<void> {
    if (!this.running) return;
    signalGroup(this.#child.pid!, 'SIGKILL');
    await this.#exited;
  }

  /** SIGTERM, then SIGKILL to the group after `graceMs`; waits for it to exit. */
  async stop(graceMs = 5_000): Promise<void> {
    if (!this.running) return;
    this.#child.kill('SIGTERM');
    const timer = setTimeout(() => signalGroup(this.#child.pid!, 'SIGKILL'), graceMs);
    await this.#exited;
    clearTimeout(timer);
  }

  logTail(chars = 4_000): string {
    try {
      return readFileSync(this.logFile, 'utf8').slice(-chars);
    } catch {
      return '';
    }
  }
}

/** Sends `signal` to process group `pgid`; nothing when it is gone. */
export function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // already gone
  }
}

/** Sends `signal` to `pid`; nothing when it is gone. */
export function signalProcess(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch {
    // already gone
  }
}

/** Whether a process `pid` exists (and is not a zombie). */
export function processExists(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

/** The pids whose parent is `pid`, from /proc (Linux). */
export function childPids(pid: number): number[] {
  const children: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      // pid (comm) state ppid …; comm may contain spaces and parentheses.
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (Number(fields[1]) === pid && fields[0] !== 'Z') children.push(Number(entry));
    } catch {
      // exited meanwhile
    }
  }
  return children;
}

/**
 * Polls `probe` every `intervalMs` until it returns something other than `undefined`, and
 * returns that; throws after `timeoutMs` naming `what` and the last error the probe threw.
 */
export async function waitUntil<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs: number, intervalMs = 100): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  for (;;) {
    try {
      const value = await probe();
      if (value !== undefined) return value;
    } catch (error) {
      lastError = error;
    }
    if (Date.now() > deadline) {
      const reason = lastError instanceof Error ? ` (last error: ${lastError.message})` : '';
      throw new Error(`${what}: not within ${timeoutMs} ms${reason}`);
    }
    await sleep(intervalMs);
  }
}

/** Resolves once something accepts TCP connections on 127.0.0.1:`port`. */
export function waitForPort(port: number, timeoutMs: number, what = `127.0.0.1:${port}`): Promise<true> {
  return waitUntil(
    `${what} accepting connections`,
    () =>
      new Promise<true | undefined>((resolve) => {
        const socket = connect(port, '127.0.0.1');
        socket.once('connect', () => {
          socket.destroy();
          resolve(true);
        });
        socket.once('error', () => resolve(undefined));
      }),
    timeoutMs,
    50,
  );
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
