import type { FastifyInstance, FastifyPluginAsync, FastifyReply } from 'fastify';
import type { IdempotentProducer } from '../bullmq/idempotent-producer.js';
import { operatorOf } from './operator-access.js';
import { Schedules, scheduleScope, type ScheduleInfo } from '../ops/schedules.js';
import { ValidationError } from '../errors.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { assertValidKeyPart } from '../protocol/validate.js';
import { PostgresOperatorStore, type OperatorStore } from '../store/operator-store.js';
import type { KeyCursor, KeyStatus } from '../store/records.js';
import type { SafeHtml } from './html.js';
import { INSPECTOR_CSP, INSPECTOR_PAGE, INSPECTOR_SCRIPT, INSPECTOR_STYLE } from './inspector-assets.js';
import { KEY_STATUSES, keyListView, keyNotFoundView, keyView, messageView, overviewView, tombstoneView, type Notice } from './inspector-views.js';
import { HttpProblem, PROBLEMS, toHttpProblem } from './problems.js';
import { BearerAuthenticator } from './request-headers.js';

/** Options of {@link keyInspectorRoutes}. */
export interface KeyInspectorOptions {
  /** The claim protocol: its database and schema hold the keys, steps and audit records. */
  readonly keys: IdempotencyKeys;
  /** The service's queues, by name: a key's page reads its BullMQ job's state through them. */
  readonly producers: ReadonlyMap<string, IdempotentProducer>;
  /** Admin token → operator name; empty: loopback only, operator `"loopback"`. */
  readonly adminTokens: ReadonlyMap<string, string>;
  /** How long a key's page waits for BullMQ's answer about the job. @defaultValue `2_000` */
  readonly queueReadTimeoutMs?: number;
}

export { LOOPBACK_OPERATOR } from './operator-access.js';

/** Rows in each overview list. */
const OVERVIEW_ROWS = 10;
/** Operator actions shown on a key's page. */
const KEY_AUDIT_ROWS = 50;
/** Keys per list page unless `limit` says otherwise, and the most it may say. */
const DEFAULT_PAGE_SIZE = 50;
const MAX_PAGE_SIZE = 200;
/** Longest release reason, in characters. */
const MAX_REASON_LENGTH = 1_000;

declare module 'fastify' {
  interface FastifyRequest {
    /** The operator using the key inspector (set on `/ui/view` routes). */
    operator: string;
  }
}

/**
 * The key inspector: a page at `/ui` where an operator looks keys up and releases stuck ones.
 * `GET /ui/` serves the page (no data) and its script; the script fetches the views under
 * `/ui/view/` (server-rendered HTML fragments) with `Authorization: Bearer <admin token>`.
 * Each view needs an admin token (`adminTokens`, never a tenant's); without admin tokens, the
 * views answer only while the server listens on loopback and the request names a loopback
 * host (a DNS-rebinding page cannot). Every release is logged and recorded on the key.
 *
 * @example
 * ```ts
 * import Fastify from 'fastify';
 * import { keyInspectorRoutes } from './key-inspector.js';
 *
 * // As HttpApi mounts it:
 * const app = Fastify();
 * await app.register(
 *   keyInspectorRoutes({ keys, producers: new Map([['payments', producer]]), adminTokens: new Map([['adm_0123456789abcdef', 'alice']]) }),
 *   { prefix: '/ui' },
 * );
 * ```
 */
export function keyInspectorRoutes(options: KeyInspectorOptions): FastifyPluginAsync {
  const inspector = new KeyInspector(options);
  return async (app) => inspector.register(app);
}

class KeyInspector {
  readonly #options: KeyInspectorOptions;
  readonly #admins: BearerAuthenticator;
  readonly #store: OperatorStore;
  readonly #schedules: Schedules;

  constructor(options: KeyInspectorOptions) {
    this.#options = Object.freeze({ ...options });
    this.#store = new PostgresOperatorStore(options.keys.db, options.keys.options.schema);
    this.#schedules = new Schedules({ db: options.keys.db, schema: options.keys.options.schema });
    this.#admins = new BearerAuthenticator(options.adminTokens);
  }

