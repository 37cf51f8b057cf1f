import type { IncomingMessage, ServerResponse } from 'node:http';
import type { RequestContext } from './request-context.js';
import type { HandleOptions, IdempotentRequests } from './idempotent-requests.js';
import type { IdempotentResponse, RequestAnswer } from './stored-response.js';
import { assertKnownOptionNames } from './request-options.js';
import { ValidationError } from '../errors.js';

/** What the middleware reads of an Express request (Express's `Request` is one). */
export interface ExpressRequestLike extends IncomingMessage {
  /** The parsed body (`express.json()` sets it); part of the fingerprint. */
  body?: unknown;
  /** The request target as sent, before Express's routing cut it (`req.url` otherwise). */
  originalUrl?: string;
}

/** {@link ExpressRequestLike} with its body typed `any`, as Express types `req.body`: the default request type of {@link expressIdempotency}. */
export interface ExpressRequestWithAnyBody extends ExpressRequestLike {
  /** The parsed body, as the handler reads it. */
  body?: any;
}

/** Options of {@link expressIdempotency}. */
export interface ExpressIdempotencyOptions<Req extends IncomingMessage> {
  /**
   * Who asks: the tenant or authenticated client whose keys the request's key is among (set by
   * your authentication middleware, say `req.user.id`). Undefined: answered 401.
   */
  readonly client: (request: Req) => string | undefined;
}

/** An Express handler written against a {@link RequestContext}: answers with a response. */
export type ExpressRequestHandler<Req extends IncomingMessage> = (ctx: RequestContext, request: Req) => Promise<IdempotentResponse>;

/** An Express route handler (`(req, res, next)`), as {@link expressIdempotency} makes them. */
export type ExpressMiddleware<Req extends IncomingMessage> = (request: Req, response: ServerResponse, next: (error?: unknown) => void) => void;

/**
 * Express (4 and 5) middleware for `Idempotency-Key` on a service's own routes: returns a wrapper
 * that turns a handler written against a {@link RequestContext} into a route handler. Put a body
 * parser (`express.json()`) before it: the fingerprint covers `req.body` as parsed. The handler's
 * own errors go to `next(error)` after its key was released; everything else is answered here.
 *
 * @example
 * ```ts
 * import express from 'express';
 * import { IdempotencyKeys } from 'idempotent-jobs';
 * import { IdempotentRequests, expressIdempotency } from 'idempotent-jobs/http-idempotency';
 *
 * const idempotent = expressIdempotency(new IdempotentRequests({ keys: new IdempotencyKeys({ db }) }), {
 *   client: (req) => req.headers['x-tenant'] as string | undefined,
 * });
 * const app = express();
 * app.post('/orders', express.json(), idempotent(async (ctx, req) =>
 *   ctx.transaction(async (tx) => {
 *     await tx.insertInto('orders').values({ id: ctx.key, cents: req.body.cents }).execute();
 *     return { status: 201, body: { id: ctx.key } };
 *   }),
 * ));
 * ```
 */
export function expressIdempotency<Req extends ExpressRequestLike = ExpressRequestWithAnyBody>(
  requests: IdempotentRequests,
  options: ExpressIdempotencyOptions<Req>,
): (handler: ExpressRequestHandler<Req>, handleOptions?: HandleOptions) => ExpressMiddleware<Req> {
  assertKnownOptionNames('ExpressIdempotencyOptions', options ?? {}, new Set(['client']));
  if (typeof options?.client !== 'function') throw new ValidationError('INVALID_OPTIONS', 'client', 'Invalid option client: pass a function of the request that names its tenant or authenticated client.');
  return (handler, handleOptions = {}) => {
    if (typeof handler !== 'function') throw new TypeError('expressIdempotency(…)(handler): the handler must be a function (ctx, req) => response.');
    assertKnownOptionNames('HandleOptions', handleOptions, new Set(['databaseOnly']));
    return (req, res, next) => {
      const gone = new AbortController();
      const onClose = () => {
        if (!res.writableFinished) gone.abort();
      };
      res.once('close', onClose);
      requests
        .handle(
          {
            method: req.method ?? 'GET',
            target: req.originalUrl ?? req.url ?? '/',
            idempotencyKey: req.headersDistinct?.['idempotency-key'] ?? req.headers['idempotency-key'],
            prefer: req.headers.prefer,
            body: req.body,
            client: options.client(req),
            signal: gone.signal,
          },
          (ctx) => handler(ctx, req),
          handleOptions,
        )
        .then((answer) => writeAnswer(res, answer), next)
        .finally(() => res.off('close', onClose));
    };
  };
}

/** Writes an answer onto a Node response (Express's, or any other). */
export function writeAnswer(res: ServerResponse, answer: RequestAnswer): void {
  if (res.headersSent) return;
  res.statusCode = answer.status;
  for (const [name, value] of Object.entries(answer.headers)) res.setHeader(name, value);
  res.end(answer.body);
}
