import type { FastifyReply, FastifyRequest } from 'fastify';
import { ValidationError } from '../errors.js';
import { isTransientDependencyError } from './dependency-errors.js';

/** Prefix of every problem `type` this API answers with (RFC 9457); a URN, so nobody tries to dereference it. */
export const PROBLEM_TYPE_PREFIX = 'urn:idempotent-jobs:problem:';

/**
 * The problem cases, each with the HTTP `status` and the `title` its answers carry. Their
 * `type` URIs ({@link problemType}) are stable: clients branch on them.
 */
export const PROBLEMS = {
  /** A POST without an `Idempotency-Key` header. */
  'missing-idempotency-key': { status: 400, title: 'Idempotency-Key header missing' },
  /** An `Idempotency-Key` that is empty, longer than 255 characters, badly quoted, or sent twice. */
  'invalid-idempotency-key': { status: 400, title: 'Idempotency-Key invalid' },
  /** A body that is not JSON, or that the job's limits refuse (nesting, a lone surrogate…). */
  'invalid-request': { status: 400, title: 'Request invalid' },
  /** Bytes that are not well-formed HTTP/1.1; nothing was done. */
  'malformed-http': { status: 400, title: 'Malformed HTTP request' },
  /** No bearer token, or an unknown one (with `WWW-Authenticate`). */
  unauthorized: { status: 401, title: 'Unauthorized' },
  /** The key inspector refuses this caller (no admin tokens configured, and not on loopback). */
  forbidden: { status: 403, title: 'Forbidden' },
  /** A queue not in the server's list of queues. */
  'unknown-queue': { status: 404, title: 'Unknown queue' },
  /** No such route, or no request with this key for this tenant (or it has expired). */
  'not-found': { status: 404, title: 'Not found' },
  /** The same key is being handled by a concurrent request: retry after `Retry-After`. */
  'request-in-progress': { status: 409, title: 'A request with this Idempotency-Key is in progress' },
  /** The same request was accepted before and its record has expired (only its tombstone is left): nothing was enqueued; do not retry. */
  'request-expired': { status: 410, title: 'Request accepted before; its record has expired' },
  /** The request did not arrive in time. */
  'request-timeout': { status: 408, title: 'Request timeout' },
  /** A body over the size limit. */
  'payload-too-large': { status: 413, title: 'Payload too large' },
  /** A POST whose body is not `application/json`. */
  'unsupported-media-type': { status: 415, title: 'Unsupported media type' },
  /** The key was used before with another body: nothing is enqueued. */
  'idempotency-key-reused': { status: 422, title: 'Idempotency-Key reused with a different request' },
  /** Request headers over Node's limit. */
  'headers-too-large': { status: 431, title: 'Request header fields too large' },
  /** Anything unexpected; the detail names the request id, the cause is logged. */
  'internal-error': { status: 500, title: 'Internal server error' },
  /** `/readyz`: Postgres or Redis does not answer. */
  'not-ready': { status: 503, title: 'Not ready' },
  /** Postgres or Redis could not serve this request right now: retry with the same key after `Retry-After`. */
  'temporarily-unavailable': { status: 503, title: 'Temporarily unavailable' },
} as const satisfies Record<string, { status: number; title: string }>;

/** One problem case's name, e.g. `'request-in-progress'`. */
export type ProblemKind = keyof typeof PROBLEMS;

/** The `type` URI of a problem case, e.g. `urn:idempotent-jobs:problem:request-in-progress`. */
export const problemType = (kind: ProblemKind): string => `${PROBLEM_TYPE_PREFIX}${kind}`;

/** An RFC 9457 problem details object as this API sends it. */
export interface ProblemDetails {
  /** The case's stable URI, `urn:idempotent-jobs:problem:<kind>`: what clients branch on. */
  readonly type: string;
  /** The case's short title (the same for every answer of a case). */
  readonly title: string;
  /** The HTTP status, as in the response's status line. */
  readonly status: number;
  /** What went wrong with this request, and what to do. */
  readonly detail: string;
  /** The request's path. */
  readonly instance: string;
  /** The request id (also in the `Request-Id` response header and every log line). */
  readonly requestId: string;
}

