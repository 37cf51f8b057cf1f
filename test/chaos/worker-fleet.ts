/**
 * K chaos worker processes, each in a slot. A worker that dies (killed by the nemesis, or
 * crashed by its fault hook) is replaced in its slot at once. A worker that exits before it is
 * ready (it could not reach Postgres or Redis while the nemesis had them down) is started
 * again after a growing delay, as a supervisor would; only a slot that keeps failing to start
 * voids the run. Every worker's JSON log lines
 * that matter to the checker are kept, with the time and pid pino writes on each. A slot's
 * worker may run with its wall clock skewed (`clock-skew.ts`); its log times are then taken
 * back to the real clock, which the checker compares with the harness's and the database's.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { clockSkewArgs, clockSkewEnv } from './clock-skew.js';
import type { CrashPoint } from './fault-injection.js';
import { FAULT_LOG_MESSAGE, STORE_FAULT_LOG_MESSAGE } from './fault-injection.js';

/** One worker log line, reduced to what the checker reads. */
export interface WorkerLogLine {
  readonly time: number;
  readonly pid: number;
  readonly msg: string;
  readonly level: number;
  readonly outcome?: string;
  readonly scope?: string;
  readonly key?: string;
  readonly fence?: number;
  readonly jobId?: string;
  /** Which delivery of the job the line's run is (BullMQ's attemptsStarted). */
  readonly delivery?: number;
  /** On fault lines: where the worker crashed. */
  readonly point?: string;
  /** On fault lines at a step point, and on failures inside a step: the step. */
  readonly step?: string;
  /** On error lines: the error's message. */
  readonly err?: string;
  /** On `concurrency-limited` lines: the concurrency key that refused the job. */
  readonly concurrencyKey?: string;
}

/** How a worker process ended. */
export interface WorkerExit {
  readonly pid: number;
  readonly slot: number;
  readonly at: number;
  readonly code: number | null;
  readonly signal: string | null;
  /** It exited before it was ready (it could not start: a server it needs was down). */
  readonly beforeReady: boolean;
}

/** Options of {@link WorkerFleet}. */
export interface WorkerFleetOptions {
  readonly count: number;
  /** Environment of every worker (on top of this process's). */
  readonly env: Record<string, string>;
  /**
   * Gives up when a slot's worker exits on its own, by code, before it was ready this many times
   * in a row (the delays between them add up to about half a minute). @defaultValue 10
   */
  readonly maxStartFailures?: number;
  /** Per slot, how far its worker's wall clock is off, in ms (positive: ahead); none by default. */
  readonly clockSkewsMs?: readonly number[];
  /** Per slot, environment on top of `env` (the concurrency profile runs half its workers on the fast path); none by default. */
  readonly envPerSlot?: ReadonlyArray<Record<string, string>>;
}

interface Slot {
  child: ChildProcess | undefined;
  ready: boolean;
  paused: boolean;
  /** Exits before ready since the slot's last ready worker. */
  startFailures: number;
}

const ENTRY = fileURLToPath(new URL('./chaos-worker.ts', import.meta.url));
const KEPT_MESSAGES = new Set(['worker ready', FAULT_LOG_MESSAGE, STORE_FAULT_LOG_MESSAGE]);

/** The worker processes of one chaos run. */
export class WorkerFleet {
  readonly lines: WorkerLogLine[] = [];
  readonly exits: WorkerExit[] = [];
  readonly starts: Array<{ pid: number; slot: number; at: number }> = [];
  readonly #options: WorkerFleetOptions;
  readonly #slots: Slot[];
  readonly #stderr = new Map<number, string>();
  #stopping = false;
  #failure: Error | undefined;

  constructor(options: WorkerFleetOptions) {
    this.#options = options;
    this.#slots = Array.from({ length: options.count }, () => ({ child: undefined, ready: false, paused: false, startFailures: 0 }));
  }

  /** Set when workers cannot start (a configuration or environment problem): the run is void. */
  get failure(): Error | undefined {
    return this.#failure;
  }

  get size(): number {
    return this.#slots.length;
  }

