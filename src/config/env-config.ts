import { z } from 'zod';
import { ConfigError } from '../errors.js';

const int = (min: number) => z.coerce.number().int().min(min);
const bool = z
  .enum(['true', 'false', '1', '0', 'yes', 'no'])
  .transform((v) => v === 'true' || v === '1' || v === 'yes');

/**
 * Environment variables read by the runnable processes. Each is documented in the README's
 * configuration table; names and defaults here are the source of truth.
 */
const envSchema = z.object({
  DATABASE_URL: z.string().url('must be a postgres:// URL').default('postgres://postgres@127.0.0.1:5432/postgres'),
  REDIS_URL: z.string().url('must be a redis:// URL').default('redis://127.0.0.1:6379'),
  /** Postgres schema of the idempotency tables. */
  SCHEMA: z.string().regex(/^[a-z_][a-z0-9_]{0,62}$/, 'must be a lower-case Postgres identifier').default('idempotent_jobs'),
  /** BullMQ key prefix. */
  REDIS_PREFIX: z.string().min(1).default('bull'),
  QUEUE: z.string().min(1).default('payments'),
  CONCURRENCY: int(1).default(8),
  LEASE_MS: int(100).default(30_000),
  HEARTBEAT_MS: int(10).optional(),
  LOCK_DURATION_MS: int(100).optional(),
  STALLED_INTERVAL_MS: int(100).optional(),
  DEFER_MAX_MS: int(1).optional(),
  WAIT_MS: int(0).default(0),
  SHUTDOWN_TIMEOUT_MS: int(0).default(30_000),
  RETENTION_MS: int(1).default(86_400_000),
  FAST_PATH: bool.default(false),
  STORE_PAYLOAD: bool.default(false),
  PG_POOL_SIZE: int(1).optional(),
  METRICS_PORT: int(1).max(65_535).optional(),
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  /** Run migrations at start (safe with many processes). */
  MIGRATE: bool.default(true),
});

/** The validated process configuration. */
export type EnvConfig = z.infer<typeof envSchema>;

/**
 * Reads and validates the environment. Throws a {@link ConfigError} that names each wrong
 * variable and why, e.g. `CONCURRENCY: Too small: expected number to be >=1 (got "0")`.
 */
export function loadEnvConfig(env: NodeJS.ProcessEnv = process.env): EnvConfig {
  const present = Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined && v !== ''));
  const parsed = envSchema.safeParse(present);
  if (parsed.success) return parsed.data;
  const problems = parsed.error.issues.map((issue) => {
    const name = String(issue.path[0]);
    return `  ${name}: ${issue.message} (got ${JSON.stringify(env[name])})`;
  });
  throw new ConfigError(`Invalid configuration:\n${problems.join('\n')}`);
}
