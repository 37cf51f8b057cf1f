/**
 * Spawns `node --import tsx <script>` and reads its stdout as JSON log lines (pino's format),
 * so tests and benchmarks can wait for a line such as `worker ready` or a job's outcome.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';

/** A running child and what it has printed. */
export interface JsonLogChild {
  readonly process: ChildProcess;
  readonly pid: number;
  /** Every stdout line so far, parsed (a line that is not JSON becomes `{ msg: line }`). */
  readonly lines: Array<Record<string, unknown>>;
  /** Resolves with the first line matching `predicate` (past or future); rejects on timeout or exit. */
  waitForLine(predicate: (line: Record<string, unknown>) => boolean, timeoutMs?: number): Promise<Record<string, unknown>>;
  /** The last 4000 characters it wrote to stderr (for error messages). */
  stderrTail(): string;
  /** Resolves with the exit code, or the signal that ended it. */
  readonly exited: Promise<number | string>;
  /** Sends SIGCONT and SIGKILL if it still runs (a paused child too), and waits for the exit. */
  stop(): Promise<void>;
}

/** How a child is started besides its arguments. */
export interface JsonLogChildOptions {
  /** @defaultValue this process's Node */
  readonly nodeBinary?: string;
  /** @defaultValue 20 000 */
  readonly defaultTimeoutMs?: number;
  /** @defaultValue this process's working directory */
  readonly cwd?: string;
}

/** Starts `scriptPath` under tsx with `nodeBinary` (default: this Node) and `env` added to this process's. */
export function spawnJsonLogChild(scriptPath: string, env: Record<string, string>, options: JsonLogChildOptions = {}): JsonLogChild {
  return spawnJsonLogProcess(['--import', 'tsx', scriptPath], env, options);
}

/**
 * Starts `node <nodeArgs>` as it is, without tsx, e.g. a command's bin script that registers
 * tsx itself (`bin/idempotent-jobs.js worker …`), so that it starts the way its users start it.
 */
export function spawnJsonLogProcess(nodeArgs: readonly string[], env: Record<string, string>, options: JsonLogChildOptions = {}): JsonLogChild {
  const child = spawn(options.nodeBinary ?? process.execPath, nodeArgs, {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    cwd: options.cwd,
  });
  const lines: Array<Record<string, unknown>> = [];
  const watchers = new Set<() => void>();
  let stderr = '';
  child.stderr!.on('data', (chunk) => (stderr = (stderr + chunk).slice(-4000)));
  createInterface({ input: child.stdout! }).on('line', (text) => {
    try {
      lines.push(JSON.parse(text));
    } catch {
      lines.push({ msg: text });
    }
    for (const watch of watchers) watch();
  });
  const exited = once(child, 'exit').then(([code, signal]) => (code ?? signal) as number | string);
  const name = `${nodeArgs.join(' ')} (pid ${child.pid})`;

  const waitForLine = (predicate: (line: Record<string, unknown>) => boolean, timeoutMs = options.defaultTimeoutMs ?? 20_000) =>
    new Promise<Record<string, unknown>>((resolve, reject) => {
      const cleanup = () => {
        clearTimeout(timer);
        watchers.delete(check);
        child.off('exit', onExit);
      };
      const check = () => {
        const found = lines.find(predicate);
        if (found) {
          cleanup();
          resolve(found);
        }
      };
      const timer = setTimeout(() => {
        cleanup();
        reject(new Error(`${name}: no matching log line within ${timeoutMs} ms. stderr: ${stderr}`));
      }, timeoutMs);
      const onExit = () => {
        cleanup();
        reject(new Error(`${name} exited before a matching log line. stderr: ${stderr}`));
      };
      watchers.add(check);
      child.once('exit', onExit);
      check();
    });

  return {
    process: child,
    pid: child.pid!,
    lines,
    stderrTail: () => stderr,
    waitForLine,
    exited,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGCONT');
        child.kill('SIGKILL');
        await exited;
      }
    },
  };
}
