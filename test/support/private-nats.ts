/**
 * A nats-server of a test's own (`-js`, its own store directory) on a port of the range set
 * aside for these tests (14200–14299, the first free one), for tests that restart or cut the
 * broker. The shared server on 4222 is never touched. `restart` kills it (SIGKILL) and starts it
 * again on the same port and store: streams, consumers and unacknowledged messages survive as
 * JetStream's file store kept them.
 */
import { mkdtempSync } from 'node:fs';
import { createConnection, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RestartableServer, type ServerCommand } from './restartable-server.js';

const PORT_RANGE = { first: 14200, last: 14299 } as const;

export class PrivateNats extends RestartableServer {
  private constructor(port: number, dir: string) {
    super(port, dir);
  }

  static async start(): Promise<PrivateNats> {
    const server = new PrivateNats(await freePortInRange(), mkdtempSync(join(tmpdir(), 'ij-nats-')));
    await server.spawnServer();
    return server;
  }

  /** `127.0.0.1:<port>`. */
  get url(): string {
    return `127.0.0.1:${this.port}`;
  }

  protected command(): ServerCommand {
    const logFile = join(this.dir, 'nats.log');
    return {
      binary: process.env.NATS_SERVER ?? 'nats-server',
      binaryVariable: 'NATS_SERVER',
      args: ['-js', '-a', '127.0.0.1', '-p', String(this.port), '-sd', this.dir, '-l', logFile],
      logFile,
    };
  }

  protected waitUntilReady(timeoutMs: number): Promise<void> {
    return waitForPort(this.port, timeoutMs);
  }
}

async function freePortInRange(): Promise<number> {
  // Start at a random place in the range, so files starting at once rarely race for a port.
  const size = PORT_RANGE.last - PORT_RANGE.first + 1;
  const offset = Math.floor(Math.random() * size);
  for (let i = 0; i < size; i++) {
    const port = PORT_RANGE.first + ((offset + i) % size);
    if (await portIsFree(port)) return port;
  }
  throw new Error(`no free port in ${PORT_RANGE.first}-${PORT_RANGE.last} for a private nats-server`);
}

function portIsFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}

async function waitForPort(port: number, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const open = await new Promise<boolean>((resolve) => {
      const socket = createConnection({ port, host: '127.0.0.1' });
      socket.once('connect', () => {
        socket.destroy();
        resolve(true);
      });
      socket.once('error', () => resolve(false));
    });
    if (open) return;
    if (Date.now() > deadline) throw new Error(`nats-server did not listen on ${port} within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
