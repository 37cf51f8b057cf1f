import type { Logger } from 'pino';
import { directDatabaseUrl, groupCommitFromEnv, type EnvConfig } from '../config/env-config.js';
import { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { createPostgresDb } from '../store/create-postgres-db.js';
import { migrate } from '../store/migrate.js';
import { pingDatabase } from '../store/sql/ping.js';
import { waitForStore } from './wait-for-store.js';

/** The Postgres side of a consumer process, opened from the environment. */
export interface KeyStoreFromEnv {
  readonly keys: IdempotencyKeys;
  /** Closes the pools. */
  destroy(): Promise<void>;
}

/**
 * Opens what every broker consumer process needs from Postgres, the way the BullMQ worker
 * process does: the pool (`PG_POOL_SIZE`, or the concurrency plus two), migrations with the
 * keys table's layout (`KEYS_PARTITIONS`) over `DATABASE_DIRECT_URL` (they hold a session
 * advisory lock, which a transaction-mode pooler cannot), waited for up to `STARTUP_WAIT_MS`,
 * and the claim protocol with the lease, retention and group commit settings.
 */
export async function openKeyStoreFromEnv(config: EnvConfig, options: { logger: Logger; applicationName: string; concurrency: number }): Promise<KeyStoreFromEnv> {
  const onPoolError = (error: Error) => options.logger.warn({ err: error }, 'idle Postgres connection failed; the pool replaces it');
  const poolSize = config.PG_POOL_SIZE ?? options.concurrency + 2;
  const db = createPostgresDb({ connectionString: config.DATABASE_URL, maxConnections: poolSize, applicationName: options.applicationName }, onPoolError);
  const directUrl = directDatabaseUrl(config);
  try {
    await waitForStore<unknown>(
      () => (config.MIGRATE ? migrateOver(directUrl, config, options.applicationName, onPoolError) : pingDatabase(db)),
      { what: 'Postgres', deadline: Date.now() + config.STARTUP_WAIT_MS, logger: options.logger },
    );
  } catch (error) {
    await db.destroy();
    throw error;
  }
  const keys = new IdempotencyKeys({
    db,
    schema: config.SCHEMA,
    leaseMs: config.LEASE_MS,
    retentionMs: config.RETENTION_MS,
    groupCommit: groupCommitFromEnv(config),
  });
  return { keys, destroy: () => db.destroy() };
}

/** Migrates over a session of its own on Postgres itself, closed after. */
async function migrateOver(directUrl: string, config: EnvConfig, applicationName: string, onPoolError: (error: Error) => void): Promise<void> {
  const sessionDb = createPostgresDb({ connectionString: directUrl, maxConnections: 1, applicationName }, onPoolError);
  try {
    await migrate(sessionDb, { schema: config.SCHEMA, keysPartitions: config.KEYS_PARTITIONS });
  } finally {
    await sessionDb.destroy();
  }
}

/** The runner's timing and path settings from the environment, the same for every consumer. */
export function runnerSettingsFromEnv(config: EnvConfig) {
  return {
    leaseMs: config.LEASE_MS,
    heartbeatMs: config.HEARTBEAT_MS,
    deferMaxMs: config.DEFER_MAX_MS,
    shutdownTimeoutMs: config.SHUTDOWN_TIMEOUT_MS,
    storeRetryMinMs: config.STORE_RETRY_MIN_MS,
    storeRetryMaxMs: config.STORE_RETRY_MAX_MS,
    fastPath: config.FAST_PATH,
    storePayload: config.STORE_PAYLOAD,
  } as const;
}
