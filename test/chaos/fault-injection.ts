/**
 * The chaos workers' crashes: the process SIGKILLs itself (no cleanup, no goodbye to Postgres
 * or Redis) at a named point, either with a probability per point
 * (`FAULT_POINTS="after-claim:0.02,before-commit:0.02,after-commit:0.02"`) or once when the
 * harness arms that point over IPC (the nemesis's scheduled crashes). The protocol's points are
 * reached through the library's fault hook; the multi-step handler's points (inside and between
 * its steps) are reached by the handler itself, through the same {@link Crasher}.
 */
import { writeSync } from 'node:fs';
import { StoreUnavailableError } from '../../src/index.js';
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

/**
 * The protocol's points where a chaos worker's store fails (`STORE_FAULT_POINTS`, the
 * `--coalescing` profile): the hand-over of a coalescing job to its pending successor, before it
 * is sent or after Postgres answered it. A store fault, not a crash: the job is deferred without
 * using an attempt, and its redelivery goes on from what the hand-over left.
 */
export const STORE_FAULT_POINTS = ['before-hand-over', 'after-hand-over'] as const satisfies readonly FaultPoint[];
/** One of {@link STORE_FAULT_POINTS}. */
export type StoreFaultPoint = (typeof STORE_FAULT_POINTS)[number];

/** The log line a worker writes when it makes the store fail; the checker counts these. */
export const STORE_FAULT_LOG_MESSAGE = 'fault injected: store fault';

/** Parses `STORE_FAULT_POINTS`, as `FAULT_POINTS` (`before-hand-over:0.2,after-hand-over:0.2`). */
export function parseStoreFaultPoints(text: string | undefined): Partial<Record<StoreFaultPoint, number>> {
  const rates: Partial<Record<StoreFaultPoint, number>> = {};
  if (!text || text.trim() === '') return rates;
  for (const part of text.split(',')) {
    const [name, probability, ...rest] = part.trim().split(':');
    const p = Number(probability);
    if (!STORE_FAULT_POINTS.includes(name as StoreFaultPoint) || rest.length > 0 || probability === undefined || probability.trim() === '' || !Number.isFinite(p) || p < 0 || p > 1) {
      throw new Error(`STORE_FAULT_POINTS: "${part}" is not <point>:<probability> with point one of ${STORE_FAULT_POINTS.join(', ')} and probability in [0, 1]`);
    }
    rates[name as StoreFaultPoint] = p;
  }
  return rates;
}

/**
 * The library's fault hook that fails the store at `rates`' points: throws the store fault a
 * serialization failure (40001) there would be, after writing a line the checker counts.
 */
export function storeFaultHook(rates: Partial<Record<StoreFaultPoint, number>>, seed: number): FaultHook {
  const random = seededRandom(seed, process.pid + 1);
  return (point, context) => {
    const rate = rates[point as StoreFaultPoint] ?? 0;
    if (!(rate > 0 && random.next() < rate)) return;
    writeSync(1, `${JSON.stringify({ level: 40, time: Date.now(), pid: process.pid, msg: STORE_FAULT_LOG_MESSAGE, point, ...context })}\n`);
    const cause = Object.assign(new Error(`could not serialize access due to concurrent update (injected at ${point})`), { code: '40001' });
    throw new StoreUnavailableError(context.scope ?? '', context.key ?? '', `coalescing hand-over (${point})`, { cause });
  };
}
