import { randomUUID } from 'node:crypto';
import swagger from '@fastify/swagger';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { IdempotentProducer } from '../bullmq/idempotent-producer.js';
import { OutboxRelay } from '../bullmq/outbox-relay.js';
import { assertBindAllowed, resolveHttpApiOptions, type HttpApiOptions, type ResolvedHttpApiOptions } from './http-options.js';
import { answerClientError } from './client-errors.js';
import { exportReadiness } from '../metrics/readiness-metrics.js';
import { RequestTracing } from '../telemetry/http-tracing.js';
import { httpMetrics, metricsExposition, type HttpMetrics } from './http-metrics.js';
import { JobIngestion, isSettled, type ExpiredRequest, type JobView } from './job-ingestion.js';
import { installJsonBodyParser } from './json-body.js';
import { keyInspectorRoutes } from './key-inspector.js';
import { scheduleRoutes } from './schedule-routes.js';
import { jobRouteSchemas, openApiDocument } from './openapi.js';
import { HttpProblem, sendProblem, toHttpProblem } from './problems.js';
import { BearerAuthenticator, readIdempotencyKey, readPathKey, readPreferWait, readRetentionQuery } from './request-headers.js';
import { defaultLogger } from '../default-logger.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** The authenticated tenant (set on `/v1` routes). */
    tenant: string;
  }
}

/** Job names: BullMQ shows them; they are part of the fingerprint. */
const JOB_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/;
/** A client's `Request-Id` is adopted when it looks like an id (so it can join logs across services). */
const REQUEST_ID_PATTERN = /^[A-Za-z0-9._:-]{1,128}$/;
/** Readiness checks give up after this long (the dependency counts as down). */
const READINESS_TIMEOUT_MS = 2_000;

interface JobParams {
  queue: string;
}
interface KeyParams extends JobParams {
  key: string;
}

/**
 * The HTTP ingestion API: other services enqueue jobs over HTTP with `Idempotency-Key`
 * semantics (draft-ietf-httpapi-idempotency-key-header-07, as Stripe behaves). Build it with
 * {@link createHttpApi}; `listen` refuses a non-loopback address when no bearer tokens are
 * configured; `close` finishes in-flight requests first.
 *
 * @example
 * ```ts
 * import { KeySettledListener, createHttpApi } from 'idempotent-jobs';
 *
 * // Wakes `Prefer: wait=N` requests when their job finishes (LISTEN: Postgres itself, not a pooler).
 * const listener = new KeySettledListener({ connectionString: 'postgres://app@127.0.0.1:5432/app', schema: 'idempotent_jobs' });
 * const api = await createHttpApi({
 *   keys,
 *   connection: { url: 'redis://127.0.0.1:6379' },
 *   queues: ['payments'],
 *   tokens: { 'tok_billing_0123456789abcdef': 'billing' }, // bearer token → tenant
 *   listener,
 * });
 * const url = await api.listen({ host: '0.0.0.0', port: 3000 });
 * console.log(`POST ${url}/v1/queues/payments/jobs with an Idempotency-Key header`);
 * // … on shutdown: in-flight requests finish first
 * await api.close();
 * await listener.close();
 * ```
 */
export class HttpApi {
  /** The Fastify instance (for `inject` in tests, or adding routes). */
  readonly app: FastifyInstance;
  readonly #options: ResolvedHttpApiOptions;
  readonly #producers = new Map<string, IdempotentProducer>();
  readonly #relay: OutboxRelay | undefined;
  readonly #ingestion: JobIngestion;
  readonly #auth: BearerAuthenticator;
  readonly #metrics: HttpMetrics = httpMetrics();
  readonly #tracing = new RequestTracing();
  /** Aborted when closing: pending `Prefer: wait` requests answer at once. */
  readonly #closing = new AbortController();
  readonly #relayKicks = new Set<Promise<unknown>>();
  #relayKickPending = false;
  /** Requests being handled, and who waits for them all to end (close). */
  #inFlight = 0;
  #onIdle: (() => void) | undefined;