  register(app: FastifyInstance): void {
    app.addHook('onSend', async (_request, reply, payload) => {
      reply.header('content-security-policy', INSPECTOR_CSP);
      reply.header('x-content-type-options', 'nosniff');
      reply.header('referrer-policy', 'no-referrer');
      reply.header('cache-control', 'no-store');
      return payload;
    });
    app.setNotFoundHandler((request, reply) =>
      sendView(reply, 404, messageView('not-found', 'Not found', `Nothing at ${request.url.split('?')[0]}. Open /ui/ for the key inspector.`)),
    );
    const hide = { schema: { hide: true } };
    // The page's links and fetches are relative: it must be served from `/ui/`, not `/ui`.
    app.get('', { ...hide, prefixTrailingSlash: 'no-slash' }, async (request, reply) => reply.redirect(`${request.url.split('?')[0]}/`, 302));
    app.get('/', { ...hide, prefixTrailingSlash: 'slash' }, async (_request, reply) => reply.type('text/html; charset=utf-8').send(INSPECTOR_PAGE));
    app.get('/inspector.js', hide, async (_request, reply) => reply.type('text/javascript; charset=utf-8').send(INSPECTOR_SCRIPT));
    app.get('/inspector.css', hide, async (_request, reply) => reply.type('text/css; charset=utf-8').send(INSPECTOR_STYLE));
    app.register(async (views) => this.#views(views), { prefix: '/view' });
  }

  #views(app: FastifyInstance): void {
    app.decorateRequest('operator', '');
    app.addHook('onRequest', async (request) => {
      request.operator = operatorOf(this.#admins, request, 'The key inspector');
    });
    app.setErrorHandler((error, request, reply) => {
      const problem = toHttpProblem(error, String(request.id));
      if (problem.status >= 500 && problem.kind !== 'temporarily-unavailable') request.log.error({ err: error }, 'key inspector request failed');
      else request.log.info({ problem: problem.kind, detail: problem.message }, 'key inspector request refused');
      for (const [name, value] of Object.entries(problem.headers)) reply.header(name, value);
      return sendView(reply, problem.status, messageView(problem.kind, PROBLEMS[problem.kind].title, problem.message));
    });

    app.get('/overview', async (_request, reply) => {
      const store = this.#store;
      const [stats, expiredLeases, failures, takeovers, actions, now] = await Promise.all([
        store.keyStats(),
        store.recentKeys('expired-lease', OVERVIEW_ROWS),
        store.recentKeys('failed', OVERVIEW_ROWS),
        store.recentKeys('taken-over', OVERVIEW_ROWS),
        store.recentAudit(OVERVIEW_ROWS),
        store.now(),
      ]);
      return sendView(reply, 200, overviewView({ stats, expiredLeases, failures, takeovers, actions, now }));
    });

    app.get<{ Querystring: Record<string, string | undefined> }>('/keys', async (request, reply) => {
      const query = request.query;
      const status = readStatus(query.status);
      const scope = query.scope === undefined || query.scope === '' ? undefined : readKeyPart('scope', query.scope);
      const after = readCursor(query.afterScope, query.afterKey, 'after');
      const before = readCursor(query.beforeScope, query.beforeKey, 'before');
      const chosenLimit = readLimit(query.limit);
      const limit = chosenLimit ?? DEFAULT_PAGE_SIZE;
      const [page, now] = await Promise.all([this.#store.pageKeys({ status, scope, after, before, limit }), this.#store.now()]);
      const backward = before !== undefined && after === undefined;
      return sendView(reply, 200, keyListView({ page, status, scope, limit: chosenLimit, backward, fromCursor: after !== undefined || before !== undefined, now }));
    });

    app.get<{ Querystring: Record<string, string | undefined> }>('/key', async (request, reply) => {
      const scope = readKeyPart('scope', request.query.scope);
      const key = readKeyPart('key', request.query.key);
      const page = await this.#keyPage(scope, key);
      if (page) return sendView(reply, 200, page);
      const tombstone = await this.#store.getTombstone(scope, key);
      return tombstone ? sendView(reply, 200, tombstoneView(tombstone)) : sendView(reply, 404, keyNotFoundView(scope, key));
    });

    app.post<{ Body: unknown }>('/release', async (request, reply) => {
      const body = (request.body ?? {}) as Record<string, unknown>;
      const scope = readKeyPart('scope', body.scope);
      const key = readKeyPart('key', body.key);
      const reason = readReason(body.reason);
      const operator = request.operator;
      const released = await this.#store.releaseKey({ scope, key, reason, actor: operator });
      if (released) {
        request.log.info(
          { operator, scope, key, reason, previousStatus: released.previousStatus, fence: released.record.fence },
          'key released by an operator in the key inspector',
        );
        const notice: Notice = {
          kind: 'done',
          text: `Released by ${operator} (was ${released.previousStatus}): the next claim takes the key over with fence ${released.record.fence + 1}.`,
        };
        return sendView(reply, 200, (await this.#keyPage(scope, key, notice))!);
      }
      const existing = await this.#store.getKey(scope, key);
      request.log.info({ operator, scope, key, reason, status: existing?.status ?? null }, 'key release refused in the key inspector');
      if (!existing) return sendView(reply, 404, keyNotFoundView(scope, key));
      const notice: Notice = {
        kind: 'refused',
        text: `Not released: the key is ${existing.status}; only processing or failed keys can be released. Releasing a completed key would run its effect a second time; use a new key for a new request.`,
      };
      return sendView(reply, 409, (await this.#keyPage(scope, key, notice))!);
    });
  }

  /** A key's page, or undefined when there is no such key. */
  async #keyPage(scope: string, key: string, notice?: Notice): Promise<SafeHtml | undefined> {
    const store = this.#store;
    const [record, steps, audit, now] = await Promise.all([
      store.getKey(scope, key),
      store.loadSteps(scope, key),
      store.keyAudit(scope, key, KEY_AUDIT_ROWS),
      store.now(),
    ]);
    if (!record) return undefined;
    const [jobState, schedule] = await Promise.all([this.#jobState(record.queue, record.jobId), this.#scheduleOf(scope)]);
    return keyView({ record, steps, audit, jobState, now, notice, ...(schedule ? { schedule } : {}) });
  }

  /** For a tick's key (scope `schedule:<name>`), the schedule it belongs to, or `'removed'`; undefined for other keys. */
  async #scheduleOf(scope: string): Promise<ScheduleInfo | 'removed' | undefined> {
    const prefix = scheduleScope('');
    if (!scope.startsWith(prefix) || scope.length === prefix.length) return undefined;
    try {
      return (await this.#schedules.get(scope.slice(prefix.length))) ?? 'removed';
    } catch (error) {
      // A scope that only looks like a tick's (the rest is no schedule's name): an ordinary key.
      if (error instanceof ValidationError) return undefined;
      throw error;
    }
  }

  /** The BullMQ job's state, read through the service's own queue, or why it was not read. */
  async #jobState(queue: string | null, jobId: string | null): Promise<string> {
    if (queue === null || jobId === null) return '- (the key names no job)';
    const producer = this.#options.producers.get(queue);
    if (!producer) return `not read: queue "${queue}" is not one of this service's queues (HTTP_QUEUES)`;
    const ms = this.#options.queueReadTimeoutMs ?? 2_000;
    let timer: NodeJS.Timeout | undefined;
    try {
      const state = await Promise.race([
        producer.queue.getJobState(jobId),
        new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms))),
      ]);
      return state === 'unknown' ? 'unknown (not in BullMQ: removed after it finished, or not added yet)' : state;
    } catch (error) {
      return `not read: Redis did not answer (${(error as Error).message})`;
    } finally {
      clearTimeout(timer);
    }
  }
}

function sendView(reply: FastifyReply, status: number, view: SafeHtml): FastifyReply {
  return reply.code(status).type('text/html; charset=utf-8').send(view.toString());
}

function readKeyPart(field: 'scope' | 'key', value: unknown): string {
  if (value === undefined || value === '') throw new HttpProblem('invalid-request', `Give the ${field}.`);
  assertValidKeyPart(field, value);
  return value;
}

function readStatus(value: string | undefined): KeyStatus | undefined {
  if (value === undefined || value === '') return undefined;
  if (!(KEY_STATUSES as readonly string[]).includes(value)) {
    throw new HttpProblem('invalid-request', `Status "${value}" is not one of ${KEY_STATUSES.join(', ')}.`);
  }
  return value as KeyStatus;
}

function readCursor(scope: string | undefined, key: string | undefined, name: string): KeyCursor | undefined {
  if (scope === undefined && key === undefined) return undefined;
  try {
    assertValidKeyPart('scope', scope);
    assertValidKeyPart('key', key);
  } catch (error) {
    if (error instanceof ValidationError) throw new HttpProblem('invalid-request', `The ${name} cursor needs a valid ${name}Scope and ${name}Key: ${error.message}`);
    throw error;
  }
  return { scope, key };
}

function readLimit(value: string | undefined): number | undefined {
  if (value === undefined || value === '') return undefined;
  const n = Number(value);
  if (!/^\d+$/.test(value) || n < 1 || n > MAX_PAGE_SIZE) throw new HttpProblem('invalid-request', `limit must be a whole number from 1 to ${MAX_PAGE_SIZE}, got "${value}".`);
  return n;
}

function readReason(value: unknown): string {
  const reason = typeof value === 'string' ? value.trim() : '';
  if (reason === '') throw new HttpProblem('invalid-request', 'Give a reason for the release: it is recorded on the key with your name and the time.');
  if ([...reason].length > MAX_REASON_LENGTH) throw new HttpProblem('invalid-request', `The reason is longer than ${MAX_REASON_LENGTH} characters; shorten it.`);
  if (reason.includes('\u0000')) throw new HttpProblem('invalid-request', 'The reason must not contain NUL characters.');
  return reason;
}
