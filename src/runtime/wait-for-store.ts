import type { Logger } from 'pino';
import { describeError } from '../describe-error.js';
import { isTransientStoreError } from '../store/pg-errors.js';

/** Options of {@link waitForStore}. */
export interface WaitForStoreOptions {
  /** What is being waited for, as the log and the final error say it, e.g. `'Postgres (migrations)'`. */
  readonly what: string;
  /** When to give up, in `Date.now()` time: one deadline shared by every step of a start. */
  readonly deadline: number;
  /** The variable that sets the deadline, named in the final error. @defaultValue `'STARTUP_WAIT_MS'` */
  readonly setting?: string;
  readonly logger: Logger;
  /** Whether a failed try is worth another. @defaultValue transient store faults (refused, reset, starting up, …) */
  readonly retryable?: (error: unknown) => boolean;
  /** Wait after the first failed try; doubles after each. @defaultValue `250` */
  readonly firstDelayMs?: number;
  /** Longest wait between tries. @defaultValue `4000` */
  readonly maxDelayMs?: number;
}

/** A server a starting process needs stayed unreachable until the start's deadline. */
export class StoreUnreachableAtStartError extends Error {
  constructor(what: string, tries: number, waitedMs: number, setting: string, options: { cause: unknown }) {
    const cause = describeError(options.cause);
    super(
      `${what} was still unreachable after ${tries} tries over ${Math.round(waitedMs / 1000)} s (last error: ${cause}); ` +
        `giving up. Check that the server is up and its URL is right; ${setting} sets how long a starting process waits.`,
      options,
    );
    this.name = new.target.name;
  }
}

/**
 * Runs `attempt` until it succeeds. A process starting while Postgres or Redis is down (a
 * restart, a whole stack coming up at once) waits for it instead of crashing: each transient
 * failure is logged as one warning line (its stack at debug) and tried again after an
 * exponential backoff, until the deadline; then a {@link StoreUnreachableAtStartError}. Any other error (a wrong password, a
 * missing database, a schema it may not create) is thrown at once: waiting cannot fix it.
 */
export async function waitForStore<T>(attempt: () => Promise<T>, options: WaitForStoreOptions): Promise<T> {
  const retryable = options.retryable ?? isTransientStoreError;
  const maxDelayMs = options.maxDelayMs ?? 4_000;
  const startedAt = Date.now();
  let delayMs = options.firstDelayMs ?? 250;
  let previous: unknown;
  for (let tries = 1; ; tries++) {
    try {
      return await beforeDeadline(attempt(), options.deadline);
    } catch (error) {
      // A try cut short by the deadline says less than the error of the try before it.
      const cause = error instanceof NoAnswerError ? (previous ?? error) : error;
      const giveUp = () => new StoreUnreachableAtStartError(options.what, tries, Date.now() - startedAt, options.setting ?? 'STARTUP_WAIT_MS', { cause });
      if (error instanceof NoAnswerError) throw giveUp();
      if (!retryable(error)) throw error;
      previous = error;
      const left = options.deadline - Date.now();
      if (left <= 0) throw giveUp();
      const waitMs = Math.min(delayMs, left);
      // One line per try, the error's message in it; its stack only at debug: a server that is
      // down is not a defect, and a stack per try buries the one line that says so.
      options.logger.warn({ error: describeError(error), tries, retryInMs: waitMs }, `${options.what} is not reachable yet; trying again in ${waitMs} ms`);
      options.logger.debug({ err: error, tries }, `${options.what}: the failed try's error`);
      await new Promise((resolve) => setTimeout(resolve, waitMs));
      delayMs = Math.min(delayMs * 2, maxDelayMs);
    }
  }
}

/** The server accepted the connection but did not answer before the deadline (a frozen server). */
class NoAnswerError extends Error {
  constructor() {
    super('no answer (the server accepted the connection but did not reply)');
    this.name = new.target.name;
  }
}

/**
 * `attempt`, or a {@link NoAnswerError} at the deadline: a frozen server (SIGSTOP, an I/O stall)
 * accepts connections and never answers, and node-postgres has no connect timeout by default.
 */
function beforeDeadline<T>(attempt: Promise<T>, deadline: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new NoAnswerError()), Math.max(0, deadline - Date.now()));
  });
  return Promise.race([attempt, timeout]).finally(() => clearTimeout(timer));
}

/** Thrown by {@link readyWithin} when the wait ran out: worth another try. */
export class NotReadyYetError extends Error {
  constructor(readonly lastError: unknown) {
    super(lastError instanceof Error ? lastError.message : 'not ready yet', { cause: lastError });
    this.name = new.target.name;
  }
}

/**
 * Waits up to `ms` for `ready` (a client that reconnects by itself, such as ioredis under
 * BullMQ, whose readiness never fails but may never come); rejects with a
 * {@link NotReadyYetError} carrying `lastError()` when the time runs out. `ready` keeps its
 * own course: the next try waits on the same promise again.
 */
export function readyWithin<T>(ready: Promise<T>, ms: number, lastError: () => unknown): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new NotReadyYetError(lastError())), ms);
  });
  return Promise.race([ready, timeout]).finally(() => clearTimeout(timer));
}
