import type { Logger } from 'pino';
import { z } from 'zod';
import type { IdempotentProducerOptions } from '../bullmq/idempotent-producer.js';
import { ConfigError, ValidationError } from '../errors.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import type { KeySettledListener } from '../store/key-settled-listener.js';
import { loadEnvConfig, type EnvConfig } from './env-config.js';

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
const QUEUE_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;
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
  /** BullMQ connection (for reading job states and, in the relay, adding jobs). */
  readonly connection: IdempotentProducerOptions['connection'];
  /** BullMQ key prefix. @defaultValue `'bull'` */
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
  /** Structured logger; every request's lines carry its `reqId`. @defaultValue `pino()` at level info */
  readonly logger?: Logger;
}

/** {@link HttpApiOptions} with defaults applied and every value checked. */
export interface ResolvedHttpApiOptions {
  /** See {@link HttpApiOptions.keys}. */
  readonly keys: IdempotencyKeys;
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
  /** See {@link HttpApiOptions.logger}; undefined: `pino()` at level info. */
  readonly logger: Logger | undefined;
}

const optionsSchema = z.object({
  prefix: z.string().min(1).default('bull'),
  queues: z.array(z.string().regex(QUEUE_PATTERN, 'queue names are 1–128 of A–Z a–z 0–9 _ . - (not starting with _ . -)')).min(1, 'at least one queue is needed'),
  maxWaitSeconds: z.number().int().min(0).max(3600).default(30),
  bodyLimitBytes: z.number().int().min(1).max(100 * 1024 * 1024).default(1_048_576),
  relay: z.boolean().default(true),
  relayPollIntervalMs: z.number().int().min(1).default(200),
});

