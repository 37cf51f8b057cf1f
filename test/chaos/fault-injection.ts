/**
 * The chaos workers' crashes: the process SIGKILLs itself (no cleanup, no goodbye to Postgres
 * or Redis) at a named point, either with a probability per point
 * (`FAULT_POINTS="after-claim:0.02,before-commit:0.02,after-commit:0.02"`) or once when the
 * harness arms that point over IPC (the nemesis's scheduled crashes). The protocol's points are
 * reached through the library's fault hook; the multi-step handler's points (inside and between
 * its steps) are reached by the handler itself, through the same {@link Crasher}.
 */
import { writeSync } from 'node:fs';
import type { FaultHook, FaultPoint } from '../../src/process/index.js';
import { seededRandom } from './random.js';

/** The protocol's points a chaos worker can crash at (the relay's point belongs to the outbox relay). */
export const PROTOCOL_CRASH_POINTS = ['after-claim', 'before-commit', 'after-commit'] as const satisfies readonly FaultPoint[];

/**
 * The multi-step handler's points (`--steps`), reached only by that handler:
 * - `inside-database-step`: a database step's write is made, its record and COMMIT not sent;
 * - `inside-external-step`: the external system has recorded the call, the step is not recorded;
 * - `between-steps`: a step returned (recorded, replayed, or an external step's record still held
 *   back for the run's next round trip), the next step (or the completion) not begun.
 */
export const STEP_CRASH_POINTS = ['inside-database-step', 'inside-external-step', 'between-steps'] as const;

/** Every point a chaos worker can crash at. */
export const CRASH_POINTS = [...PROTOCOL_CRASH_POINTS, ...STEP_CRASH_POINTS] as const;
/** One of {@link CRASH_POINTS}. */
export type CrashPoint = (typeof CRASH_POINTS)[number];

/** Where a crash happened, written on its log line. */
export interface CrashContext {
  readonly scope?: string;
  readonly key?: string;
  /** The step the handler was in, or had just finished (step points only). */
  readonly step?: string;
}

/** Crashes the process at `point` when that point is armed or its random draw says so; else returns. */
export type Crasher = (point: CrashPoint, context: CrashContext) => void;

/** Crash probability per point. */
export type FaultRates = Partial<Record<CrashPoint, number>>;

/** The log line a worker writes just before it kills itself; the checker counts these. */
export const FAULT_LOG_MESSAGE = 'fault injected: crashing';

/**
 * Parses `FAULT_POINTS`: comma-separated `point:probability` pairs. Throws an error naming the
 * bad part (an unknown point, a probability outside [0, 1]).
 */
export function parseFaultPoints(text: string | undefined): FaultRates {
  const rates: FaultRates = {};
  if (!text || text.trim() === '') return rates;
  for (const part of text.split(',')) {
    const [name, probability, ...rest] = part.trim().split(':');
    if (!CRASH_POINTS.includes(name as CrashPoint) || rest.length > 0) {
      throw new Error(`FAULT_POINTS: "${part}" is not <point>:<probability> with point one of ${CRASH_POINTS.join(', ')}`);
    }
    const p = Number(probability);
    if (probability === undefined || probability.trim() === '' || !Number.isFinite(p) || p < 0 || p > 1) {
      throw new Error(`FAULT_POINTS: probability of "${name}" must be a number in [0, 1] (got "${probability ?? ''}")`);
    }
    rates[name as CrashPoint] = p;
  }
  return rates;
}

/** Crash points armed by the harness: the next time the worker reaches one, it crashes. */
export class ArmedFaults {
  readonly #armed = new Map<CrashPoint, number>();

  arm(point: CrashPoint): void {
    this.#armed.set(point, (this.#armed.get(point) ?? 0) + 1);
  }

  /** True once per arming. */
  take(point: FaultPoint | CrashPoint): boolean {
    const count = this.#armed.get(point as CrashPoint) ?? 0;
    if (count === 0) return false;
    this.#armed.set(point as CrashPoint, count - 1);
    return true;
  }
}

/** SIGKILLs this process at an armed point, or at random per `rates`. */
export function crasher(rates: FaultRates, armed: ArmedFaults, seed: number): Crasher {
  const random = seededRandom(seed, process.pid);
  return (point, context) => {
    const rate = rates[point] ?? 0;
    const armedHere = armed.take(point);
    if (!armedHere && !(rate > 0 && random.next() < rate)) return;
    // Written synchronously: the process dies on the next line, and the harness needs this line.
    const line = { level: 50, time: Date.now(), pid: process.pid, msg: FAULT_LOG_MESSAGE, point, armed: armedHere, ...context };
    writeSync(1, `${JSON.stringify(line)}\n`);
    process.kill(process.pid, 'SIGKILL');
  };
}

/** The library's fault hook over `crash`: the protocol's points crash; any other point is ignored. */
export function crashingFaultHook(crash: Crasher): FaultHook {
  return (point, context) => {
    if ((PROTOCOL_CRASH_POINTS as readonly string[]).includes(point)) crash(point as CrashPoint, context);
  };
}
