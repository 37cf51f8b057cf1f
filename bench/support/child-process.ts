/** Spawns benchmark child processes (tsx) and reads their JSON log lines. */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

/** A running child and what it printed. */
export interface BenchChild {
  readonly process: ChildProcess;
  readonly pid: number;
  readonly lines: Array<Record<string, unknown>>;
  /** Resolves with the first line matching `predicate` (past or future). */
  waitForLine(predicate: (line: Record<string, unknown>) => boolean, timeoutMs?: number): Promise<Record<string, unknown>>;
  /** Resolves with the exit code or signal. */
  readonly exited: Promise<number | string>;
  /** Sends SIGKILL if it still runs, and waits for the exit. */
  stop(): Promise<void>;
}

/**
 * Starts `node --import tsx <script>` (script relative to `bench/`), with `nodeBinary`
 * (default: this Node) and extra environment.
 */
export function startChild(script: string, env: Record<string, string>, nodeBinary: string = process.execPath): BenchChild {
  const path = fileURLToPath(new URL(`../${script}`, import.meta.url));
  const child = spawn(nodeBinary, ['--import', 'tsx', path], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
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
  const waitForLine = (predicate: (line: Record<string, unknown>) => boolean, timeoutMs = 60_000) =>
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
        reject(new Error(`${script} (pid ${child.pid}): no matching line within ${timeoutMs} ms. stderr: ${stderr}`));
      }, timeoutMs);
      const onExit = () => {
        cleanup();
        reject(new Error(`${script} (pid ${child.pid}) exited before a matching line. stderr: ${stderr}`));
      };
      watchers.add(check);
      child.once('exit', onExit);
      check();
    });
  return {
    process: child,
    pid: child.pid!,
    lines,
    waitForLine,
    exited,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGKILL');
        await exited;
      }
    },
  };
}

/** Resident set size of a process in MB, from /proc (Linux), or NaN once it is gone. */
export function rssMb(pid: number): number {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const match = /VmRSS:\s+(\d+)\s+kB/.exec(status);
    return match ? Number(match[1]) / 1024 : NaN;
  } catch {
    return NaN;
  }
}
