/**
 * A nats-server of a test's own (`-js`, its own store directory) on a port of the range set
 * aside for these tests (14200–14299, the first free one), for tests that restart or cut the
 * broker. The shared server on 4222 is never touched. `restart` kills it (SIGKILL) and starts it
 * again on the same port and store: streams, consumers and unacknowledged messages survive as
 * JetStream's file store kept them.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { createConnection, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const PORT_RANGE = { first: 14200, last: 14299 } as const;

export class PrivateNats {
  readonly port: number;
  readonly dir: string;
  #process: ChildProcess | undefined;

  private constructor(port: number, dir: string) {
    this.port = port;
    this.dir = dir;
  }

  static async start(): Promise<PrivateNats> {
    const server = new PrivateNats(await freePortInRange(), mkdtempSync(join(tmpdir(), 'ij-nats-')));
    await server.#spawn();
    return server;
  }

  /** `127.0.0.1:<port>`. */
  get url(): string {
    return `127.0.0.1:${this.port}`;
  }

  /** Kills the server at once (no shutdown). */
  async crash(): Promise<void> {
    const child = this.#process;
    this.#process = undefined;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = once(child, 'exit');
    child.kill('SIGKILL');
    await exited;
  }

  /** Kills the server, waits `downMs`, starts it again on the same port and store. */
  async restart(downMs: number): Promise<void> {
    await this.crash();
    await new Promise((resolve) => setTimeout(resolve, downMs));
    await this.#spawn();
  }

  /** Stops the server and deletes its store. */
  async destroy(): Promise<void> {
    await this.crash();
    rmSync(this.dir, { recursive: true, force: true });
  }

  async #spawn(): Promise<void> {
    const binary = process.env.NATS_SERVER ?? 'nats-server';
    const child = spawn(binary, ['-js', '-a', '127.0.0.1', '-p', String(this.port), '-sd', this.dir, '-l', join(this.dir, 'nats.log')], { stdio: 'ignore' });
    const failed = new Promise<never>((_, reject) => {
      child.once('error', (error) => reject(new Error(`could not start ${binary}: ${error.message} (set NATS_SERVER to its path)`)));
      child.once('exit', (code, signal) => reject(new Error(`${binary} exited at start (${code ?? signal}); see ${this.dir}/nats.log`)));
    });
    failed.catch(() => {});
    this.#process = child;
    await Promise.race([waitForPort(this.port, 30_000), failed]);
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
