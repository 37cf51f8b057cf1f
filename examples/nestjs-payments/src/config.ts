/** The application's settings, from the environment (the repository's examples share these names). */
export const config = {
  databaseUrl: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres',
  redisUrl: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379',
  schema: process.env.SCHEMA ?? 'idempotent_jobs',
  redisPrefix: process.env.REDIS_PREFIX ?? 'bull',
  port: Number(process.env.PORT ?? 3000),
  /** Where the key inspector runs (`npx idempotent-jobs http`): each job's link in Bull Board goes there. */
  inspectorUrl: process.env.INSPECTOR_URL ?? 'http://127.0.0.1:8080/ui/',
  /** How long the simulated card gateway takes to answer. */
  gatewayDelayMs: Number(process.env.GATEWAY_DELAY_MS ?? 50),
  concurrency: Number(process.env.CONCURRENCY ?? 4),
  leaseMs: Number(process.env.LEASE_MS ?? 30_000),
  shutdownTimeoutMs: Number(process.env.SHUTDOWN_TIMEOUT_MS ?? 10_000),
};
