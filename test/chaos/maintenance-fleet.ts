/**
 * Maintenance processes of a key-feature chaos run (`idempotent-jobs maintenance`, real
 * processes configured from the environment): the janitor of the tombstone profile, the racing
 * schedulers of the scheduler profile. A supervisor starts a process again whenever one exits
 * (a fault of Postgres or Redis may end one), and {@link MaintenanceFleet.chaos} kills them with
 * SIGKILL at seeded times, one or all at once, starting them again after a seeded delay (the
 * scheduler profile; the tombstone profile's janitor is left running). A process may run with
 * its wall clock skewed (`clock-skew.ts`), the same offset for every process of its slot.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { clockSkewArgs, clockSkewEnv } from './clock-skew.js';
import { abortableSleep } from './nemesis.js';
import { seededRandom } from './random.js';

const BIN = fileURLToPath(new URL('../../bin/idempotent-jobs.js', import.meta.url));

/** Options of {@link MaintenanceFleet}. */
export interface MaintenanceFleetOptions {
  readonly count: number;
  /** The processes' environment, on top of the harness's PATH. */
  readonly env: Readonly<Record<string, string>>;
  /** Per slot, how far the process's wall clock is off, in ms (positive: ahead); none by default. */
  readonly clockSkewsMs?: readonly number[];
}

/** A fleet of maintenance processes under a supervisor. */
export class MaintenanceFleet {
  readonly #options: MaintenanceFleetOptions;
  readonly #children: Array<ChildProcess | undefined>;
  /** Processes that logged "maintenance ready": running their tasks. */
  readonly #ready = new Set<ChildProcess>();
  #stopping = false;
  /** SIGKILLs sent by {@link chaos}. */
  kills = 0;
  /** Processes started, restarts included. */
  starts = 0;

  constructor(options: MaintenanceFleetOptions) {
    this.#options = options;
    this.#children = Array.from({ length: options.count }, () => undefined);
  }

  start(): void {
    for (let slot = 0; slot < this.#children.length; slot++) this.#spawn(slot);
  }

  #spawn(slot: number): void {
    if (this.#stopping) return;
    const skew = this.#options.clockSkewsMs?.[slot] ?? 0;
    const child = spawn(process.execPath, [...(skew !== 0 ? clockSkewArgs() : []), BIN, 'maintenance'], {
      env: { PATH: process.env.PATH ?? '', ...this.#options.env, ...(skew !== 0 ? clockSkewEnv(skew) : {}), LOG_LEVEL: 'info' },
      stdio: ['ignore', 'pipe', 'ignore'],
    });
    this.starts++;
    this.#children[slot] = child;
    createInterface({ input: child.stdout! }).on('line', (line) => {
      if (line.includes('"maintenance ready"')) this.#ready.add(child);
    });
    child.once('exit', () => {
      this.#ready.delete(child);
      if (this.#children[slot] !== child || this.#stopping) return;
      // Ended by itself (a server down at start) or killed: a supervisor starts it again.
      this.#children[slot] = undefined;
      setTimeout(() => {
        if (!this.#children[slot]) this.#spawn(slot);
      }, 500).unref();
    });
  }

  /** Waits until every process runs its tasks (tsx compiles each at start: slow on a busy machine). */
  async ready(timeoutMs = 180_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (this.#ready.size < this.#children.length) {
      if (Date.now() > deadline) throw new Error(`maintenance processes not ready within ${timeoutMs} ms`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }

  /** Processes running their tasks now. */
  get readyCount(): number {
    return this.#ready.size;
  }

  /**
   * Kills processes with SIGKILL at seeded times (every 3–8 s: one running process, or, one
   * time in four, all running ones), each started again after 0–2 s, until `signal` aborts. Only
   * processes that are running their tasks are killed: a start takes seconds (tsx compiles the
   * sources), and killing processes still starting would leave no scheduler ever running.
   */
  async chaos(seed: number, signal: AbortSignal): Promise<void> {
    const random = seededRandom(seed, 11);
    while (!signal.aborted) {
      await abortableSleep(random.int(3_000, 8_000), signal);
      if (signal.aborted) return;
      const all = random.next() < 0.25;
      const running = this.#children.flatMap((child, slot) => (child && this.#ready.has(child) ? [slot] : []));
      if (running.length === 0) continue;
      const slots = all ? running : [random.pick(running)];
      const delay = random.int(0, 2_000);
      await Promise.all(slots.map((slot) => this.#kill(slot, delay)));
    }
  }

  async #kill(slot: number, restartAfterMs: number): Promise<void> {
    const child = this.#children[slot];
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    // Taken out of the supervisor's hands: started again after the chosen delay instead.
    this.#children[slot] = undefined;
    const exited = once(child, 'exit');
    child.kill('SIGKILL');
    this.kills++;
    await exited;
    setTimeout(() => {
      if (!this.#children[slot]) this.#spawn(slot);
    }, restartAfterMs).unref();
  }

  /** Stops every process: SIGTERM (a graceful stop: a round in progress finishes), SIGKILL after `timeoutMs`. */
  async stop(timeoutMs = 10_000): Promise<void> {
    this.#stopping = true;
    await Promise.all(
      this.#children.map(async (child) => {
        if (!child || child.exitCode !== null || child.signalCode !== null) return;
        const exited = once(child, 'exit');
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
        await exited;
        clearTimeout(timer);
      }),
    );
  }
}
