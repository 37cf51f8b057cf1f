import type { Logger } from 'pino';
import { describeError } from '../describe-error.js';

/** Socket errors of a connection that cannot be made or broke (node's codes), and ioredis's own messages for one. */
const CONNECTION_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN', 'ENOTFOUND']);
const CONNECTION_MESSAGES = /Connection is closed|Stream isn't writeable|connect ETIMEDOUT|ECONNREFUSED|getaddrinfo/i;

/** BullMQ's errors for a job whose lock it lost: the lock not renewed, then the finished job refused. */
const LOCK_LOST = /^(?:could not renew lock for job (\S+)|Missing lock for job (\S+)\.|Lock mismatch for job (\S+)\.)/;

/** The worker's connections fail together at each reconnect: errors this close, with one message, are one try. */
const TRY_WINDOW_MS = 500;
/** Jobs whose lost lock was reported, so that the job's second error adds no line; the oldest forgotten first. */
const REMEMBERED_JOBS = 1_000;

export function isRedisConnectionError(error: Error): boolean {
  const code = (error as NodeJS.ErrnoException).code;
  if (typeof code === 'string' && CONNECTION_CODES.has(code)) return true;
  if (error instanceof AggregateError) return error.errors.some((each) => each instanceof Error && isRedisConnectionError(each));
  return CONNECTION_MESSAGES.test(error.message);
}

/**
 * Reports a BullMQ worker's `'error'` events. BullMQ emits one for every failed reconnect of
 * each of its connections, and one or two for every job whose lock it lost; neither is a
 * defect, and a stack trace per event buries what happened. So:
 * - Redis unreachable: a warning line per reconnect try (the worker's connections, failing at
 *   once, count as one), naming the error; ioredis keeps reconnecting by itself.
 * - A job's lock lost (`could not renew lock for job …`, `Missing lock for job … moveToFinished`):
 *   a warning line per job saying why and what follows. The process was paused or cut off from
 *   Redis past the lock's duration, so BullMQ has handed the job to another worker; the key's
 *   lease decides which run's effect commits (this one's is fenced: `lease lost`).
 * The stack of each goes to debug. Any other error stays an error with its stack.
 */
export class WorkerErrorLog {
  readonly #log: Logger;
  #lastConnectionError: { readonly message: string; readonly at: number } | undefined;
  readonly #lockLostJobs = new Set<string>();

  constructor(logger: Logger) {
    this.#log = logger;
  }

  report(error: Error): void {
    const lockLost = LOCK_LOST.exec(error.message);
    if (lockLost) {
      this.#reportLockLost(lockLost[1] ?? lockLost[2] ?? lockLost[3]!, error);
      return;
    }
    if (isRedisConnectionError(error)) {
      this.#reportConnectionError(error);
      return;
    }
    this.#log.error({ err: error }, 'BullMQ worker error');
  }

  #reportConnectionError(error: Error): void {
    const message = describeError(error);
    const now = Date.now();
    const last = this.#lastConnectionError;
    this.#lastConnectionError = { message, at: now };
    this.#log.debug({ err: error }, 'Redis connection error');
    if (last && last.message === message && now - last.at < TRY_WINDOW_MS) return;
    this.#log.warn({ error: message }, 'Redis is not reachable; BullMQ reconnects by itself');
  }

  #reportLockLost(jobId: string, error: Error): void {
    this.#log.debug({ err: error, jobId }, 'BullMQ lock error');
    if (this.#lockLostJobs.has(jobId)) return;
    this.#lockLostJobs.add(jobId);
    if (this.#lockLostJobs.size > REMEMBERED_JOBS) this.#lockLostJobs.delete(this.#lockLostJobs.values().next().value!);
    this.#log.warn(
      { jobId, error: error.message },
      "BullMQ lost this worker's lock on the job: the process was paused or cut off from Redis for longer than the lock's duration " +
        '(LOCK_DURATION_MS), and the job went back to the queue for another worker. Nothing is lost or run twice: the idempotency key decides which run commits, ' +
        'and this run, if its lease was taken over, is fenced (see docs/operations.md#a-worker-paused-past-its-lease).',
    );
  }
}
