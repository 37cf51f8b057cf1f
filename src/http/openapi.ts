import { MAX_RETENTION_CEILING_MS } from '../protocol/key-retention.js';
import type { ResolvedHttpApiOptions } from './http-options.js';
import { MAX_KEY_LENGTH } from '../protocol/validate.js';
import { PROBLEMS, PROBLEM_TYPE_PREFIX } from './problems.js';

/**
 * The OpenAPI document's top level (paths are filled in by @fastify/swagger from the route
 * schemas below). Responses are serialised by the routes themselves, so these schemas
 * describe and never strip.
 */
export function openApiDocument(options: ResolvedHttpApiOptions) {
  return {
    openapi: '3.1.0',
    info: {
      title: 'idempotent-jobs HTTP ingestion API',
      version: '1',
      description:
        'Enqueue jobs with Idempotency-Key semantics (draft-ietf-httpapi-idempotency-key-header-07). ' +
        `Errors are application/problem+json (RFC 9457) with type ${PROBLEM_TYPE_PREFIX}<case>: ` +
        Object.entries(PROBLEMS)
          .map(([kind, { status }]) => `${kind} (${status})`)
          .join(', ') +
        `. Queues: ${options.queues.join(', ')}.`,
    },
    components: {
      securitySchemes: { bearerAuth: { type: 'http' as const, scheme: 'bearer' } },
    },
  };
}

const problem = { description: 'application/problem+json (RFC 9457)', type: 'object', additionalProperties: true } as const;
const unavailable = { ...problem, description: 'temporarily-unavailable: Postgres or Redis cannot serve the request right now; retry after Retry-After seconds.' } as const;

const jobView = {
  type: 'object',
  additionalProperties: true,
  properties: {
    queue: { type: 'string' },
    key: { type: 'string' },
    name: { type: 'string' },
    jobId: { type: 'string' },
    state: { type: 'string', enum: ['queued', 'processing', 'completed', 'failed'] },
    result: { description: "The handler's stored result (state completed)." },
    error: { description: 'The stored error { name, message, code?, step? } (state failed; step: the step of a multi-step job that threw it).' },
    attempts: { type: 'integer' },
    acceptedAt: { type: 'string', format: 'date-time' },
    startedAt: { type: ['string', 'null'], format: 'date-time' },
    finishedAt: { type: ['string', 'null'], format: 'date-time' },
    expiresAt: {
      type: 'string',
      format: 'date-time',
      description: "Set once the job's key finished: when its result stops being kept (the key's retention: the job's own resultMs, or the workers' RETENTION_MS).",
    },
    tombstoneMs: {
      type: 'integer',
      description: "Set when the job asked for a tombstone window of its own (tombstoneMs): how long after it finished its key's duplicates stay refused once the key is deleted.",
    },
    steps: {
      type: 'array',
      description: "The steps (ctx.step) the job's key recorded or started, in position order; empty for a job without steps.",
      items: {
        type: 'object',
        additionalProperties: true,
        properties: {
          name: { type: 'string' },
          position: { type: 'integer', minimum: 1 },
          starts: { type: 'integer', description: 'How many times the step started; more than 1 after a worker died inside it.' },
          fence: { type: 'integer', description: 'The fence of the claim that last started or recorded the step.' },
          startedAt: { type: 'string', format: 'date-time' },
          recordedAt: { type: ['string', 'null'], format: 'date-time', description: 'Null while the step is started and not recorded.' },
          result: { description: "The step's stored result; null until recorded." },
          resultBytes: { type: ['integer', 'null'], description: 'Size of the stored result as UTF-8 JSON; null until recorded.' },
        },
      },
    },
    links: { type: 'object', properties: { self: { type: 'string' } } },
  },
} as const;

const queueParam = { queue: { type: 'string', description: 'A configured queue name.' } } as const;

/** Route schemas (documentation for /openapi.json; the handlers validate and answer with problems). */
export const jobRouteSchemas = {
  post: {
    summary: 'Enqueue a job under an Idempotency-Key (once per tenant and key).',
    tags: ['jobs'],
    security: [{ bearerAuth: [] }],
    params: { type: 'object', properties: queueParam },
    querystring: {
      type: 'object',
      properties: {
        name: { type: 'string', description: 'Job name (part of the fingerprint). Default: the queue name.' },
        // Strings, checked by the handler (readRetentionQuery): as integers they would be coerced ("1e3" taken for 1000).
        resultMs: {
          type: 'string',
          description:
            `Optional. A whole number of milliseconds, digits only, from 1 to ${MAX_RETENTION_CEILING_MS} (100 years). How long the job's key keeps its result once it finished (the wire contract's retention.resultMs); ` +
            "the workers hold it to MAX_JOB_RETENTION_MS. Default: the workers' RETENTION_MS. Not part of the fingerprint. 400 invalid-request otherwise.",
        },
        tombstoneMs: {
          type: 'string',
          description:
            `Optional. A whole number of milliseconds, digits only, from 0 to ${MAX_RETENTION_CEILING_MS}. How long after the job's key finished its tombstone refuses duplicates once the key is deleted; 0: none ` +
            "(retention.tombstoneMs); the workers hold it to MAX_JOB_TOMBSTONE_MS. Default: the janitor's TOMBSTONE_MS. Not part of the fingerprint. 400 invalid-request otherwise.",
        },
      },
    },
    headers: {
      type: 'object',
      properties: {
        'idempotency-key': {
          type: 'string',
          description:
            `Required. 1–${MAX_KEY_LENGTH} characters; bare or a quoted Structured Field string. The job's key is (scope = tenant, key = this header): ` +
            'a namespace shared with library producers, whose job enqueued under that scope and key (with the same job name and payload) is this request\'s job, ' +
            'answered from without running again.',
        },
        prefer: { type: 'string', description: 'Optional. wait=N: hold the response up to N seconds for the job to finish.' },
      },
    },
    body: {
      description:
        'The job payload: any JSON (Content-Type: application/json, UTF-8) nested at most 64 levels, without non-finite numbers, ' +
        'integer literals beyond ±(2^53 − 1), lone surrogates or NUL characters (400 invalid-request otherwise).',
    },
    response: {
      200: { description: 'The job has finished (completed or failed); replays carry Idempotent-Replayed: true.', ...jobView },
      202: { description: 'Accepted (or replayed while queued/processing); Location is the GET.', ...jobView },
      400: problem,
      401: problem,
      404: problem,
      409: { ...problem, description: 'request-in-progress: a request with this key is being handled; see Retry-After.' },
      410: { ...problem, description: 'request-expired: the same request was accepted before and its record has expired (its tombstone is left); nothing was enqueued.' },
      413: problem,
      415: problem,
      422: { ...problem, description: 'idempotency-key-reused: the key was used with a different request.' },
      503: unavailable,
    },
  },
  get: {
    summary: "A request's job: state, result or error, timestamps, attempts, steps.",
    tags: ['jobs'],
    security: [{ bearerAuth: [] }],
    params: { type: 'object', properties: { ...queueParam, key: { type: 'string', description: 'The Idempotency-Key (percent-encoded).' } } },
    headers: {
      type: 'object',
      properties: { prefer: { type: 'string', description: 'Optional. wait=N: long-poll until the job settles.' } },
    },
    response: {
      200: { description: "The job's state.", ...jobView },
      400: problem,
      401: problem,
      404: problem,
      410: { ...problem, description: "request-expired: the request's record has expired; only its tombstone is left." },
      503: unavailable,
    },
  },
};
