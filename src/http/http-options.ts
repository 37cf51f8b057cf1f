import type { Logger } from 'pino';
import { z } from 'zod';
import type { IdempotentProducerOptions } from '../bullmq/idempotent-producer.js';
import { ConfigError, ValidationError } from '../errors.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import type { KeySettledListener } from '../store/key-settled-listener.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** The tenant every request belongs to when no bearer tokens are configured (loopback only). */
export const ANONYMOUS_TENANT = 'default';

/**
 * Tenant names: they become the jobs' idempotency scope, and `http:<tenant>` the scope of the
 * request records, so they may not contain `:` (no tenant's scope can look like another's).
 */
const TENANT_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
/** Operator names (admin tokens' names): recorded on the keys they act on, and logged. */
const OPERATOR_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$/;
/** Queue names as BullMQ accepts them in a Redis key, and as they appear in a URL path. */
export const QUEUE_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;
/** Shortest bearer token accepted: shorter ones are guessable. */
export const MIN_TOKEN_LENGTH = 16;

/** Options of the HTTP ingestion API ({@link createHttpApi}). */
export interface HttpApiOptions {
  /**
   * The claim protocol. Its database holds the request records (scope `http:<tenant>`), the
   * jobs' keys (scope `<tenant>`) and the outbox; its `claimLockTimeoutMs` bounds how long a
   * concurrent duplicate request waits before it is answered 409.
   */
  readonly keys: IdempotencyKeys;
  /** Where BullMQ keeps the queues (see `QueueConnectionOptions.backend`). @defaultValue `'redis'` */
  readonly backend?: IdempotentProducerOptions['backend'];
  /** BullMQ connection (for reading job states and, in the relay, adding jobs). */
  readonly connection: IdempotentProducerOptions['connection'];
  /** BullMQ key prefix; on the Postgres backend, the queues' schema. @defaultValue `'bull'` (Redis), `'bullmq'` (Postgres) */
  readonly prefix?: string;
  /** Queues that accept jobs; any other queue name in a URL is answered 404. */
  readonly queues: readonly string[];
  /**
   * Bearer token → tenant. Empty or omitted: no authentication, every request is tenant
   * `"default"`, and the server refuses to listen on anything but loopback.
   * @defaultValue `{}`
   */
  readonly tokens?: Readonly<Record<string, string>>;
  /**
   * Admin bearer token → operator name, for the key inspector at `/ui` (separate from the
   * tenants' `tokens`; a token may not be both). The operator's name is recorded on every key
   * they act on. Empty or omitted: the inspector answers only while the server listens on
   * loopback, every action being recorded as operator `"loopback"`; on any other address it
   * refuses every request.
   * @defaultValue `{}`
   */
  readonly adminTokens?: Readonly<Record<string, string>>;
  /**
   * Wakes `Prefer: wait=N` requests when their job settles.
   * @defaultValue unset: `Prefer: wait` is not applied (and no `Preference-Applied` is sent)
   */
  readonly listener?: KeySettledListener;
  /** Upper bound of `Prefer: wait=N`, in seconds. @defaultValue `30` */
  readonly maxWaitSeconds?: number;
  /** Largest request body, in bytes (413 above). @defaultValue `1_048_576` */
  readonly bodyLimitBytes?: number;
  /** BullMQ options of every job. @defaultValue `{ attempts: 3, backoff: { type: 'exponential', delay: 1000 } }` */
  readonly jobOptions?: IdempotentProducerOptions['defaultJobOptions'];
  /**
   * Run an {@link OutboxRelay} inside the server, so jobs written to the outbox reach BullMQ
   * without a separate relay process. @defaultValue `true`
   */
  readonly relay?: boolean;
  /** The in-process relay's poll interval when the outbox is empty. @defaultValue `200` */
  readonly relayPollIntervalMs?: number;
  /** Structured logger; every request's lines carry its `reqId`. @defaultValue pino at `LOG_LEVEL`, else `warn` */
  readonly logger?: Logger;
}

