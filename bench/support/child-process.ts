/** Spawns benchmark child processes (tsx, or a command's own bin script) and reads their JSON log lines. */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { spawnJsonLogChild, spawnJsonLogProcess, type JsonLogChild } from '../../test/support/json-log-child.js';
import { withTimeout } from './throughput.js';

/** A running child and what it printed. */
export type BenchChild = JsonLogChild;

/**
 * Starts `node --import tsx <script>` (script relative to `bench/`), with `nodeBinary`
 * (default: this Node) and extra environment.
 */
export function startChild(script: string, env: Record<string, string>, nodeBinary: string = process.execPath): BenchChild {
  const path = fileURLToPath(new URL(`../${script}`, import.meta.url));
  return spawnJsonLogChild(path, env, { nodeBinary, defaultTimeoutMs: 60_000 });
}

/**
 * Starts `node <binScript> <args>` in `cwd`, as a user starts an installed command (the bin
 * script decides itself whether it runs TypeScript through tsx or the compiled build).
 */
export function startBinScript(binScript: string, args: readonly string[], env: Record<string, string>, cwd: string): BenchChild {
  return spawnJsonLogProcess([binScript, ...args], env, { cwd, defaultTimeoutMs: 60_000 });
}

/**
 * Stops a child the way a deployment does (SIGTERM: graceful shutdown); SIGKILL if it has not
 * exited within `graceMs`. Resolves with what it exited with, or `'SIGKILL'` if it had to be killed.
 */
export async function stopGracefully(child: BenchChild, graceMs = 10_000): Promise<number | string> {
  if (child.process.exitCode !== null || child.process.signalCode !== null) return child.exited;
  child.process.kill('SIGTERM');
  try {
    return await withTimeout(child.exited, graceMs, `pid ${child.pid} exiting after SIGTERM`);
  } catch {
    await child.stop();
    return 'SIGKILL';
  }
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
