import type { IncomingMessage } from 'node:http';
import { ValidationError } from '../errors.js';
import type { RequestContext } from './request-context.js';
import type { HandleOptions, IdempotentRequests } from './idempotent-requests.js';
import { assertKnownOptionNames } from './request-options.js';
import type { IdempotentResponse } from './stored-response.js';

/** Where the interceptor leaves the request's context on the request object. */
const CONTEXT = Symbol.for('idempotent-jobs.request-context');

/** The HTTP side of NestJS's `ExecutionContext`: the call's request and response. */
export interface NestHttpArgumentsLike {
  /** The request (Express's or Fastify's). */
  getRequest<T = any>(): T;
  /** The response (Express's or Fastify's reply). */
  getResponse<T = any>(): T;
}

/** The parts of NestJS's `ExecutionContext` the interceptor uses (so this module needs no NestJS at load). */
export interface NestExecutionContextLike {
  /** The HTTP request and response of the call. */
  switchToHttp(): NestHttpArgumentsLike;
}

/** What the interceptor subscribes with to the route handler's Observable. */
export interface NestObserverLike {
  /** A value the handler emitted (its return value). */
  next?: (value: any) => void;
  /** The handler threw. */
  error?: (error: unknown) => void;
  /** The handler is done. */
  complete?: () => void;
}

/** The route handler's result as NestJS hands it over: an Observable. */
export interface NestObservableLike {
  /** Subscribes to the handler's result. */
  subscribe(observer: NestObserverLike): unknown;
}

/** The parts of NestJS's `CallHandler` the interceptor uses: the route handler's result as an Observable. */
export interface NestCallHandlerLike {
  /** Runs the route handler (and the interceptors after this one). */
  handle(): NestObservableLike;
}

/** Options of {@link IdempotencyInterceptor}. */
export interface IdempotencyInterceptorOptions extends HandleOptions {
  /** Who asks: the tenant or authenticated client (set by your guard, say `req.user.id`). Undefined: answered 401. */
  readonly client: (request: any) => string | undefined;
}

/**
 * NestJS (12, on Express or Fastify) interceptor for `Idempotency-Key`: the route handler gets the
 * request's {@link RequestContext} from {@link idempotencyContext}, writes in
 * `ctx.transaction`, and returns the response (`{ status, headers?, body? }`) that the
 * transaction stored; the interceptor answers with it (a web `Response`, whose status and
 * headers NestJS sends as they are). A replay, a 409 or a 422 never reaches the handler. The
 * handler's own exceptions (`HttpException`s included) go to NestJS's exception filters after the
 * key was released; return a 4xx to have it stored.
 *
 * Loads without NestJS (it needs `rxjs`, which NestJS brings, only when it intercepts).
 *
 * @example
 * ```ts
 * import { IdempotencyKeys } from 'idempotent-jobs';
 * import { IdempotencyInterceptor, IdempotentRequests, idempotencyContext } from 'idempotent-jobs/http-idempotency';
 *
 * const requests = new IdempotentRequests({ keys: new IdempotencyKeys({ db }) });
 * export const ordersIdempotency = new IdempotencyInterceptor(requests, { client: (req) => req.user?.id });
 * // @Post() @UseInterceptors(ordersIdempotency)
 * // create(@Req() req: Request, @Body() body: { cents: number }) {
 * export const create = (req: object, body: { cents: number }) =>
 *   idempotencyContext(req).transaction(async (tx) => {
 *     await tx.insertInto('orders').values({ id: idempotencyContext(req).key, cents: body.cents }).execute();
 *     return { status: 201, body: { id: idempotencyContext(req).key } };
 *   });
 * ```
 */
export class IdempotencyInterceptor {
  readonly #requests: IdempotentRequests;
  readonly #options: IdempotencyInterceptorOptions;

  constructor(requests: IdempotentRequests, options: IdempotencyInterceptorOptions) {
    assertKnownOptionNames('IdempotencyInterceptorOptions', options ?? {}, new Set(['client', 'databaseOnly']));
    if (!requests || typeof requests.handle !== 'function') throw new ValidationError('INVALID_OPTIONS', 'requests', 'IdempotencyInterceptor: pass an IdempotentRequests instance.');
    if (typeof options?.client !== 'function') throw new ValidationError('INVALID_OPTIONS', 'client', 'Invalid option client: pass a function of the request that names its tenant or authenticated client.');
    this.#requests = requests;
    this.#options = Object.freeze({ ...options });
  }

  /** NestJS's interceptor hook: answers the call, running the route handler at most once per key and request. */
  async intercept(context: NestExecutionContextLike, next: NestCallHandlerLike): Promise<any> {
    const { from } = await import('rxjs');
    const http = context.switchToHttp();
    const request = http.getRequest<IncomingMessage & { raw?: IncomingMessage; body?: unknown; originalUrl?: string; url: string }>();
    const raw = request.raw ?? request;
    const handled = this.#requests.handle(
      {
        method: request.method ?? raw.method ?? 'GET',
        target: request.originalUrl ?? request.url ?? raw.url ?? '/',
        idempotencyKey: raw.headersDistinct?.['idempotency-key'] ?? raw.headers['idempotency-key'],
        prefer: raw.headers.prefer,
        body: request.body,
        client: this.#options.client(request),
      },
      async (ctx) => {
        (request as unknown as Record<symbol, RequestContext>)[CONTEXT] = ctx;
        return lastValue(next.handle()) as Promise<IdempotentResponse>;
      },
      this.#options.databaseOnly === undefined ? {} : { databaseOnly: this.#options.databaseOnly },
    );
    return from(
      handled.then((answer) => {
        const headers = new Headers();
        for (const [name, value] of Object.entries(answer.headers)) for (const each of Array.isArray(value) ? value : [value]) headers.append(name, each);
        return new Response(answer.body && answer.body.length > 0 ? new Uint8Array(answer.body) : null, { status: answer.status, headers });
      }),
    );
  }
}

/** The {@link RequestContext} of a request the {@link IdempotencyInterceptor} is handling (pass `@Req()`). */
export function idempotencyContext(request: object): RequestContext {
  const ctx = (request as Record<symbol, RequestContext | undefined>)[CONTEXT] ?? (request as { raw?: Record<symbol, RequestContext | undefined> }).raw?.[CONTEXT];
  if (!ctx) throw new Error('This request has no idempotency context: put @UseInterceptors(IdempotencyInterceptor instance) on the route, and call idempotencyContext only while it handles the request.');
  return ctx;
}

function lastValue(source: NestObservableLike): Promise<unknown> {
  return new Promise((resolve, reject) => {
    let last: unknown;
    source.subscribe({ next: (value) => (last = value), error: reject, complete: () => resolve(last) });
  });
}
