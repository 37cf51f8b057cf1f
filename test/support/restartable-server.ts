/**
 * A server process a test owns, on a port and in a temporary directory of its own, that the
 * test may crash (SIGKILL: no shutdown) and start again on the same port and directory, to see
 * clients reconnect and what the server kept on disk survive. The private nats-server and
 * redis-server build on it; each says how to start itself and how to tell it is ready.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { rmSync } from 'node:fs';

/** How to start a server: its binary, the variable naming another binary, its arguments, its log. */
export interface ServerCommand {
  readonly binary: string;
  /** The environment variable that points at another binary, named when the binary is missing. */
  readonly binaryVariable: string;
  readonly args: readonly string[];
  /** Where the server logs, named when it exits at start. */
  readonly logFile: string;
}

export abstract class RestartableServer {
  readonly port: number;
  readonly dir: string;
  #process: ChildProcess | undefined;

  protected constructor(port: number, dir: string) {
    this.port = port;
    this.dir = dir;
  }

  /** How to start this server. */
  protected abstract command(): ServerCommand;

  /** Resolves once the server serves (rejects after `timeoutMs`). */
  protected abstract waitUntilReady(timeoutMs: number): Promise<void>;

  /** Kills the server at once (SIGKILL: no shutdown, only what it fsynced remains). */
  async crash(): Promise<void> {
    const child = this.#process;
    this.#process = undefined;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = once(child, 'exit');
    child.kill('SIGKILL');
    await exited;
  }

  /** Kills the server, waits `downMs`, starts it again on the same port and directory. */
  async restart(downMs: number): Promise<void> {
    await this.crash();
    await new Promise((resolve) => setTimeout(resolve, downMs));
    await this.spawnServer();
  }

  /** Stops the server and deletes its directory. */
  async destroy(): Promise<void> {
    await this.crash();
    rmSync(this.dir, { recursive: true, force: true });
  }

  /** Starts the server and waits until it is ready, or until it failed to start. */
  protected async spawnServer(): Promise<void> {
    const { binary, binaryVariable, args, logFile } = this.command();
    const child = spawn(binary, args, { stdio: 'ignore' });
    const failed = new Promise<never>((_, reject) => {
      child.once('error', (error) => reject(new Error(`could not start ${binary}: ${error.message} (set ${binaryVariable} to its path)`)));
      child.once('exit', (code, signal) => reject(new Error(`${binary} exited at start (${code ?? signal}); see ${logFile}`)));
    });
    failed.catch(() => {});
    this.#process = child;
    await Promise.race([this.waitUntilReady(30_000), failed]);
  }
}