  /** Use {@link createHttpApi}, which also waits for the plugins to load. */
  constructor(options: HttpApiOptions) {
    this.#options = resolveHttpApiOptions(options);
    const { keys, backend, connection, prefix, queues, jobOptions } = this.#options;
    const logger: Logger = this.#options.logger ?? defaultLogger();
    for (const queue of queues) {
      const producer = new IdempotentProducer({
        queue,
        backend,
        connection,
        prefix,
        schema: keys.options.schema,
        fingerprint: keys.options.fingerprint,
        defaultJobOptions: jobOptions,
        // A server outlives Redis's outages, at its start too: its producers wait as long as it takes.
        startupWaitMs: Infinity,
      });
      // Without a listener, ioredis prints connection errors to stderr; they belong in the log
      // (and show as a 503 from /readyz).
      producer.queue.on('error', (error) => logger.warn({ err: error, queue }, 'queue connection error'));
      this.#producers.set(queue, producer);
    }
    this.#relay = this.#options.relay
      ? new OutboxRelay({ db: keys.db, schema: keys.options.schema, backend, connection, prefix, pollIntervalMs: this.#options.relayPollIntervalMs, logger })
      : undefined;
    this.#auth = new BearerAuthenticator(this.#options.tokens);
    this.#ingestion = new JobIngestion({
      keys,
      producers: this.#producers,
      listener: this.#options.listener,
      onCreated: () => this.#kickRelay(),
      onQueueReadError: (error) => logger.warn({ err: error }, 'could not read a job state from BullMQ; reporting it as queued'),
    });
    this.app = Fastify({
      loggerInstance: logger,
      genReqId: (raw) => {
        const incoming = raw.headers['request-id'];
        return typeof incoming === 'string' && REQUEST_ID_PATTERN.test(incoming) ? incoming : randomUUID();
      },
      bodyLimit: this.#options.bodyLimitBytes,
      // Keys are up to 255 characters, three times that percent-encoded.
      routerOptions: { maxParamLength: 1024 },
      return503OnClosing: true,
      clientErrorHandler: answerClientError,
      // A URL the router cannot decode (`/v1/queues/%80/jobs`) is refused before any hook runs.
      frameworkErrors: (error, request, reply) => {
        reply.header('request-id', request.id);
        return sendProblem(request, reply, toHttpProblem(error, String(request.id)));
      },
      forceCloseConnections: 'idle',
    }) as unknown as FastifyInstance;
    this.#refuseOversizedBodiesBeforeUpload();
    this.#setUp();
  }

