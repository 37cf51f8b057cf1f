import type { FastifyInstance, FastifyReply, FastifyRequest, RouteOptions } from 'fastify';
import { ValidationError } from '../errors.js';
import type { RequestContext } from './request-context.js';
import type { IdempotentRequests } from './idempotent-requests.js';
import { assertKnownOptionNames } from './request-options.js';
import type { IdempotentResponse } from './stored-response.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** The request's idempotency context, on routes with `config: { idempotency: … }` (see `fastifyIdempotency`). */
    idempotency: RequestContext;
  }
  interface FastifyContextConfig {
    /** Makes the route idempotent (see `fastifyIdempotency`): `true`, or `{ databaseOnly: true }` for a handler that only writes the database. */
    idempotency?: boolean | { readonly databaseOnly?: boolean };
  }
}

/** Options of {@link fastifyIdempotency}. */
export interface FastifyIdempotencyOptions {
  /** The claim protocol for requests. */
  readonly requests: IdempotentRequests;
  /** Who asks: the tenant or authenticated client (set by your authentication hook). Undefined: answered 401. */
  readonly client: (request: FastifyRequest) => string | undefined;
}

/**
 * Fastify plugin for `Idempotency-Key` on a service's own routes. Routes registered after it
 * with `config: { idempotency: true }` (or `{ databaseOnly: true }`) run their handler with
 * `request.idempotency`, a {@link RequestContext}, and answer with the response the handler
 * returns (`{ status, headers?, body? }`); the handler's own errors go to Fastify's error
 * handler after its key was released. The fingerprint covers `request.body` as parsed.
 *
 * @example
 * ```ts
 * import Fastify from 'fastify';
 * import { IdempotencyKeys } from 'idempotent-jobs';
 * import { IdempotentRequests, fastifyIdempotency } from 'idempotent-jobs/http-idempotency';
 *
 * const app = Fastify();
 * await app.register(fastifyIdempotency, {
 *   requests: new IdempotentRequests({ keys: new IdempotencyKeys({ db }) }),
 *   client: (request) => request.headers['x-tenant'] as string | undefined,
 * });
 * app.post<{ Body: { cents: number } }>('/orders', { config: { idempotency: true } }, async (request) =>
 *   request.idempotency.transaction(async (tx) => {
 *     await tx.insertInto('orders').values({ id: request.idempotency.key, cents: request.body.cents }).execute();
 *     return { status: 201, body: { id: request.idempotency.key } };
 *   }),
 * );
 * ```
 */
export const fastifyIdempotency = Object.assign(
  async function fastifyIdempotency(app: FastifyInstance, options: FastifyIdempotencyOptions): Promise<void> {
    assertKnownOptionNames('FastifyIdempotencyOptions', options ?? {}, new Set(['requests', 'client']));
    const { requests, client } = options ?? ({} as FastifyIdempotencyOptions);
    if (!requests || typeof requests.handle !== 'function') throw new ValidationError('INVALID_OPTIONS', 'requests', 'Invalid option requests: pass an IdempotentRequests instance.');
    if (typeof client !== 'function') throw new ValidationError('INVALID_OPTIONS', 'client', 'Invalid option client: pass a function of the request that names its tenant or authenticated client.');
    app.decorateRequest('idempotency', null as unknown as RequestContext);
    app.addHook('onRoute', (route: RouteOptions) => {
      const setting = (route.config as { idempotency?: unknown } | undefined)?.idempotency;
      if (setting === undefined || setting === false) return;
      if (setting !== true && (typeof setting !== 'object' || setting === null)) throw new ValidationError('INVALID_OPTIONS', 'config.idempotency', `Route ${route.url}: config.idempotency must be true or { databaseOnly?: boolean }.`);
      if (typeof setting === 'object') assertKnownOptionNames(`Route ${route.url}'s config.idempotency`, setting, new Set(['databaseOnly']));
      const databaseOnly = typeof setting === 'object' && (setting as { databaseOnly?: unknown }).databaseOnly === true;
      const original = route.handler as (this: FastifyInstance, request: FastifyRequest, reply: FastifyReply) => Promise<IdempotentResponse>;
      route.handler = async function idempotentHandler(this: FastifyInstance, request: FastifyRequest, reply: FastifyReply) {
        const gone = new AbortController();
        const onClose = () => {
          if (!reply.raw.writableFinished) gone.abort();
        };
        reply.raw.once('close', onClose);
        try {
          const answer = await requests.handle(
            {
              method: request.method,
              target: request.url,
              idempotencyKey: request.raw.headersDistinct?.['idempotency-key'] ?? request.headers['idempotency-key'],
              prefer: request.headers.prefer,
              body: request.body,
              client: client(request),
              signal: gone.signal,
            },
            (ctx) => {
              request.idempotency = ctx;
              return original.call(this, request, reply);
            },
            { databaseOnly },
          );
          reply.code(answer.status);
          for (const [name, value] of Object.entries(answer.headers)) reply.header(name, value as string | string[]);
          return reply.send(answer.body);
        } finally {
          reply.raw.off('close', onClose);
        }
      };
    });
  },
  // Not encapsulated (as fastify-plugin marks a plugin): the hook sees the routes of the scope that registered it.
  { [Symbol.for('skip-override')]: true },
);