/** {@link HttpApiOptions} with defaults applied and every value checked. */
export interface ResolvedHttpApiOptions {
  /** See {@link HttpApiOptions.keys}. */
  readonly keys: IdempotencyKeys;
  /** See {@link HttpApiOptions.backend}. */
  readonly backend: NonNullable<IdempotentProducerOptions['backend']>;
  /** See {@link HttpApiOptions.connection}. */
  readonly connection: IdempotentProducerOptions['connection'];
  /** See {@link HttpApiOptions.prefix}. */
  readonly prefix: string;
  /** See {@link HttpApiOptions.queues}. */
  readonly queues: readonly string[];
  /** Token → tenant; empty means authentication is off. */
  readonly tokens: ReadonlyMap<string, string>;
  /** Admin token → operator name; empty means the inspector serves loopback only. */
  readonly adminTokens: ReadonlyMap<string, string>;
  /** See {@link HttpApiOptions.listener}; undefined: `Prefer: wait` is not applied. */
  readonly listener: KeySettledListener | undefined;
  /** See {@link HttpApiOptions.maxWaitSeconds}. */
  readonly maxWaitSeconds: number;
  /** See {@link HttpApiOptions.bodyLimitBytes}. */
  readonly bodyLimitBytes: number;
  /** See {@link HttpApiOptions.jobOptions}. */
  readonly jobOptions: NonNullable<IdempotentProducerOptions['defaultJobOptions']>;
  /** See {@link HttpApiOptions.relay}. */
  readonly relay: boolean;
  /** See {@link HttpApiOptions.relayPollIntervalMs}. */
  readonly relayPollIntervalMs: number;
  /** See {@link HttpApiOptions.logger}; undefined: pino at `LOG_LEVEL`, else `warn`. */
  readonly logger: Logger | undefined;
}

const optionsSchema = z.object({
  backend: z.enum(['redis', 'postgres']).default('redis'),
  prefix: z.string().min(1).optional(),
  queues: z.array(z.string().regex(QUEUE_PATTERN, 'queue names are 1–128 of A–Z a–z 0–9 _ . - (not starting with _ . -)')).min(1, 'at least one queue is needed'),
  maxWaitSeconds: z.number().int().min(0).max(3600).default(30),
  bodyLimitBytes: z.number().int().min(1).max(100 * 1024 * 1024).default(1_048_576),
  relay: z.boolean().default(true),
  relayPollIntervalMs: z.number().int().min(1).default(200),
});

const HTTP_API_OPTION_NAMES = optionNames<HttpApiOptions>()([
  'keys', 'backend', 'connection', 'prefix', 'queues', 'tokens', 'adminTokens', 'listener', 'maxWaitSeconds', 'bodyLimitBytes',
  'jobOptions', 'relay', 'relayPollIntervalMs', 'logger',
]);

/** Applies defaults and validates; throws a {@link ValidationError} naming the bad option. */
export function resolveHttpApiOptions(options: HttpApiOptions): ResolvedHttpApiOptions {
  refuseUnknownOptions(options, HTTP_API_OPTION_NAMES, 'createHttpApi(options)');
  if (!options?.keys) throw new ValidationError('INVALID_OPTIONS', 'keys', 'HttpApiOptions.keys is required: pass an IdempotencyKeys.');
  if (!options.connection) throw new ValidationError('INVALID_OPTIONS', 'connection', 'HttpApiOptions.connection is required: pass BullMQ connection options.');
  const parsed = optionsSchema.safeParse({
    backend: options.backend,
    prefix: options.prefix,
    queues: options.queues ? [...options.queues] : options.queues,
    maxWaitSeconds: options.maxWaitSeconds,
    bodyLimitBytes: options.bodyLimitBytes,
    relay: options.relay,
    relayPollIntervalMs: options.relayPollIntervalMs,
  });
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const field = issue.path.join('.');
    throw new ValidationError('INVALID_OPTIONS', field, `Invalid option ${field}: ${issue.message}`);
  }
  const tokens = checkTokens(Object.entries(options.tokens ?? {}), 'tokens', TENANTS);
  const adminTokens = checkTokens(Object.entries(options.adminTokens ?? {}), 'adminTokens', OPERATORS);
  assertTokensApart(tokens, adminTokens, 'adminTokens');
  return Object.freeze({
    ...parsed.data,
    prefix: parsed.data.prefix ?? (parsed.data.backend === 'postgres' ? 'bullmq' : 'bull'),
    queues: Object.freeze([...new Set(parsed.data.queues)]),
    keys: options.keys,
    connection: options.connection,
    tokens,
    adminTokens,
    listener: options.listener,
    jobOptions: options.jobOptions ?? { attempts: 3, backoff: { type: 'exponential', delay: 1000 } },
    logger: options.logger,
  });
}

