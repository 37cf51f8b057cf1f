import type { Kysely } from 'kysely';
import type { Logger } from 'pino';
import { directDatabaseUrl, groupCommitFromEnv, preparedStatementsOverDatabaseUrl, type EnvConfig } from './env-config.js';
import { ReadOnlyStoreError } from '../errors.js';
import { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { createPostgresDb } from '../store/create-postgres-db.js';
import { migrateSchema } from '../store/migrate.js';
import { PostgresOperatorStore } from '../store/operator-store.js';
import { CLOSE_AFTER_FAILED_START_MS, closeWithin } from './close-within.js';
import { explainDatabaseError, notMigratedError } from './database-problems.js';
import { StoreUnreachableAtStartError, waitForStore } from './wait-for-store.js';
import { checkWritableStore, startFailure, worthWaitingAtStart } from './writable-store.js';

/** The Postgres side of a worker or consumer process, opened from the environment. */
export interface KeyStoreFromEnv {
  readonly keys: IdempotencyKeys;
  /** The pool on `DATABASE_URL` that claims and effects run on. */
  readonly db: Kysely<any>;
  /**
   * Sessions on Postgres itself (`DATABASE_DIRECT_URL`) for what holds a session advisory lock:
   * migrations and maintenance. The same pool as {@link db} when `DATABASE_DIRECT_URL` is unset.
   */
  readonly sessionDb: Kysely<any>;
  /** Where a part that needs a connection of its own connects (the listener's LISTEN): `DATABASE_DIRECT_URL`, else `DATABASE_URL`. */
  readonly directUrl: string;
  /** Closes both pools. */
  destroy(): Promise<void>;
}

/** What {@link openKeyStoreFromEnv} needs besides the environment. */
export interface KeyStoreFromEnvOptions {
  readonly logger: Logger;
  /** Shown in `pg_stat_activity.application_name`, e.g. `idempotent-jobs:worker:payments`. */
  readonly applicationName: string;
  /** Jobs run at once: the pool holds this many connections plus two, unless `PG_POOL_SIZE` is set. */
  readonly concurrency: number;
  /**
   * When the start stops waiting for Postgres, in `Date.now()` time: a process that waits for
   * other servers after Postgres shares one deadline between them.
   * @defaultValue now + `STARTUP_WAIT_MS`
   */
  readonly startupDeadline?: number;
}

/**
 * Opens what every worker and consumer process needs from Postgres: the pool (`PG_POOL_SIZE`,
 * or the concurrency plus two), a small session pool over `DATABASE_DIRECT_URL` for migrations
 * and maintenance (they hold session advisory locks, which a transaction-mode pooler cannot),
 * the check that each takes writes (a read-only setting is refused with a `ReadOnlyStoreError`
 * at once, a standby at the deadline, as it may be a failover's demoted primary; commits
 * acknowledged without a synchronous standby are warned about),
 * migrations with the keys table's layout (`KEYS_PARTITIONS`) when `MIGRATE`, else a ping of
 * each pool, and the claim protocol with the lease, retention and group commit settings.
 * Postgres down at start (refused, starting up, …) is waited for, with a warning per try, until
 * the start's deadline; then it rejects with a `StoreUnreachableAtStartError` having closed
 * the pools (waiting at most {@link CLOSE_AFTER_FAILED_START_MS} for them). Other errors reject
 * at once, the pools closed the same way: a wrong password or a missing database as a
 * `ConfigError` naming the variable and the next step (`createdb …`), as is a schema without
 * the tables when `MIGRATE` is off (`idempotent-jobs migrate`).
 */
export async function openKeyStoreFromEnv(config: EnvConfig, options: KeyStoreFromEnvOptions): Promise<KeyStoreFromEnv> {
  const { logger, applicationName } = options;
  const onPoolError = (error: Error) => logger.warn({ err: error }, 'idle Postgres connection failed; the pool replaces it');
  const db = createPostgresDb(
    {
      connectionString: config.DATABASE_URL,
      maxConnections: config.PG_POOL_SIZE ?? options.concurrency + 2,
      applicationName,
      preparedStatements: preparedStatementsOverDatabaseUrl(config),
    },
    onPoolError,
  );
  // Idle connections close after node-postgres's 10 s: between maintenance runs it holds none.
  const directUrl = directDatabaseUrl(config);
  const sessionDb =
    directUrl === config.DATABASE_URL ? db : createPostgresDb({ connectionString: directUrl, maxConnections: SESSION_POOL_SIZE, applicationName }, onPoolError);
  const destroy = async () => {
    await Promise.all([db.destroy(), sessionDb === db ? undefined : sessionDb.destroy()]);
  };
  try {
    // Without migrations a ping stands in for them: the process is not "ready" before Postgres is.
    await waitForStore<unknown>(
      async () => {
        // A standby (a reader endpoint) or a read-only setting: refused before anything is claimed
        // (a standby only at the deadline: during a failover the URL may reach the demoted primary).
        await checkWritableStore(db, { variable: 'DATABASE_URL', url: config.DATABASE_URL }, logger);
        if (sessionDb !== db) await checkWritableStore(sessionDb, { variable: 'DATABASE_DIRECT_URL', url: directUrl }, logger);
        if (config.MIGRATE) await migrateSchema(sessionDb, { schema: config.SCHEMA, keysPartitions: config.KEYS_PARTITIONS });
      },
      {
        what: `Postgres (${config.MIGRATE ? 'migrations' : 'first connection'})`,
        deadline: options.startupDeadline ?? Date.now() + config.STARTUP_WAIT_MS,
        logger,
        retryable: worthWaitingAtStart,
      },
    ).catch((unwrapped: unknown) => {
      const error = startFailure(unwrapped);
      if (error instanceof StoreUnreachableAtStartError || error instanceof ReadOnlyStoreError) throw error;
      // A database that does not exist, a login refused: say which variable, and what to do.
      throw explainDatabaseError(error, {
        variable: config.MIGRATE && directUrl !== config.DATABASE_URL ? 'DATABASE_DIRECT_URL' : 'DATABASE_URL',
        url: config.MIGRATE ? directUrl : config.DATABASE_URL,
        schema: config.SCHEMA,
      });
    });
    // Not migrating: the schema must have been migrated already, or the first claim would fail.
    if (!config.MIGRATE && !(await new PostgresOperatorStore(db, config.SCHEMA).tableLayout()).exists) {
      throw notMigratedError({ variable: 'DATABASE_URL', url: config.DATABASE_URL, schema: config.SCHEMA });
    }
    const keys = new IdempotencyKeys({
      db,
      schema: config.SCHEMA,
      leaseMs: config.LEASE_MS,
      retentionMs: config.RETENTION_MS,
      maxJobRetentionMs: config.MAX_JOB_RETENTION_MS,
      maxJobTombstoneMs: config.MAX_JOB_TOMBSTONE_MS,
      groupCommit: groupCommitFromEnv(config),
    });
    return { keys, db, sessionDb, directUrl, destroy };
  } catch (error) {
    await closeWithin(CLOSE_AFTER_FAILED_START_MS, destroy());
    throw error;
  }
}

/**
 * The runner's timing and path settings from the environment, the same for the BullMQ worker
 * and every broker consumer; `fastPath` given by the caller overrides `FAST_PATH`.
 */
export function runnerSettingsFromEnv(config: EnvConfig, overrides: { readonly fastPath?: boolean } = {}) {
  return {
    leaseMs: config.LEASE_MS,
    heartbeatMs: config.HEARTBEAT_MS,
    deferMaxMs: config.DEFER_MAX_MS,
    concurrencyStarvationMs: config.CONCURRENCY_STARVATION_MS,
    concurrencySlotReuseMs: config.CONCURRENCY_SLOT_REUSE_MS,
    shutdownTimeoutMs: config.SHUTDOWN_TIMEOUT_MS,
    storeRetryMinMs: config.STORE_RETRY_MIN_MS,
    storeRetryMaxMs: config.STORE_RETRY_MAX_MS,
    storeRetryWindowMs: config.STORE_RETRY_WINDOW_MS,
    // Unset (no override, no FAST_PATH): the runner chooses by the handler's kind.
    fastPath: overrides.fastPath ?? config.FAST_PATH,
    storePayload: config.STORE_PAYLOAD,
  } as const;
}

/**
 * Connections to Postgres itself when `DATABASE_DIRECT_URL` is set: one per maintenance task
 * (janitor, sweeper, statistics), each held for one run.
 */
const SESSION_POOL_SIZE = 3;
