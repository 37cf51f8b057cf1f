/**
 * A PgBouncer of the caller's own, in transaction mode, in front of a Postgres server: its
 * configuration, auth file, log and pid file in a fresh temporary directory, listening on a
 * spare port of 127.0.0.1 (no Unix socket). The tests, the chaos suite and the benchmark start
 * one to run the system through a transaction pooler; it is stopped (SIGTERM, then SIGKILL)
 * and its directory deleted afterwards. It never touches the server's own settings.
 *
 * The binary: `PGBOUNCER`, else `pgbouncer` on PATH, else `/usr/sbin/pgbouncer` (Debian's
 * `pgbouncer` package; see ./system-tools.ts). PgBouncer refuses to run as root: when this
 * process is root, it runs as the `postgres` OS user (`PG_OS_USER`), and the directory is
 * handed to that user.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { chownSync, closeSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { findSystemTool, missingToolLine } from './system-tools.js';

/** Options of {@link PgBouncer.start}. */
export interface PgBouncerOptions {
  /** The Postgres server to pool, as a URL: its host, port, user and password are used; every database name maps to the same name there. */
  readonly upstream: string;
  /** Server connections per database and user (`default_pool_size`). @defaultValue `10` */
  readonly poolSize?: number;
  /** Users that may log in (trust authentication; the upstream user's password, if any, logs in to the server). @defaultValue the upstream URL's user */
  readonly users?: readonly string[];
  /**
   * More `[databases]` entries, name → connection settings, e.g.
   * `{ strict: 'dbname=postgres connect_query=\'set default_transaction_isolation = "serializable"\'' }`;
   * the upstream's host and port are added.
   */
  readonly databases?: Readonly<Record<string, string>>;
}

/**
 * The settings that make the system work through PgBouncer in transaction mode (docs/operations.md,
 * "Running behind PgBouncer"): `ignore_startup_parameters = options`, because `createPostgresDb`
 * sends the startup option `-c default_transaction_isolation=read\ committed` and PgBouncer
 * refuses unknown startup parameters; and, since that option is then dropped, each server
 * connection sets read committed itself (`connect_query`), which the store's single-statement
 * claims rely on under a stricter server default. Its transactions say so in their BEGIN anyway.
 */
export const READ_COMMITTED_CONNECT_QUERY = `connect_query='set default_transaction_isolation = "read committed"'`;

/** A running PgBouncer process. */
export class PgBouncer {
  readonly port: number;
  /** The temporary directory: `pgbouncer.ini`, `userlist.txt`, `pgbouncer.log`. */
  readonly dir: string;
  readonly #upstream: URL;
  #process: ChildProcess | undefined;

  private constructor(port: number, dir: string, upstream: URL) {
    this.port = port;
    this.dir = dir;
    this.#upstream = upstream;
  }

  /** Writes the configuration into a fresh temporary directory and starts PgBouncer on a free port. */
  static async start(options: PgBouncerOptions): Promise<PgBouncer> {
    const binary = findPgBouncer();
    const upstream = new URL(options.upstream);
    const user = process.getuid?.() === 0 ? osUser(process.env.PG_OS_USER ?? 'postgres') : undefined;
    const dir = mkdtempSync(join(tmpdir(), 'ij-pgbouncer-'));
    const bouncer = new PgBouncer(await freePort(), dir, upstream);
    try {
      const users = options.users ?? [decodeURIComponent(upstream.username) || 'postgres'];
      const password = decodeURIComponent(upstream.password);
      writeFileSync(join(dir, 'userlist.txt'), users.map((name) => `"${name}" "${name === decodeURIComponent(upstream.username) ? password : ''}"\n`).join(''));
      writeFileSync(join(dir, 'pgbouncer.ini'), pgBouncerConfig({ ...options, upstream, port: bouncer.port, dir }));
      if (user) {
        chownSync(dir, user.uid, user.gid);
        for (const file of ['userlist.txt', 'pgbouncer.ini']) chownSync(join(dir, file), user.uid, user.gid);
      }
      await bouncer.#spawn(binary, user);
      return bouncer;
    } catch (error) {
      await bouncer.stop();
      throw error;
    }
  }

