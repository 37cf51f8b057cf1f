/** Spawns real worker processes (tsx) for the tests and waits until they take jobs. */
import { fileURLToPath } from 'node:url';
import { spawnJsonLogChild, type JsonLogChild } from './json-log-child.js';

export interface WorkerChild extends JsonLogChild {
  kill(signal: NodeJS.Signals): void;
}

/** Starts the worker script `entry` (relative to this folder) and resolves once it logs `worker ready`. */
export async function startWorkerChild(
  entry: string,
  env: Record<string, string>,
  options: { readyTimeoutMs?: number } = {},
): Promise<WorkerChild> {
  const script = fileURLToPath(new URL(entry, import.meta.url));
  const child = spawnJsonLogChild(script, { LOG_LEVEL: 'info', ...env });
  const handle: WorkerChild = { ...child, kill: (signal) => void child.process.kill(signal) };
  await child.waitForLine((line) => line.msg === 'worker ready', options.readyTimeoutMs ?? 30_000);
  return handle;
}

/** Kills any child still running (test teardown). */
export async function stopChildren(children: WorkerChild[]): Promise<void> {
  for (const child of children) await child.stop();
}
