import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import { describeError } from './describe-error.js';
import { IdempotencyError, ValidationError } from './errors.js';

/** A server the library needs at start. */
export type Service = 'Redis' | 'Postgres';

/** How long a starting library object waits for Redis or Postgres when `STARTUP_WAIT_MS` is not set. */
export const DEFAULT_STARTUP_WAIT_MS = 60_000;

/**
 * A server the library needs (Redis for a worker or producer, Postgres for the migrations) did
 * not answer within the start's wait (`STARTUP_WAIT_MS`, default 60 s): the message names the
 * service, its address (without password) and what to do. `code`: `'SERVICE_UNREACHABLE'`;
 * `cause`: the last connection error.
 *
 * @example
 * ```ts
 * import { ServiceUnreachableError } from 'idempotent-jobs';
 *
 * try {
 *   await producer.enqueue({ name: 'charge', key: 'order-42', data: { cents: 1999 } });
 * } catch (error) {
 *   if (error instanceof ServiceUnreachableError) console.error(`${error.service} is down at ${error.address}`);
 *   throw error;
 * }
 * ```
 */
export class ServiceUnreachableError extends IdempotencyError {
  constructor(
    /** Which server: `'Redis'` or `'Postgres'`. */
    readonly service: Service,
    /** Where it was looked for: its URL with the password hidden, or `host:port`. */
    readonly address: string,
    /** How long the start waited, in milliseconds. */
    readonly waitedMs: number,
    options: { cause?: unknown; variable?: string } = {},
  ) {
    const variable = options.variable ?? (service === 'Redis' ? 'REDIS_URL' : 'DATABASE_URL');
    const last = options.cause === undefined ? 'no answer' : describeError(options.cause);
    super(
      'SERVICE_UNREACHABLE',
      `${service} at ${address} did not answer for ${Math.round(waitedMs / 1000)} s (last error: ${last}). ` +
        `Start ${service} there, or point ${variable} at one that runs; STARTUP_WAIT_MS sets how long to wait (milliseconds).`,
      { cause: options.cause },
    );
  }
}

/**
 * `STARTUP_WAIT_MS`, a whole number of milliseconds ≥ 0; {@link DEFAULT_STARTUP_WAIT_MS} when it
 * is unset or empty. Any other value throws a {@link ValidationError} naming it: a wait the user
 * set and the library ignored (60 s instead of `5s`) would look like a hang.
 */
export function startupWaitMs(env: NodeJS.ProcessEnv = process.env): number {
  const raw = env.STARTUP_WAIT_MS?.trim();
  if (raw === undefined || raw === '') return DEFAULT_STARTUP_WAIT_MS;
  if (!/^\d+$/.test(raw)) {
    throw new ValidationError(
      'INVALID_OPTIONS',
      'STARTUP_WAIT_MS',
      `STARTUP_WAIT_MS=${JSON.stringify(env.STARTUP_WAIT_MS)} is not a whole number of milliseconds (≥ 0), e.g. STARTUP_WAIT_MS=5000; unset, the start waits ${DEFAULT_STARTUP_WAIT_MS} ms.`,
    );
  }
  return Number(raw);
}

/**
 * Checks a `startupWaitMs` option: a whole number of milliseconds ≥ 0, or `Infinity` (wait for
 * ever); a `ValidationError` naming `where` otherwise. A NaN or a string there made the wait's
 * deadline NaN, which never passes: the start retried for ever.
 */
export function assertStartupWaitMs(value: unknown, where: string): void {
  if (value === undefined || value === Infinity || (typeof value === 'number' && Number.isInteger(value) && value >= 0)) return;
  throw new ValidationError(
    'INVALID_OPTIONS',
    'startupWaitMs',
    `${where}: startupWaitMs must be a whole number of milliseconds (≥ 0) or Infinity, not ${typeof value === 'number' ? String(value) : JSON.stringify(value) ?? String(value)}.`,
  );
}

/** A URL as it may be shown: the password replaced by `***`. */
export function shownAddress(url: string): string {
  if (!URL.canParse(url)) return url;
  const parsed = new URL(url);
  if (parsed.password) parsed.password = '***';
  return parsed.toString();
}

/** Options of {@link waitForService}. */
export interface WaitForServiceOptions {
  readonly service: Service;
  readonly address: string;
  /** When to give up, in `Date.now()` time. */
  readonly deadline: number;
  readonly logger: Logger;
  /** Whether a failed try is worth another; any other error is thrown at once (a wrong password, say). */
  readonly retryable: (error: unknown) => boolean;
  /** The variable that names the server, in the final error. @defaultValue `REDIS_URL` or `DATABASE_URL` */
  readonly variable?: string;
  /** Ends the wait at once (the object was closed meanwhile): rejects with the signal's reason. */
  readonly signal?: AbortSignal;
}

/**
 * Runs `attempt` until it succeeds or the deadline passes: one warning line per failed try
 * (the error's message, never its stack: a server that is down is not a defect), tries spaced
 * 250 ms doubling to 4 s; at the deadline a {@link ServiceUnreachableError}.
 */
export async function waitForService<T>(attempt: () => Promise<T>, options: WaitForServiceOptions): Promise<T> {
  const startedAt = Date.now();
  let delayMs = 250;
  let lastError: unknown;
  for (let tries = 1; ; tries++) {
    options.signal?.throwIfAborted();
    try {
      return await attempt();
    } catch (error) {
      if (!options.retryable(error)) throw error;
      lastError = error;
    }
    const left = options.deadline - Date.now();
    if (left <= 0) throw new ServiceUnreachableError(options.service, options.address, Date.now() - startedAt, { cause: lastError, variable: options.variable });
    const waitMs = Math.min(delayMs, left);
    options.logger.warn(
      { service: options.service, address: options.address, error: describeError(lastError), tries, waitingMs: left },
      `${options.service} at ${options.address} is not reachable yet (${describeError(lastError)}); waiting up to ${Math.ceil(left / 1000)} s more`,
    );
    await sleep(waitMs, undefined, options.signal ? { signal: options.signal } : {});
    delayMs = Math.min(delayMs * 2, 4_000);
  }
}
