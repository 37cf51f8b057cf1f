/** Spawns real worker processes (tsx) and reads their JSON log lines. */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

export interface WorkerChild {
  readonly process: ChildProcess;
  readonly pid: number;
  /** Every JSON log line so far. */
  readonly lines: Array<Record<string, unknown>>;
  /** Resolves with the first log line matching `predicate` (past or future). */
  waitForLine(predicate: (line: Record<string, unknown>) => boolean, timeoutMs?: number): Promise<Record<string, unknown>>;
  kill(signal: NodeJS.Signals): void;
  /** Resolves with the exit code (or signal) once the process has ended. */
  exited: Promise<number | string>;
}

export async function startWorkerChild(
  entry: string,
  env: Record<string, string>,
  options: { readyTimeoutMs?: number } = {},
): Promise<WorkerChild> {
  const script = fileURLToPath(new URL(entry, import.meta.url));
  const child = spawn(process.execPath, ['--import', 'tsx', script], {
    env: { ...process.env, LOG_LEVEL: 'info', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const lines: Array<Record<string, unknown>> = [];
  const watchers = new Set<() => void>();
  let stderr = '';
  child.stderr!.on('data', (chunk) => (stderr += chunk));
  createInterface({ input: child.stdout! }).on('line', (text) => {
    try {
      lines.push(JSON.parse(text));
    } catch {
      lines.push({ msg: text });
    }
    for (const watch of watchers) watch();
  });
  const exited = once(child, 'exit').then(([code, signal]) => (code ?? signal) as number | string);

  const waitForLine = (predicate: (line: Record<string, unknown>) => boolean, timeoutMs = 20_000) =>
    new Promise<Record<string, unknown>>((resolve, reject) => {
      const check = () => {
        const found = lines.find(predicate);
        if (found) {
          cleanup();
          resolve(found);
        }
      };
      const timer = setTimeout(() => {
        cleanup();
        reject(new Error(`worker ${child.pid}: no matching log line within ${timeoutMs} ms. stderr: ${stderr.slice(-2000)}`));
      }, timeoutMs);
      const onExit = () => {
        cleanup();
        reject(new Error(`worker ${child.pid} exited before a matching log line. stderr: ${stderr.slice(-2000)}`));
      };
      const cleanup = () => {
        clearTimeout(timer);
        watchers.delete(check);
        child.off('exit', onExit);
      };
      watchers.add(check);
      child.once('exit', onExit);
      check();
    });

  const handle: WorkerChild = {
    process: child,
    pid: child.pid!,
    lines,
    waitForLine,
    kill: (signal) => {
      child.kill(signal);
    },
    exited,
  };
  await waitForLine((line) => line.msg === 'worker ready', options.readyTimeoutMs ?? 30_000);
  return handle;
}

/** Kills any child still running (test teardown). */
export async function stopChildren(children: WorkerChild[]): Promise<void> {
  for (const child of children) {
    if (child.process.exitCode === null && child.process.signalCode === null) {
      child.kill('SIGCONT');
      child.kill('SIGKILL');
      await child.exited;
    }
  }
}