  /** Starts every slot's worker and waits until all are ready (tsx compiles each at start: slow on a busy machine). */
  async start(timeoutMs = 180_000): Promise<void> {
    for (let slot = 0; slot < this.#slots.length; slot++) this.#spawn(slot);
    const deadline = Date.now() + timeoutMs;
    while (!this.#slots.every((s) => s.ready)) {
      if (this.#failure) throw this.#failure;
      if (Date.now() > deadline) throw new Error(`chaos workers not ready within ${timeoutMs} ms`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  /** The pid running in `slot`, if any. */
  pidOf(slot: number): number | undefined {
    return this.#slots[slot]?.child?.pid;
  }

  /** Sends `signal` to the worker in `slot`; returns its pid, or undefined when none runs. */
  signal(slot: number, signal: NodeJS.Signals): number | undefined {
    const s = this.#slots[slot];
    const child = s?.child;
    if (!s || !child || child.exitCode !== null || child.signalCode !== null) return undefined;
    if (signal === 'SIGSTOP') s.paused = true;
    if (signal === 'SIGCONT') s.paused = false;
    child.kill(signal);
    return child.pid;
  }

  /** Whether the worker in `slot` is stopped by SIGSTOP. */
  isPaused(slot: number): boolean {
    return this.#slots[slot]?.paused ?? false;
  }

  /** Arms one crash at `point` in the worker of `slot` (it crashes the next time it gets there). */
  arm(slot: number, point: CrashPoint): number | undefined {
    const child = this.#slots[slot]?.child;
    if (!child || !child.connected) return undefined;
    child.send({ arm: point }, () => {});
    return child.pid;
  }

  /** Recent stderr of a worker, for diagnostics. */
  stderrOf(pid: number): string {
    return this.#stderr.get(pid) ?? '';
  }

  /** Graceful stop: SIGCONT, SIGTERM, wait; SIGKILL whatever is left after `timeoutMs`. */
  async stop(timeoutMs: number): Promise<void> {
    this.#stopping = true;
    const children = this.#slots.map((s) => s.child).filter((c): c is ChildProcess => alive(c));
    for (const child of children) {
      child.kill('SIGCONT');
      child.kill('SIGTERM');
    }
    const all = Promise.all(children.map((child) => (alive(child) ? once(child, 'exit') : undefined)));
    const timer = new Promise((resolve) => setTimeout(resolve, timeoutMs).unref());
    await Promise.race([all, timer]);
    await this.killAll();
  }

  /** SIGKILLs every worker (cleanup, also on failure or Ctrl-C). */
  async killAll(): Promise<void> {
    this.#stopping = true;
    const children = this.#slots.map((s) => s.child).filter((c): c is ChildProcess => alive(c));
    for (const child of children) {
      child.kill('SIGCONT');
      child.kill('SIGKILL');
    }
    await Promise.all(children.map((child) => (alive(child) ? once(child, 'exit') : undefined)));
  }

  #spawn(slot: number): void {
    const skew = this.#options.clockSkewsMs?.[slot] ?? 0;
    const child = spawn(process.execPath, [...(skew !== 0 ? clockSkewArgs() : ['--import', 'tsx']), ENTRY], {
      env: { ...process.env, ...this.#options.env, ...this.#options.envPerSlot?.[slot], ...clockSkewEnv(skew) },
      stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
    });
    const s = this.#slots[slot]!;
    s.child = child;
    s.ready = false;
    s.paused = false;
    const pid = child.pid!;
    this.starts.push({ pid, slot, at: Date.now() });
    child.on('error', () => {});
    child.stderr!.on('data', (chunk: Buffer) => this.#stderr.set(pid, ((this.#stderr.get(pid) ?? '') + chunk.toString()).slice(-4000)));
    createInterface({ input: child.stdout! }).on('line', (text) => {
      const line = parseLine(text, skew);
      if (!line) return;
      if (line.msg === 'worker ready' && s.child === child) {
        s.ready = true;
        s.startFailures = 0;
      }
      this.lines.push(line);
    });
    child.once('exit', (code, signal) => {
      this.exits.push({ pid, slot, at: Date.now(), code, signal, beforeReady: !(s.child === child && s.ready) });
      if (this.#stopping || s.child !== child) return;
      s.child = undefined;
      if (signal === null && !s.ready) {
        s.startFailures++;
        if (s.startFailures >= (this.#options.maxStartFailures ?? 10)) {
          this.#failure = new Error(`chaos worker ${pid} exited with code ${code} before it was ready, ${s.startFailures} times in a row:\n${this.stderrOf(pid)}`);
          return;
        }
        const delay = Math.min(5_000, 100 * 2 ** s.startFailures);
        setTimeout(() => {
          if (!this.#stopping && s.child === undefined) this.#spawn(slot);
        }, delay).unref();
        return;
      }
      this.#spawn(slot);
    });
  }
}

function alive(child: ChildProcess | undefined): child is ChildProcess {
  return child !== undefined && child.exitCode === null && child.signalCode === null;
}

/** A log line of a worker whose clock is `skewMs` off, its time taken back to the real clock. */
function parseLine(text: string, skewMs: number): WorkerLogLine | undefined {
  let raw: Record<string, unknown>;
  try {
    raw = JSON.parse(text);
  } catch {
    return undefined;
  }
  const msg = String(raw.msg ?? '');
  const level = Number(raw.level ?? 30);
  if (raw.outcome === undefined && !KEPT_MESSAGES.has(msg) && level < 50) return undefined;
  const err = raw.err as { message?: string } | undefined;
  return {
    time: Number(raw.time) - skewMs,
    pid: Number(raw.pid),
    msg,
    level,
    ...(typeof raw.outcome === 'string' ? { outcome: raw.outcome } : {}),
    ...(typeof raw.scope === 'string' ? { scope: raw.scope } : {}),
    ...(typeof raw.key === 'string' ? { key: raw.key } : {}),
    ...(raw.fence !== undefined ? { fence: Number(raw.fence) } : {}),
    ...(typeof raw.jobId === 'string' ? { jobId: raw.jobId } : {}),
    ...(typeof raw.delivery === 'number' ? { delivery: raw.delivery } : {}),
    ...(typeof raw.point === 'string' ? { point: raw.point } : {}),
    ...(typeof raw.step === 'string' ? { step: raw.step } : {}),
    ...(err?.message ? { err: err.message } : {}),
    ...(typeof raw.concurrencyKey === 'string' ? { concurrencyKey: raw.concurrencyKey } : {}),
  };
}
