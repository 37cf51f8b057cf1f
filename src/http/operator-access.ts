import type { FastifyRequest } from 'fastify';
import { isLoopbackHost } from './http-options.js';
import { HttpProblem } from './problems.js';
import type { BearerAuthenticator } from './request-headers.js';

/** The operator recorded when no admin tokens are configured (the server then listens on loopback only). */
export const LOOPBACK_OPERATOR = 'loopback';

/**
 * Who is asking for an operator's page or route (the key inspector, the schedules): the admin
 * token's operator; without admin tokens, `"loopback"` while the server listens on loopback and
 * the request was addressed to a loopback name (a DNS-rebinding page cannot). Throws a 401 or
 * 403 {@link HttpProblem} otherwise; `what` names the thing refused in its message.
 */
export function operatorOf(admins: BearerAuthenticator, request: FastifyRequest, what: string): string {
  if (admins.enabled) {
    try {
      return admins.tenantOf(request.headers.authorization);
    } catch (error) {
      if (!(error instanceof HttpProblem)) throw error;
      throw new HttpProblem('unauthorized', `${what} needs an admin token (ADMIN_TOKENS), sent as Authorization: Bearer <token>; tenant tokens do not open it.`, error.headers);
    }
  }
  const address = request.server.server.address();
  const listensOnLoopback = address === null || typeof address === 'string' || isLoopbackHost(address.address);
  if (!listensOnLoopback) {
    throw new HttpProblem('forbidden', `${what} is off: the server listens beyond loopback and no admin tokens are configured. Set ADMIN_TOKENS="token=operator,…".`);
  }
  if (!isLoopbackHost(request.hostname)) {
    throw new HttpProblem('forbidden', `${what} without ADMIN_TOKENS answers only requests addressed to a loopback name (localhost, 127.0.0.1, [::1]), not "${request.hostname}".`);
  }
  return LOOPBACK_OPERATOR;
}