/** Applies defaults and validates; throws a {@link ValidationError} naming the bad option. */
export function resolveHttpApiOptions(options: HttpApiOptions): ResolvedHttpApiOptions {
  if (!options?.keys) throw new ValidationError('INVALID_OPTIONS', 'keys', 'HttpApiOptions.keys is required: pass an IdempotencyKeys.');
  if (!options.connection) throw new ValidationError('INVALID_OPTIONS', 'connection', 'HttpApiOptions.connection is required: pass BullMQ connection options.');
  const parsed = optionsSchema.safeParse({
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

/**
 * Parses `HTTP_TOKENS`: `token1=tenantA,token2=tenantB` (whitespace around entries ignored).
 * Several tokens may map to one tenant (for rotation). Throws a {@link ConfigError} naming the
 * bad entry by position (never echoing a token).
 */
export function parseTokens(text: string | undefined): ReadonlyMap<string, string> {
  return parseTokenList(text, 'HTTP_TOKENS', TENANTS);
}

/**
 * Parses `ADMIN_TOKENS`: `token1=alice,token2=bob`, the key inspector's operators (see
 * {@link HttpApiOptions.adminTokens}). Same form and rules as `HTTP_TOKENS`; names are 1–64 of
 * A–Z a–z 0–9 _ . @ -.
 */
export function parseAdminTokens(text: string | undefined): ReadonlyMap<string, string> {
  return parseTokenList(text, 'ADMIN_TOKENS', OPERATORS);
}

/** What a token list maps tokens to: tenants or operators. */
interface TokenNames {
  readonly noun: string;
  readonly pattern: RegExp;
  readonly rule: string;
}
const TENANTS: TokenNames = { noun: 'tenant', pattern: TENANT_PATTERN, rule: '1–64 of A–Z a–z 0–9 _ . - (starting with a letter or digit; no ":")' };
const OPERATORS: TokenNames = { noun: 'operator', pattern: OPERATOR_PATTERN, rule: '1–64 of A–Z a–z 0–9 _ . @ - (starting with a letter or digit)' };

function parseTokenList(text: string | undefined, variable: string, names: TokenNames): ReadonlyMap<string, string> {
  if (text === undefined || text.trim() === '') return new Map();
  const entries = text.split(',').map((entry, index) => {
    const trimmed = entry.trim();
    const at = trimmed.indexOf('=');
    if (at <= 0) {
      throw new ConfigError(`${variable}: entry ${index + 1} is not "token=${names.noun}" (expected e.g. "s3cr3t-token-acme-0001=acme,…").`);
    }
    return [trimmed.slice(0, at), trimmed.slice(at + 1)] as [string, string];
  });
  try {
    return checkTokens(entries, variable, names);
  } catch (error) {
    throw new ConfigError((error as Error).message);
  }
}

/**
 * Admin tokens open the key inspector, tenant tokens the job API: a token that did both would
 * give a tenant's client the operators' powers. Throws naming the entry by position, never the token.
 */
function assertTokensApart(tenants: ReadonlyMap<string, string>, admins: ReadonlyMap<string, string>, field: string): void {
  [...admins.keys()].forEach((token, index) => {
    if (tenants.has(token)) {
      throw new ValidationError('INVALID_OPTIONS', field, `${field}: entry ${index + 1} is also a tenant token; admin tokens must differ from tenant tokens.`);
    }
  });
}

function checkTokens(entries: ReadonlyArray<readonly [string, string]>, field: string, names: TokenNames): ReadonlyMap<string, string> {
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

const int = (min: number, max = Number.MAX_SAFE_INTEGER) => z.coerce.number().int().min(min).max(max);
const bool = z
  .enum(['true', 'false', '1', '0', 'yes', 'no'])
  .transform((v) => v === 'true' || v === '1' || v === 'yes');

const httpEnvSchema = z.object({
  HTTP_HOST: z.string().min(1).default('127.0.0.1'),
  HTTP_PORT: int(0, 65_535).default(3000),
  /** Comma-separated queue names; defaults to QUEUE. */
  HTTP_QUEUES: z.string().optional(),
  HTTP_MAX_WAIT_SECONDS: int(0, 3600).default(30),
  HTTP_BODY_LIMIT_BYTES: int(1).default(1_048_576),
  HTTP_JOB_ATTEMPTS: int(1).default(3),
  HTTP_RELAY: bool.default(true),
});

/**
 * The names of the variables {@link loadHttpEnvConfig} reads beyond `ENV_VARIABLES` (env-config.ts):
 * the schema's, and the two token lists parsed on their own.
 */
export const HTTP_ENV_VARIABLES: readonly string[] = Object.freeze([...Object.keys(httpEnvSchema.shape), 'HTTP_TOKENS', 'ADMIN_TOKENS']);

/** The HTTP server process's configuration: the common variables plus the `HTTP_*` ones. */
export interface HttpEnvConfig extends EnvConfig {
  /** Address to listen on; anything but loopback needs `HTTP_TOKENS`. @defaultValue `'127.0.0.1'` */
  readonly HTTP_HOST: string;
  /** Port to listen on; 0 picks a free one. @defaultValue `3000` */
  readonly HTTP_PORT: number;
  /** Queues accepting jobs, from the comma-separated `HTTP_QUEUES`; others are answered 404. @defaultValue `[QUEUE]` */
  readonly HTTP_QUEUES: readonly string[];
  /** Token → tenant, from `HTTP_TOKENS`. */
  readonly HTTP_TOKENS: ReadonlyMap<string, string>;
  /** Admin token → operator name, from `ADMIN_TOKENS` (the key inspector at `/ui`). */
  readonly ADMIN_TOKENS: ReadonlyMap<string, string>;
  /** Cap of `Prefer: wait`, in seconds; 0 disables waiting. @defaultValue `30` */
  readonly HTTP_MAX_WAIT_SECONDS: number;
  /** Largest request body, in bytes (413 above). @defaultValue `1_048_576` */
  readonly HTTP_BODY_LIMIT_BYTES: number;
  /** BullMQ attempts per job (exponential backoff from 1 s). @defaultValue `3` */
  readonly HTTP_JOB_ATTEMPTS: number;
  /** Run the outbox relay inside the server. @defaultValue `true` */
  readonly HTTP_RELAY: boolean;
}

/**
 * Reads and validates the HTTP server's environment (see docs/configuration.md). Throws a
 * {@link ConfigError} naming each wrong variable, and refuses a non-loopback `HTTP_HOST`
 * without `HTTP_TOKENS`.
 */
export function loadHttpEnvConfig(env: NodeJS.ProcessEnv = process.env): HttpEnvConfig {
  const base = loadEnvConfig(env);
  const present = Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined && v !== ''));
  const parsed = httpEnvSchema.safeParse(present);
  if (!parsed.success) {
    const problems = parsed.error.issues.map((issue) => {
      const name = String(issue.path[0]);
      return `  ${name}: ${issue.message} (got ${JSON.stringify(env[name])})`;
    });
    throw new ConfigError(`Invalid configuration:\n${problems.join('\n')}`);
  }
  const queues = (parsed.data.HTTP_QUEUES ?? base.QUEUE).split(',').map((q) => q.trim()).filter((q) => q !== '');
  const bad = queues.find((q) => !QUEUE_PATTERN.test(q));
  if (queues.length === 0 || bad !== undefined) {
    throw new ConfigError(`Invalid configuration:\n  HTTP_QUEUES: ${bad === undefined ? 'no queue named' : `"${bad}" is not a valid queue name`} (got ${JSON.stringify(env.HTTP_QUEUES)})`);
  }
  const tokens = parseTokens(env.HTTP_TOKENS);
  const adminTokens = parseAdminTokens(env.ADMIN_TOKENS);
  try {
    assertTokensApart(tokens, adminTokens, 'ADMIN_TOKENS');
  } catch (error) {
    throw new ConfigError((error as Error).message);
  }
  assertBindAllowed(parsed.data.HTTP_HOST, tokens.size);
  return { ...base, ...parsed.data, HTTP_QUEUES: queues, HTTP_TOKENS: tokens, ADMIN_TOKENS: adminTokens };
}
