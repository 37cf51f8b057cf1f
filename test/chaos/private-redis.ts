/**
 * A redis-server of the suite's own, on a spare port, with the append-only file fsynced on
 * every write (`appendonly yes`, `appendfsync always`): a write Redis acknowledged survives a
 * crash of the server. The suite crashes it (SIGKILL) and starts it again on the same port and
 * directory, so clients must reconnect and nothing acknowledged may be lost. The shared Redis
 * is never touched.
 */
import { mkdtempSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { RestartableServer, type ServerCommand } from '../support/restartable-server.js';

/** A private redis-server process. */
export class PrivateRedis extends RestartableServer {
  readonly #binary: string;

  private constructor(port: number, dir: string, binary: string) {
    super(port, dir);
    this.#binary = binary;
  }

  /** Starts a server on a free port, in a fresh temporary directory. */
  static async start(binary = process.env.REDIS_SERVER ?? 'redis-server'): Promise<PrivateRedis> {
    const redis = new PrivateRedis(await freePort(), mkdtempSync(join(tmpdir(), 'ij-chaos-redis-')), binary);
    await redis.spawnServer();
    return redis;
  }

  /** `redis://127.0.0.1:<port>`. */
  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  protected command(): ServerCommand {
    const logFile = join(this.dir, 'redis.log');
    return {
      binary: this.#binary,
      binaryVariable: 'REDIS_SERVER',
      args: [
        '--port', String(this.port), '--bind', '127.0.0.1', '--dir', this.dir,
        '--appendonly', 'yes', '--appendfsync', 'always', '--save', '',
        '--daemonize', 'no', '--logfile', logFile,
      ],
      logFile,
    };
  }

  /** Ready once it answers PING, after loading its AOF. */
  protected waitUntilReady(timeoutMs: number): Promise<void> {
    return waitForPing(this.port, timeoutMs);
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
