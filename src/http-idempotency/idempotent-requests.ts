import { setTimeout as sleep } from 'node:timers/promises';
import { ValidationError } from '../errors.js';
import { HttpProblem } from '../http/problems.js';
import { readIdempotencyKey, readPreferWait } from '../http/request-headers.js';
import { isHeld, type ClaimOutcome } from '../store/claim-outcome.js';
import { assertValidKeyPart } from '../protocol/validate.js';
import type { RequestHandler } from './request-context.js';
import { requestFingerprint } from './request-fingerprint.js';
import { resolveIdempotentRequestsOptions, type IdempotentRequestsOptions, type ResolvedIdempotentRequestsOptions } from './request-options.js';
import { expiredProblem, inProgressProblem, internalProblem, keyReusedProblem, RequestProblem, unavailableProblem } from './request-problems.js';
import { isMiddlewareFault, runDatabaseOnly, runLeased, runUnprotected, type RunInput, type RunResult } from './request-runs.js';
import { decodeResponse, isStoredResponse, type RequestAnswer } from './stored-response.js';
import { StoreUnavailableError } from '../errors.js';

/** One request, as the framework adapters hand it over. */
export interface IncomingRequest {
  /** The method, e.g. `POST`. */
  readonly method: string;
  /** The request target: path and query, as sent (`/orders?dry=1`); part of the fingerprint. */
  readonly target: string;
  /** The `Idempotency-Key` header: each line apart (Node's `headersDistinct`), or the joined value. */
  readonly idempotencyKey: string | readonly string[] | undefined;
  /** The `Prefer` header (RFC 7240), for `wait=N`. @defaultValue unset */
  readonly prefer?: string | readonly string[] | undefined;
  /** The parsed body (a JSON value), its text or bytes, or undefined for none; part of the fingerprint. */
  readonly body: unknown;
  /** Who asks: a tenant or an authenticated client's id. Undefined: not identified (answered 401 on a covered request). */
  readonly client: string | undefined;
  /** Aborts when the client goes away: a `Prefer: wait` stops waiting. @defaultValue unset */
  readonly signal?: AbortSignal;
}

/** How {@link IdempotentRequests.handle} answered. */
export type RequestOutcome =
  /** The handler ran and its response committed with the key (and the handler's writes). */
  | 'created'
  /** The key had a stored response for this request: sent again, nothing ran. */
  | 'replayed'
  /** The handler answered 5xx: sent, not stored; the key was released (or never written). */
  | 'not-stored'
  /** Answered by the middleware: a problem (400, 401, 409, 410, 422, 500, 503); nothing ran or committed. */
  | 'refused'
  /** The handler ran without a key (a method not covered, or no key sent where none is required). */
  | 'unprotected';

/** An answer and how it came about. */
export interface HandledRequest extends RequestAnswer {
  /** How it came about. */
  readonly outcome: RequestOutcome;
}

/** Options of one {@link IdempotentRequests.handle} call. */
export interface HandleOptions {
  /**
   * The handler only touches this database, through `ctx.transaction`: no call to another system.
   * Then no lease is taken before it runs: the key is claimed inside its transaction (the fast
   * path), one transaction in all, and a concurrent retry waits on that transaction.
   * @defaultValue `false` (the key is claimed under a lease before the handler runs)
   */
  readonly databaseOnly?: boolean;
}

/**
 * `Idempotency-Key` for a service's own endpoints (draft-ietf-httpapi-idempotency-key-header,
 * as Stripe behaves), the request's key claimed in Postgres with the library's protocol, and its
 * response stored in the same transaction as the handler's writes. The framework adapters
 * (`expressIdempotency`, `fastifyIdempotency`, `IdempotencyInterceptor`) call {@link handle};
 * call it yourself for any other framework.
 *
 * A request of a covered method (POST, PATCH) with a key: a first request runs the handler and
 * its response commits with its writes; a retry with the same key and request gets the stored
 * response again (`Idempotent-Replayed: true`); another request under the key is 422; a retry
 * while the first is in flight is 409 with `Retry-After` (or waits, with `Prefer: wait=N`).
 *
 * @example
 * ```ts
 * import { IdempotencyKeys } from 'idempotent-jobs';
 * import { IdempotentRequests } from 'idempotent-jobs/http-idempotency';
 *
 * const requests = new IdempotentRequests({ keys: new IdempotencyKeys({ db }), namespace: 'orders' });
 * const answer = await requests.handle(
 *   { method: 'POST', target: '/orders', idempotencyKey: 'order-42', body: { cents: 1999 }, client: 'acme' },
 *   async (ctx) =>
 *     ctx.transaction(async (tx) => {
 *       await tx.insertInto('orders').values({ id: ctx.key, cents: 1999 }).execute();
 *       await producer.enqueue({ name: 'charge', key: `order-${ctx.key}`, data: { cents: 1999 } }, { tx });
 *       return { status: 201, body: { id: ctx.key } };
 *     }),
 * );
 * console.log(answer.status, answer.outcome, answer.headers, answer.body?.toString());
 * ```
 */
