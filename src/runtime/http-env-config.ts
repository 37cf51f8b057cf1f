import { z } from 'zod';
import { ConfigError } from '../errors.js';
import { OPERATORS, QUEUE_PATTERN, TENANTS, assertBindAllowed, assertTokensApart, checkTokens, type TokenNames } from '../http/http-options.js';
import { loadEnvConfig, type EnvConfig } from './env-config.js';

// The HTTP server process's environment: the common variables (env-config.ts) plus the `HTTP_*`
// ones and the two token lists. The options they become are the HTTP API's (http/http-options.ts).

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
 * `HttpApiOptions.adminTokens`). Same form and rules as `HTTP_TOKENS`; names are 1–64 of
 * A–Z a–z 0–9 _ . @ -.
 */
export function parseAdminTokens(text: string | undefined): ReadonlyMap<string, string> {
  return parseTokenList(text, 'ADMIN_TOKENS', OPERATORS);
}

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
