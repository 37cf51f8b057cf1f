/**
 * A process clock off by a fixed offset, for the chaos profiles that test what must not depend
 * on a process's own clock (the scheduler's ticks: the database's clock decides). A child
 * process gets it with {@link clockSkewArgs} and {@link clockSkewEnv}: Node loads
 * `clock-skew-preload.ts` before the process's own modules, and that replaces the global `Date`
 * with {@link skewedDate}. `Date.now()`, `new Date()` and `Date()` read the skewed clock (so do
 * pino's log times, BullMQ's job timestamps and delays); timers, `performance.now()` and
 * `process.hrtime()` are monotonic and unaffected, as on a host whose wall clock is wrong.
 */
import { fileURLToPath } from 'node:url';

/** The variable that carries the offset, in ms (positive: ahead). */
export const CLOCK_SKEW_VARIABLE = 'CLOCK_SKEW_MS';

const PRELOAD = fileURLToPath(new URL('./clock-skew-preload.ts', import.meta.url));

/**
 * `Date` with its clock moved by `offsetMs`: `now()`, `new Date()` and `Date()` are skewed;
 * a date built from a value, `Date.parse`, `Date.UTC` and the prototype are the real ones, so
 * `instanceof Date` holds both ways.
 */
export function skewedDate(offsetMs: number, real: DateConstructor = Date): DateConstructor {
  if (!Number.isFinite(offsetMs)) throw new RangeError(`clock skew must be a finite number of ms; got ${offsetMs}`);
  const now = () => real.now() + offsetMs;
  // A date of the skewed constructor is a real Date: the prototype is the real one.
  const skewed: DateConstructor = new Proxy(real, {
    construct(target, args, newTarget) {
      return Reflect.construct(target, args.length === 0 ? [now()] : args, newTarget === skewed ? target : newTarget);
    },
    apply() {
      return new real(now()).toString();
    },
    get(target, property, receiver) {
      if (property === 'now') return now;
      return Reflect.get(target, property, receiver);
    },
  });
  return skewed;
}

/**
 * Reads the offset from the environment: undefined when unset or empty; a clear error when it is
 * not an integer number of ms.
 */
export function clockSkewFromEnv(env: NodeJS.ProcessEnv = process.env): number | undefined {
  const raw = env[CLOCK_SKEW_VARIABLE];
  if (raw === undefined || raw.trim() === '') return undefined;
  const offset = Number(raw);
  if (!Number.isSafeInteger(offset)) throw new RangeError(`${CLOCK_SKEW_VARIABLE} must be an integer number of ms (positive: ahead); got '${raw}'`);
  return offset;
}

/** Node's arguments that load the preload (after tsx, which compiles it). */
export function clockSkewArgs(): string[] {
  return ['--import', 'tsx', '--import', PRELOAD];
}

/** The child's environment entry for `offsetMs`. */
export function clockSkewEnv(offsetMs: number): Record<string, string> {
  return { [CLOCK_SKEW_VARIABLE]: String(Math.round(offsetMs)) };
}