  /**
   * A client that sends `Expect: 100-continue` (curl does for bodies over 1 MiB) waits for
   * "100 Continue" before uploading. Node sends it at once by default, so an oversized body was
   * invited, then refused (413) and cut off mid-upload, which the client sees as a reset
   * connection instead of the 413. Here a request whose Content-Length is over the limit gets
   * no "100 Continue": Fastify answers 413 and the client never sends the body.
   */
  #refuseOversizedBodiesBeforeUpload(): void {
    const limit = this.#options.bodyLimitBytes;
    const server = this.app.server;
    server.on('checkContinue', (request, response) => {
      const length = Number(request.headers['content-length']);
      if (!(length > limit)) response.writeContinue();
      server.emit('request', request, response);
    });
  }

  /** The queues this API accepts. */
  get queues(): readonly string[] {
    return this.#options.queues;
  }

  /**
   * Listens on `host:port` (port 0: an ephemeral port) and returns the base URL. Refuses a
   * non-loopback host when no bearer tokens are configured.
   */
  async listen(options: { host?: string; port?: number } = {}): Promise<string> {
    const host = options.host ?? '127.0.0.1';
    assertBindAllowed(host, this.#options.tokens.size);
    await this.app.listen({ host, port: options.port ?? 3000 });
    const address = this.app.server.address();
    if (address === null || typeof address === 'string') return String(address);
    const shown = address.family === 'IPv6' ? `[${address.address}]` : address.address;
    return `http://${shown}:${address.port}`;
  }

  /**
   * Graceful shutdown: stop accepting connections, answer pending `Prefer: wait` requests at
   * once, let in-flight requests finish, then stop the relay and close the queues. Does not
   * close the IdempotencyKeys' database or the listener (their owner does).
   */
  close(): Promise<void> {
    return this.app.close();
  }

  #setUp(): void {
    const app = this.app;
    app.decorateRequest('tenant', '');
    app.removeContentTypeParser('text/plain');
    installJsonBodyParser(app);
    app.addHook('onRequest', async (request, reply) => {
      reply.header('request-id', request.id);
      this.#inFlight++;
      reply.raw.once('close', () => {
        if (--this.#inFlight === 0) this.#onIdle?.();
      });
    });
    app.addHook('onSend', async (_request, reply, payload) => {
      // While closing, a keep-alive connection would hold the close open until its timeout:
      // the last answer on it closes it.
      if (this.#closing.signal.aborted) reply.header('connection', 'close');
      return payload;
    });
    app.addHook('onResponse', async (request, reply) => {
      const labels = { method: request.method, route: request.routeOptions.url ?? 'unmatched', status_code: String(reply.statusCode) };
      this.#metrics.requests.inc(labels);
      this.#metrics.duration.observe(labels, reply.elapsedTime / 1000);
      this.#tracing.end(request, reply.statusCode);
    });
    // Readiness also goes out with every scrape, so an alert does not depend on who polls /readyz.
    const stopReadiness = exportReadiness('http', async () => {
      const checks = await this.#readiness();
      return { checks: Object.fromEntries(Object.entries(checks).map(([name, state]) => [name, { ok: state === 'ok' }])) };
    });
    app.addHook('preClose', async () => {
      this.#closing.abort();
      stopReadiness();
    });
    app.addHook('onClose', async () => {
      // In-flight requests still read job states through the queues: let them finish first.
      if (this.#inFlight > 0) await new Promise<void>((resolve) => (this.#onIdle = resolve));
      await Promise.allSettled([...this.#relayKicks]);
      await this.#relay?.stop();
      await Promise.all([...this.#producers.values()].map((producer) => producer.close()));
    });
    app.setErrorHandler((error, request, reply) => {
      const problem = toHttpProblem(error, String(request.id));
      if (problem.kind === 'temporarily-unavailable') request.log.warn({ err: error }, 'request deferred: a dependency is unavailable');
      else if (problem.status >= 500) request.log.error({ err: error }, 'request failed');
      else request.log.info({ problem: problem.kind, detail: problem.message }, 'request refused');
      return sendProblem(request, reply, problem);
    });
    app.setNotFoundHandler((request, reply) =>
      sendProblem(request, reply, new HttpProblem('not-found', `No route ${request.method} ${request.url.split('?')[0]}. See /openapi.json.`)),
    );

    // The job routes' handlers run inside a server span whose parent is the caller's traceparent.
    app.addHook('onRoute', (route) => {
      if (route.url.startsWith('/v1/')) route.handler = this.#tracing.wrap(route.url, route.handler as (request: FastifyRequest, reply: FastifyReply) => unknown);
    });
    app.register(swagger, { openapi: openApiDocument(this.#options) });
    app.register(async (scope) => this.#operationalRoutes(scope));
    app.register(async (scope) => this.#jobRoutes(scope), { prefix: '/v1' });
    app.register(keyInspectorRoutes({ keys: this.#options.keys, producers: this.#producers, adminTokens: this.#options.adminTokens }), { prefix: '/ui' });
    app.register(scheduleRoutes({ db: this.#options.keys.db, schema: this.#options.keys.options.schema, adminTokens: this.#options.adminTokens }), { prefix: '/schedules' });
    this.#relay?.start();
  }

  #operationalRoutes(app: FastifyInstance): void {
    app.get('/healthz', { schema: { summary: 'Liveness: the process answers.', tags: ['operations'] } }, async (_request, reply) =>
      reply.type('application/json; charset=utf-8').send(JSON.stringify({ status: 'ok' })),
    );
    app.get('/readyz', { schema: { summary: 'Readiness: Postgres and Redis answer.', tags: ['operations'] } }, async (request, reply) => {
      const { postgres, redis } = await this.#readiness();
      if (postgres !== 'ok' || redis !== 'ok') {
        return sendProblem(request, reply, new HttpProblem('not-ready', `postgres: ${postgres}; redis: ${redis}`));
      }
      return reply.type('application/json; charset=utf-8').send(JSON.stringify({ status: 'ready', postgres, redis }));
    });
    app.get('/metrics', { schema: { summary: 'Prometheus metrics (text exposition format).', tags: ['operations'] } }, async (_request, reply) => {
      const { contentType, body } = await metricsExposition();
      return reply.type(contentType).send(body);
    });
    app.get('/openapi.json', { schema: { hide: true } }, async (_request, reply) =>
      reply.type('application/json; charset=utf-8').send(JSON.stringify(app.swagger())),
    );
  }

  #jobRoutes(app: FastifyInstance): void {
    app.addHook('onRequest', async (request) => {
      request.tenant = this.#auth.tenantOf(request.headers.authorization);
    });
    const checkQueue = async (request: FastifyRequest) => {
      const { queue } = request.params as JobParams;
      if (!this.#producers.has(queue)) {
        throw new HttpProblem('unknown-queue', `Queue "${queue}" does not exist here; known queues: ${this.#options.queues.join(', ')}.`);
      }
    };
    const checkKeyAndType = async (request: FastifyRequest) => {
      readIdempotencyKey(idempotencyKeyHeader(request));
      const mediaType = request.headers['content-type']?.split(';')[0]?.trim().toLowerCase();
      if (mediaType !== 'application/json') {
        throw new HttpProblem(
          'unsupported-media-type',
          `The body must be the job payload as JSON with Content-Type: application/json (got ${mediaType ? `"${mediaType}"` : 'no Content-Type'}).`,
        );
      }
    };

    app.post<{ Params: JobParams; Querystring: { name?: string; resultMs?: unknown; tombstoneMs?: unknown } }>(
      '/queues/:queue/jobs',
      { onRequest: [checkQueue, checkKeyAndType], schema: jobRouteSchemas.post },
      async (request, reply) => {
        const { queue } = request.params;
        const key = readIdempotencyKey(idempotencyKeyHeader(request));
        const name = request.query.name ?? queue;
        if (!JOB_NAME_PATTERN.test(name)) {
          throw new HttpProblem('invalid-request', `Job name "${name}" is not 1–128 of A–Z a–z 0–9 _ . : - (starting with a letter or digit).`);
        }
        const retention = readRetentionQuery(request.query);
        // The body parser has refused what cannot be stored (json-body.ts).
        const payload = request.body;
        const outcome = await this.#ingestion.submit({ tenant: request.tenant, queue, key, name, payload, ...(retention ? { retention } : {}) });
        switch (outcome.kind) {
          case 'key-reused':
            this.#metrics.outcomes.inc({ outcome: 'key_reused' });
            throw new HttpProblem(
              'idempotency-key-reused',
              `Idempotency-Key "${key}" was already used with a different request (queue, job name or body). Nothing was enqueued; use a new key for a new request.`,
            );
          case 'in-progress': {
            this.#metrics.outcomes.inc({ outcome: 'in_progress' });
            const seconds = Math.max(1, Math.ceil(outcome.retryAfterMs / 1000));
            throw new HttpProblem(
              'request-in-progress',
              `A request with Idempotency-Key "${key}" is being handled right now. Nothing was enqueued by this one; retry after ${seconds} s to get its answer.`,
              { 'retry-after': String(seconds) },
            );
          }
          case 'expired':
            this.#metrics.outcomes.inc({ outcome: 'expired' });
            throw expiredProblem(key, outcome);
          case 'created':
          case 'replayed': {
            this.#metrics.outcomes.inc({ outcome: outcome.kind });
            if (outcome.kind === 'replayed') reply.header('idempotent-replayed', 'true');
            request.log.info({ queue, key, jobId: outcome.view.jobId, outcome: outcome.kind }, outcome.kind === 'created' ? 'job accepted' : 'request replayed');
            const view = await this.#applyWait(request, reply, outcome.view);
            return this.#sendView(reply, view, isSettled(view) ? 200 : 202);
          }
        }
      },
    );

    app.get<{ Params: KeyParams }>('/queues/:queue/jobs/:key', { onRequest: [checkQueue], schema: jobRouteSchemas.get }, async (request, reply) => {
      const { queue } = request.params;
      const key = readPathKey(request.params.key);
      const view = await this.#ingestion.view(request.tenant, queue, key);
      const expired = view ? undefined : await this.#ingestion.expired(request.tenant, key);
      if (expired) throw expiredProblem(key, expired);
      if (!view) throw new HttpProblem('not-found', `No request with Idempotency-Key "${key}" on queue "${queue}" (or it has expired).`);
      return this.#sendView(reply, await this.#applyWait(request, reply, view), 200);
    });
  }

  /** `Prefer: wait=N`: waits for the job's key to be settled, at most N (capped) seconds, by notification. */
  async #applyWait(request: FastifyRequest, reply: FastifyReply, view: JobView): Promise<JobView> {
    const asked = readPreferWait(request.headers.prefer);
    if (asked === undefined || asked <= 0 || !this.#options.listener || this.#options.maxWaitSeconds === 0) return view;
    const seconds = Math.min(asked, this.#options.maxWaitSeconds);
    reply.header('preference-applied', `wait=${seconds}`);
    if (isSettled(view)) return view;
    const { queue, key } = view;
    // Stop waiting when the server closes or the client goes away (the response's 'close'
    // before it was sent).
    const clientGone = new AbortController();
    const onClose = () => clientGone.abort();
    reply.raw.once('close', onClose);
    try {
      const signal = AbortSignal.any([this.#closing.signal, clientGone.signal]);
      const waited = (await this.#ingestion.waitForSettled(request.tenant, queue, key, seconds * 1000, signal)) ?? view;
      this.#metrics.waits.inc({ outcome: isSettled(waited) ? 'settled' : 'timed_out' });
      return waited;
    } finally {
      reply.raw.off('close', onClose);
    }
  }

  #sendView(reply: FastifyReply, view: JobView, status: number): FastifyReply {
    const self = `/v1/queues/${encodeURIComponent(view.queue)}/jobs/${encodeURIComponent(view.key)}`;
    reply.header('location', self);
    return reply
      .code(status)
      .type('application/json; charset=utf-8')
      .send(JSON.stringify({ ...view, links: { self } }));
  }

  /** Delivers the outbox now rather than at the relay's next poll; coalesces concurrent nudges. */
  #kickRelay(): void {
    const relay = this.#relay;
    if (!relay || this.#closing.signal.aborted) return;
    if (this.#relayKicks.size > 0) {
      this.#relayKickPending = true;
      return;
    }
    const kick = (async () => {
      do {
        this.#relayKickPending = false;
        await relay.relayOnce();
      } while (this.#relayKickPending && !this.#closing.signal.aborted);
    })()
      .catch((error) => this.app.log.warn({ err: error }, 'outbox delivery failed; the relay retries'))
      .finally(() => this.#relayKicks.delete(kick));
    this.#relayKicks.add(kick);
  }

  /** The checks of `/readyz` (and of `idempotent_jobs_ready{component="http"}`): `ok`, or `down (why)`. */
  async #readiness(): Promise<{ postgres: string; redis: string }> {
    const [postgres, redis] = await Promise.all([
      this.#check(async () => {
        // A read of the keys table: proves the connection and the migrated schema.
        await this.#options.keys.get('readyz:probe', 'probe');
      }),
      this.#check(async () => {
        // A read that goes to Redis through BullMQ's own connection (whatever its backend).
        await this.#producers.values().next().value!.queue.getJobState('readyz-probe');
      }),
    ]);
    return { postgres, redis };
  }

  async #check(probe: () => Promise<void>): Promise<string> {
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([
        probe(),
        new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(`no answer within ${READINESS_TIMEOUT_MS} ms`)), READINESS_TIMEOUT_MS))),
      ]);
      return 'ok';
    } catch (error) {
      return `down (${(error as Error).message})`;
    } finally {
      clearTimeout(timer);
    }
  }
}

/** The Idempotency-Key header lines, each apart (`headersDistinct`; `inject`'s fake requests lack it). */
function idempotencyKeyHeader(request: FastifyRequest): string | readonly string[] | undefined {
  return request.raw.headersDistinct?.['idempotency-key'] ?? request.headers['idempotency-key'];
}

/** Builds the HTTP ingestion API and waits until its routes are ready. See {@link HttpApi}. */
export async function createHttpApi(options: HttpApiOptions): Promise<HttpApi> {
  const api = new HttpApi(options);
  try {
    await api.app.ready();
  } catch (error) {
    await api.close().catch(() => {});
    throw error;
  }
  return api;
}

/** The 410 of a request whose record has expired while its key is still refused (its tombstone). */
function expiredProblem(key: string, expired: ExpiredRequest): HttpProblem {
  return new HttpProblem(
    'request-expired',
    `A request with Idempotency-Key "${key}" was accepted at ${expired.acceptedAt.toISOString()}; its record has expired, so its job's state ` +
      `is no longer known. Nothing was enqueued by this one. The key stays refused until ${expired.refusedUntil.toISOString()}.`,
  );
}