export class IdempotentRequests {
  readonly #options: ResolvedIdempotentRequestsOptions;

  constructor(options: IdempotentRequestsOptions) {
    this.#options = resolveIdempotentRequestsOptions(options);
  }

  /** The resolved options. */
  get options(): ResolvedIdempotentRequestsOptions {
    return this.#options;
  }

  /** True when requests of `method` are made idempotent. */
  covers(method: string): boolean {
    return this.#options.methods.has(method.toUpperCase());
  }

  /** The scope of a client's request keys: `request:<namespace>:<client>`. */
  scopeFor(client: string): string {
    return `request:${this.#options.namespace}:${client}`;
  }

  /**
   * Answers one request: runs `handler` once per key and request, or answers from the key. The
   * handler's own errors (thrown, not answered) are rethrown after its key was released, for
   * the framework to answer; everything else is an answer.
   */
  async handle(request: IncomingRequest, handler: RequestHandler, options: HandleOptions = {}): Promise<HandledRequest> {
    const { keyRequired, logger } = this.#options;
    const base = { options: this.#options, handler, signal: request.signal };
    if (!this.covers(request.method) || (request.idempotencyKey === undefined && !keyRequired)) {
      return this.#finish(request, await runUnprotected({ ...base, client: request.client }), undefined);
    }
    let input: RunInput;
    try {
      input = { ...base, ...this.#identify(request) };
    } catch (error) {
      if (error instanceof RequestProblem) return refused(request, error);
      throw error;
    }
    try {
      return await this.#claimAndRun(request, input, options.databaseOnly === true);
    } catch (error) {
      if (error instanceof RequestProblem) return refused(request, error);
      if (!isMiddlewareFault(error)) throw error;
      if (error instanceof StoreUnavailableError) {
        logger.warn({ err: error, scope: input.scope, key: input.key }, 'request deferred: the database is unavailable');
        return refused(request, unavailableProblem());
      }
      logger.error({ err: error, scope: input.scope, key: input.key }, 'request failed: its response cannot be stored');
      return refused(request, internalProblem());
    }
  }

  /** The key, scope and fingerprint of a covered request; a {@link RequestProblem} when they cannot be had. */
  #identify(request: IncomingRequest): Pick<RunInput, 'key' | 'scope' | 'client' | 'fingerprint'> {
    let key: string;
    try {
      key = readIdempotencyKey(request.idempotencyKey);
    } catch (error) {
      if (error instanceof HttpProblem) throw new RequestProblem(error.kind, error.message, error.headers);
      throw error;
    }
    const { client } = request;
    if (client === undefined) throw new RequestProblem('unauthorized', 'This request needs an identified client: its Idempotency-Key is kept per client. Authenticate first.');
    const scope = this.scopeFor(client);
    try {
      assertValidKeyPart('scope', scope);
    } catch (error) {
      if (error instanceof ValidationError) throw new RequestProblem('invalid-request', `The client identity cannot scope an Idempotency-Key: ${error.message}`);
      throw error;
    }
    return { key, scope, client, fingerprint: requestFingerprint(request.method, request.target, request.body) };
  }

  async #claimAndRun(request: IncomingRequest, input: RunInput, databaseOnly: boolean): Promise<HandledRequest> {
    const waitSeconds = Math.min(readPreferWait(request.prefer as string | string[] | undefined) ?? 0, this.#options.maxWaitSeconds);
    // A monotonic clock: a wall clock stepped back (NTP) would stretch the wait past what was asked.
    const waitUntil = performance.now() + waitSeconds * 1000;
    for (let pause = 50; ; pause = Math.min(pause * 2, 250)) {
      let outcome: ClaimOutcome | Exclude<RunResult, { kind: 'answered' }> | undefined;
      if (databaseOnly) {
        const result = await runDatabaseOnly(input);
        if (result.kind === 'answered') return this.#finish(request, result, input);
        outcome = result.kind === 'claim-outcome' ? result.outcome : result;
      } else {
        const claimed = await this.#options.keys.claim(input.scope, input.key, input.fingerprint, {
          leaseMs: this.#options.leaseMs,
          ...(this.#options.retention ? { retention: this.#options.retention } : {}),
          // Only its client retries a request, maybe never, or with a corrected body: released
          // (a 5xx, a thrown handler), the key expires after the retention instead of refusing
          // that body for ever.
          expireWhenReleased: true,
        });
        if (isHeld(claimed)) {
          const result = await runLeased(input, claimed);
          if (result.kind === 'answered') return this.#finish(request, result, input);
          outcome = result.kind === 'lease-lost' ? result : undefined;
        } else outcome = claimed;
      }
      if (outcome === undefined) throw new Error('unreachable: a run answers or names what stopped it');
      if (outcome.kind !== 'in-progress' && outcome.kind !== 'lease-lost') return this.#fromKey(request, input, outcome);
      const left = waitUntil - performance.now();
      if (left <= 0) return refused(request, inProgressProblem(input.key, outcome.kind === 'in-progress' ? outcome.retryAfterMs : 1000));
      await this.#waitForKey(input, Math.min(left, outcome.kind === 'in-progress' ? Math.max(pause, outcome.retryAfterMs) : pause), pause, request.signal);
      if (request.signal?.aborted) return refused(request, inProgressProblem(input.key, 1000));
    }
  }

