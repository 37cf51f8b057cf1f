/**
 * A redis-server of the suite's own, on a spare port, with the append-only file fsynced on
 * every write (`appendonly yes`, `appendfsync always`): a write Redis acknowledged survives a
 * crash of the server. The suite crashes it (SIGKILL) and starts it again on the same port and
 * directory, so clients must reconnect and nothing acknowledged may be lost. The shared Redis
 * is never touched.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';

/** A private redis-server process. */
export class PrivateRedis {
  readonly port: number;
  readonly dir: string;
  #process: ChildProcess | undefined;
  #binary: string;

  private constructor(port: number, dir: string, binary: string) {
    this.port = port;
    this.dir = dir;
    this.#binary = binary;
  }

  /** Starts a server on a free port, in a fresh temporary directory. */
  static async start(binary = process.env.REDIS_SERVER ?? 'redis-server'): Promise<PrivateRedis> {
    const redis = new PrivateRedis(await freePort(), mkdtempSync(join(tmpdir(), 'ij-chaos-redis-')), binary);
    await redis.#spawn();
    return redis;
  }

  /** `redis://127.0.0.1:<port>`. */
  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  /** Crashes the server (SIGKILL: no shutdown save; only the fsynced AOF remains). */
  async crash(): Promise<void> {
    const child = this.#process;
    this.#process = undefined;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = once(child, 'exit');
    child.kill('SIGKILL');
    await exited;
  }

  /** Crashes the server, waits `downMs`, starts it again from its AOF. */
  async restart(downMs: number): Promise<void> {
    await this.crash();
    await new Promise((resolve) => setTimeout(resolve, downMs));
    await this.#spawn();
  }

  /** Stops the server and deletes its directory. */
  async destroy(): Promise<void> {
    await this.crash();
    rmSync(this.dir, { recursive: true, force: true });
  }

  async #spawn(): Promise<void> {
    const args = [
      '--port', String(this.port), '--bind', '127.0.0.1', '--dir', this.dir,
      '--appendonly', 'yes', '--appendfsync', 'always', '--save', '',
      '--daemonize', 'no', '--logfile', join(this.dir, 'redis.log'),
    ];
    const child = spawn(this.#binary, args, { stdio: 'ignore' });
    const failed = new Promise<never>((_, reject) => {
      child.once('error', (error) => reject(new Error(`could not start ${this.#binary}: ${error.message} (set REDIS_SERVER to its path)`)));
      child.once('exit', (code, signal) => reject(new Error(`${this.#binary} exited at start (${code ?? signal}); see ${this.dir}/redis.log`)));
    });
    failed.catch(() => {});
    this.#process = child;
    await Promise.race([waitForPing(this.port, 30_000), failed]);
  }
}

/** Resolves once the server answers PING (after loading its AOF). */
async function waitForPing(port: number, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const client = new Redis({ port, host: '127.0.0.1', lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    client.on('error', () => {});
    try {
      await client.connect();
      if ((await client.ping()) === 'PONG') return;
    } catch {
      // not up yet, or still loading the AOF
    } finally {
      client.disconnect();
    }
    if (Date.now() > deadline) throw new Error(`private redis-server on port ${port} did not answer within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** A TCP port free on 127.0.0.1 right now. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no free port'))));
    });
  });
}
