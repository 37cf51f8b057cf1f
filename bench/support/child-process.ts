/** Spawns benchmark child processes (tsx) and reads their JSON log lines. */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { spawnJsonLogChild, type JsonLogChild } from '../../test/support/json-log-child.js';

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