  /** Waits for the key to settle (the listener), or `pause` (no listener), whichever the configuration gives. */
  async #waitForKey(input: RunInput, upToMs: number, pause: number, signal: AbortSignal | undefined): Promise<void> {
    const { listener, keys } = this.#options;
    if (!listener) {
      await sleep(Math.min(pause, upToMs), undefined, signal ? { signal } : {}).catch(() => {});
      return;
    }
    await listener.waitForSettled(
      input.scope,
      input.key,
      upToMs,
      async () => {
        const row = await keys.get(input.scope, input.key);
        return !row || row.status !== 'processing' || row.owner === null;
      },
      signal,
    );
  }

  /** The answer of a key that is settled (replay, 410), used with another request (422), or failed. */
  #fromKey(request: IncomingRequest, input: RunInput, outcome: Exclude<ClaimOutcome, { kind: 'claimed' | 'taken-over' | 'in-progress' }>): HandledRequest {
    switch (outcome.kind) {
      case 'key-reused':
        return refused(request, keyReusedProblem(input.key));
      case 'completed': {
        if (outcome.resultExpired) return refused(request, expiredProblem(input.key, outcome.resultExpired.finishedAt, outcome.resultExpired.tombstoneExpiresAt));
        if (!isStoredResponse(outcome.result)) {
          this.#options.logger.error({ scope: input.scope, key: input.key }, 'the key holds no stored response (was it written by something else?)');
          return refused(request, internalProblem());
        }
        const answer = decodeResponse(outcome.result);
        this.#options.logger.info({ scope: input.scope, key: input.key, status: answer.status }, 'request replayed');
        return { ...answer, headers: { ...answer.headers, 'idempotent-replayed': 'true' }, outcome: 'replayed' };
      }
      case 'failed':
        // Request keys are never failed by this middleware: an operator (or the sweeper) did it.
        this.#options.logger.error({ scope: input.scope, key: input.key, error: outcome.error }, 'the request key is marked failed; release it with `idempotent-jobs keys release`');
        return refused(request, internalProblem());
    }
  }

  #finish(_request: IncomingRequest, result: Extract<RunResult, { kind: 'answered' }>, input: RunInput | undefined): HandledRequest {
    const outcome: RequestOutcome = input === undefined ? 'unprotected' : result.stored ? 'created' : 'not-stored';
    return { ...result.answer, outcome };
  }
}

function refused(request: IncomingRequest, problem: RequestProblem): HandledRequest {
  return { ...problem.toAnswer(request.target), outcome: 'refused' };
}