  /** The upstream URL with PgBouncer's host and port (same user, password, database and parameters); `database` replaces the database name. */
  url(database?: string): string {
    const url = new URL(this.#upstream.toString());
    url.hostname = '127.0.0.1';
    url.port = String(this.port);
    if (database !== undefined) url.pathname = `/${database}`;
    return url.toString();
  }

  /** The pid while it runs. */
  get pid(): number | undefined {
    const child = this.#process;
    return child && child.exitCode === null && child.signalCode === null ? child.pid : undefined;
  }

  /** The tail of PgBouncer's log, for diagnostics. */
  logTail(chars = 4_000): string {
    try {
      return readFileSync(join(this.dir, 'pgbouncer.log'), 'utf8').slice(-chars);
    } catch {
      return '';
    }
  }

  /** Stops PgBouncer (SIGTERM: it closes every connection at once; SIGKILL after 5 s) and deletes its directory. */
  async stop(): Promise<void> {
    const child = this.#process;
    this.#process = undefined;
    if (child && child.exitCode === null && child.signalCode === null) {
      const exited = once(child, 'exit');
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(this.dir, { recursive: true, force: true });
  }

  async #spawn(binary: string, user: OsUser | undefined): Promise<void> {
    const log = openSync(join(this.dir, 'stderr.log'), 'a');
    let child: ChildProcess;
    try {
      child = spawn(binary, [join(this.dir, 'pgbouncer.ini')], {
        stdio: ['ignore', log, log],
        // As another user, in a directory it can enter (the checkout may be one only root can).
        ...(user ? { uid: user.uid, gid: user.gid, cwd: this.dir, env: { ...process.env, HOME: this.dir } } : {}),
      });
    } finally {
      closeSync(log);
    }
    child.on('error', () => {});
    this.#process = child;
    const failed = new Promise<never>((_, reject) => {
      child.once('error', (error) => reject(new Error(`could not start ${binary}: ${error.message} (install Debian's pgbouncer package, or set PGBOUNCER)`)));
      child.once('exit', (code, signal) => {
        const stderr = readFileSync(join(this.dir, 'stderr.log'), 'utf8');
        reject(new Error(`pgbouncer exited at start (${code ?? signal}):\n${stderr}${this.logTail()}`));
      });
    });
    failed.catch(() => {});
    await Promise.race([waitForPort(this.port, 15_000), failed]);
  }
}

/** The `pgbouncer.ini` of a {@link PgBouncer}. */
export function pgBouncerConfig(options: Omit<PgBouncerOptions, 'upstream'> & { readonly upstream: URL; readonly port: number; readonly dir: string }): string {
  const server = `host=${options.upstream.hostname} port=${options.upstream.port || '5432'}`;
  const extra = Object.entries(options.databases ?? {}).map(([name, settings]) => `${name} = ${server} ${settings}`);
  return [
    '[databases]',
    ...extra,
    // Any other database name: the same name on the server, each server connection at read committed.
    `* = ${server} ${READ_COMMITTED_CONNECT_QUERY}`,
    '',
    '[pgbouncer]',
    'listen_addr = 127.0.0.1',
    `listen_port = ${options.port}`,
    'unix_socket_dir =',
    'auth_type = trust',
    `auth_file = ${join(options.dir, 'userlist.txt')}`,
    'pool_mode = transaction',
    `default_pool_size = ${options.poolSize ?? 10}`,
    'max_client_conn = 500',
    // createPostgresDb's read-committed pin travels as the `options` startup parameter.
    'ignore_startup_parameters = options',
    // A server that crashed or restarted is logged in to again at once, not after the default 15 s.
    'server_login_retry = 0.5',
    `logfile = ${join(options.dir, 'pgbouncer.log')}`,
    `pidfile = ${join(options.dir, 'pgbouncer.pid')}`,
    'log_connections = 0',
    'log_disconnections = 0',
    '',
  ].join('\n');
}

/** `PGBOUNCER`, else `pgbouncer` on PATH, else `/usr/sbin/pgbouncer`. */
export function findPgBouncer(): string {
  const found = findSystemTool('pgbouncer');
  if (found === undefined) throw new Error(`no pgbouncer binary: ${missingToolLine('pgbouncer')}`);
  return found;
}

interface OsUser {
  readonly uid: number;
  readonly gid: number;
}

function osUser(name: string): OsUser {
  try {
    const uid = Number(execFileSync('id', ['-u', name], { encoding: 'utf8' }).trim());
    const gid = Number(execFileSync('id', ['-g', name], { encoding: 'utf8' }).trim());
    return { uid, gid };
  } catch {
    throw new Error(`running as root, PgBouncer needs the OS user "${name}" (set PG_OS_USER)`);
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no free port'))));
    });
  });
}

/** Resolves once something accepts TCP connections on 127.0.0.1:`port`. */
async function waitForPort(port: number, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const open = await new Promise<boolean>((resolve) => {
      const socket = connect(port, '127.0.0.1');
      socket.once('connect', () => {
        socket.destroy();
        resolve(true);
      });
      socket.once('error', () => resolve(false));
    });
    if (open) return;
    if (Date.now() > deadline) throw new Error(`pgbouncer did not listen on 127.0.0.1:${port} within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
