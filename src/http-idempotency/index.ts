/**
 * `idempotent-jobs/http-idempotency`: `Idempotency-Key` for a service's own endpoints, the
 * request's key and stored response committed in the handler's own transaction. Express
 * middleware, a Fastify plugin, a NestJS interceptor, and {@link IdempotentRequests} for any other
 * framework. Loads without Express or NestJS installed.
 *
 * @packageDocumentation
 * @module idempotent-jobs/http-idempotency
 */
export type { HandleOptions, HandledRequest, IncomingRequest, RequestOutcome } from './idempotent-requests.js';
export { IdempotentRequests } from './idempotent-requests.js';
export type { RequestContext, RequestHandler } from './request-context.js';
export { SecondTransactionError } from './request-context.js';
export type { IdempotentRequestsOptions, RequestLogger, ResolvedIdempotentRequestsOptions } from './request-options.js';
export type { IdempotentResponse, RequestAnswer, StoredResponse } from './stored-response.js';
export { UnsendableResponseError } from './stored-response.js';
export { requestFingerprint } from './request-fingerprint.js';
export type { ExpressIdempotencyOptions, ExpressMiddleware, ExpressRequestHandler, ExpressRequestLike, ExpressRequestWithAnyBody } from './express-middleware.js';
export { expressIdempotency, writeAnswer } from './express-middleware.js';
export type { FastifyIdempotencyOptions } from './fastify-plugin.js';
export { fastifyIdempotency } from './fastify-plugin.js';
export type { IdempotencyInterceptorOptions, NestCallHandlerLike, NestExecutionContextLike, NestHttpArgumentsLike, NestObservableLike, NestObserverLike } from './nestjs-interceptor.js';
export { IdempotencyInterceptor, idempotencyContext } from './nestjs-interceptor.js';
