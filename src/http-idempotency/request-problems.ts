import { PROBLEMS, problemType, type ProblemKind } from '../http/problems.js';
import type { RequestAnswer } from './stored-response.js';

/**
 * A refusal or a fault answered by the middleware itself, as `application/problem+json`
 * (RFC 9457) with the enqueue API's problem types (`urn:idempotent-jobs:problem:<kind>`), so
 * that clients branch on one vocabulary.
 */
export class RequestProblem extends Error {
  /** Which problem case: decides the status, title and `type` URI. */
  readonly kind: ProblemKind;
  /** Extra response headers, e.g. `Retry-After`. */
  readonly headers: Readonly<Record<string, string>>;

  constructor(kind: ProblemKind, detail: string, headers: Readonly<Record<string, string>> = {}) {
    super(detail);
    this.name = 'RequestProblem';
    this.kind = kind;
    this.headers = headers;
  }

  /** The HTTP status of this problem. */
  get status(): number {
    return PROBLEMS[this.kind].status;
  }

  /** The problem as an answer; `instance` is the request's path (without its query). */
  toAnswer(target: string): RequestAnswer {
    const { status, title } = PROBLEMS[this.kind];
    const instance = target.split('?')[0] ?? target;
    const body = JSON.stringify({ type: problemType(this.kind), title, status, detail: this.message, instance });
    return { status, headers: { ...this.headers, 'content-type': 'application/problem+json; charset=utf-8' }, body: Buffer.from(body, 'utf8') };
  }
}

/** `Retry-After` seconds for a retry that met its request in flight: the lease left, at least 1 s and at most 2 s (requests are short). */
export function inProgressProblem(key: string, retryAfterMs: number): RequestProblem {
  const seconds = Math.max(1, Math.min(2, Math.ceil(retryAfterMs / 1000)));
  return new RequestProblem(
    'request-in-progress',
    `A request with Idempotency-Key "${key}" is being handled right now. This one did nothing; retry after ${seconds} s to get its answer (or send Prefer: wait=N to wait for it).`,
    { 'retry-after': String(seconds) },
  );
}

/** The 422 of a key sent before with another request. */
export function keyReusedProblem(key: string): RequestProblem {
  return new RequestProblem(
    'idempotency-key-reused',
    `Idempotency-Key "${key}" was already used with a different request (method, path, query or body). This one did nothing; use a new key for a new request.`,
  );
}

/** The 410 of a key whose stored response has expired while its tombstone is live. */
export function expiredProblem(key: string, finishedAt: Date, refusedUntil: Date): RequestProblem {
  return new RequestProblem(
    'request-expired',
    `A request with Idempotency-Key "${key}" was answered at ${finishedAt.toISOString()}; its stored response has expired, so it cannot be replayed. ` +
      `This one did nothing. The key stays refused until ${refusedUntil.toISOString()}.`,
  );
}

/** `Retry-After` of a 503 for a store fault (about how long a Postgres restart or failover takes). */
export const UNAVAILABLE_RETRY_AFTER_SECONDS = 2;

/** The 503 of a store fault: nothing was decided about the key; the same request may be retried. */
export function unavailableProblem(): RequestProblem {
  const seconds = UNAVAILABLE_RETRY_AFTER_SECONDS;
  return new RequestProblem(
    'temporarily-unavailable',
    `The database could not serve this request right now. Retry it with the same Idempotency-Key after ${seconds} s: it takes effect at most once.`,
    { 'retry-after': String(seconds) },
  );
}

/** The 500 of anything unexpected; the cause is logged, not sent. */
export function internalProblem(): RequestProblem {
  return new RequestProblem('internal-error', 'The request failed on the server; nothing of it was stored. Retrying it with the same Idempotency-Key is safe.');
}