/** What a token list maps tokens to: tenants or operators. */
export interface TokenNames {
  readonly noun: string;
  readonly pattern: RegExp;
  readonly rule: string;
}
/** Tenant tokens' names. */
export const TENANTS: TokenNames = { noun: 'tenant', pattern: TENANT_PATTERN, rule: '1–64 of A–Z a–z 0–9 _ . - (starting with a letter or digit; no ":")' };
/** Admin tokens' (operators') names. */
export const OPERATORS: TokenNames = { noun: 'operator', pattern: OPERATOR_PATTERN, rule: '1–64 of A–Z a–z 0–9 _ . @ - (starting with a letter or digit)' };

/**
 * Admin tokens open the key inspector, tenant tokens the job API: a token that did both would
 * give a tenant's client the operators' powers. Throws naming the entry by position, never the token.
 */
export function assertTokensApart(tenants: ReadonlyMap<string, string>, admins: ReadonlyMap<string, string>, field: string): void {
  [...admins.keys()].forEach((token, index) => {
    if (tenants.has(token)) {
      throw new ValidationError('INVALID_OPTIONS', field, `${field}: entry ${index + 1} is also a tenant token; admin tokens must differ from tenant tokens.`);
    }
  });
}

/** Checks token → name entries (length, characters, names, no repeats); throws a {@link ValidationError} naming the entry by position, never the token. */
export function checkTokens(entries: ReadonlyArray<readonly [string, string]>, field: string, names: TokenNames): ReadonlyMap<string, string> {
  const tokens = new Map<string, string>();
  entries.forEach(([token, tenant], index) => {
    const where = `${field}: entry ${index + 1}`;
    if (token.length < MIN_TOKEN_LENGTH || !/^[\x21-\x7e]+$/.test(token) || token.includes(',')) {
      throw new ValidationError(
        'INVALID_OPTIONS',
        field,
        `${where}: a token must be at least ${MIN_TOKEN_LENGTH} printable ASCII characters without spaces or commas.`,
      );
    }
    if (!names.pattern.test(tenant)) {
      throw new ValidationError('INVALID_OPTIONS', field, `${where}: ${names.noun} "${tenant}" is not ${names.rule}.`);
    }
    if (tokens.has(token)) throw new ValidationError('INVALID_OPTIONS', field, `${where}: the same token appears twice.`);
    tokens.set(token, tenant);
  });
  return tokens;
}

/** True for host names and addresses that only the local machine can reach. */
export function isLoopbackHost(host: string): boolean {
  const h = host.trim().toLowerCase().replace(/^\[|\]$/g, '');
  return h === 'localhost' || h === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h) || /^::ffff:127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h);
}

/**
 * Refuses an open server: without bearer tokens anyone who can connect is a tenant, so only
 * loopback is allowed. Throws a {@link ConfigError} saying what to do.
 */
export function assertBindAllowed(host: string, tokenCount: number): void {
  if (tokenCount === 0 && !isLoopbackHost(host)) {
    throw new ConfigError(
      `Refusing to listen on "${host}" without authentication: no bearer tokens are configured (HTTP_TOKENS), ` +
        'so anyone who can reach the port could enqueue jobs. Configure HTTP_TOKENS="token=tenant,…" or listen on 127.0.0.1.',
    );
  }
}