/**
 * Thrown by routes and hooks to answer with a problem; the error handler renders it.
 */
export class HttpProblem extends Error {
  /** Which problem case: decides the status, title and `type` URI. */
  readonly kind: ProblemKind;
  /** Extra response headers, e.g. `Retry-After`, `WWW-Authenticate`. */
  readonly headers: Readonly<Record<string, string>>;

  constructor(kind: ProblemKind, detail: string, headers: Readonly<Record<string, string>> = {}) {
    super(detail);
    this.name = 'HttpProblem';
    this.kind = kind;
    this.headers = headers;
  }

  /** The HTTP status of this problem. */
  get status(): number {
    return PROBLEMS[this.kind].status;
  }
}

/** Sends `problem` as `application/problem+json` (serialised here, so no response schema strips it). */
export function sendProblem(request: FastifyRequest, reply: FastifyReply, problem: HttpProblem): FastifyReply {
  const { status, title } = PROBLEMS[problem.kind];
  const body: ProblemDetails = {
    type: problemType(problem.kind),
    title,
    status,
    detail: problem.message,
    instance: request.url.split('?')[0] ?? request.url,
    requestId: String(request.id),
  };
  for (const [name, value] of Object.entries(problem.headers)) reply.header(name, value);
  return reply.code(status).type('application/problem+json; charset=utf-8').send(JSON.stringify(body));
}

/** `Retry-After` of a 503 `temporarily-unavailable`: about how long a Postgres restart or a failover takes. */
export const UNAVAILABLE_RETRY_AFTER_SECONDS = 2;

/**
 * Maps anything thrown while handling a request to a problem: our own {@link HttpProblem}s as
 * they are, Fastify's body-parsing and validation errors and the library's
 * {@link ValidationError}s to their 4xx cases, Postgres or Redis being unreachable for the
 * moment to a 503 with `Retry-After`, anything else to a 500 whose detail names only the
 * request id (the cause is logged, not leaked).
 */
export function toHttpProblem(error: unknown, requestId: string): HttpProblem {
  if (error instanceof HttpProblem) return error;
  if (error instanceof ValidationError) return new HttpProblem('invalid-request', error.message);
  if (isTransientDependencyError(error)) {
    const seconds = UNAVAILABLE_RETRY_AFTER_SECONDS;
    return new HttpProblem(
      'temporarily-unavailable',
      `Postgres or Redis could not serve this request right now. Retry it with the same Idempotency-Key after ${seconds} s: ` +
        `it takes effect at most once. (Request id ${requestId}.)`,
      { 'retry-after': String(seconds) },
    );
  }
  const code = (error as { code?: unknown })?.code;
  const message = error instanceof Error ? error.message : String(error);
  switch (code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return new HttpProblem('payload-too-large', `${message}. Send a smaller JSON body.`);
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return new HttpProblem('unsupported-media-type', 'The body must be JSON, sent with Content-Type: application/json.');
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return new HttpProblem('invalid-request', 'The body is empty; send the job payload as JSON (e.g. {} or null).');
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
    case 'FST_ERR_VALIDATION':
      return new HttpProblem('invalid-request', message);
  }
  const status = (error as { statusCode?: unknown })?.statusCode;
  if (error instanceof SyntaxError && status === 400) {
    return new HttpProblem('invalid-request', `The body is not valid JSON: ${message}`);
  }
  if (typeof status === 'number' && status === 413) return new HttpProblem('payload-too-large', message);
  if (typeof status === 'number' && status >= 400 && status < 500) return new HttpProblem('invalid-request', message);
  return new HttpProblem('internal-error', `The request failed on the server; quote request id ${requestId} when reporting it.`);
}
