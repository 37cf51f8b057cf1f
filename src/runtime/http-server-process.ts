import type { Kysely } from 'kysely';
import { pino, type Logger } from 'pino';
import { directDatabaseUrl, preparedStatementsOverDatabaseUrl } from './env-config.js';
import type { HttpEnvConfig } from './http-env-config.js';
import { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { onShutdownSignals } from './shutdown-signals.js';
import { waitForWritableStore } from './writable-store.js';
import { createPostgresDb } from '../store/create-postgres-db.js';
import { KeySettledListener } from '../store/key-settled-listener.js';
import { migrateSchema, type MigrateOptions } from '../store/migrate.js';
import { queueConnectionFromEnv } from './queue-connection-from-env.js';
import { createHttpApi, type HttpApi } from '../http/http-api.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** What {@link startHttpServerProcess} needs besides the environment. */
export interface HttpServerProcessOptions {
  /** The validated environment ({@link loadHttpEnvConfig}). */
  readonly config: HttpEnvConfig;
  /** Structured logger. @defaultValue `pino()` at `LOG_LEVEL` */
  readonly logger?: Logger;
  /** Install SIGTERM/SIGINT handlers that close gracefully and exit. @defaultValue `true` */
  readonly handleSignals?: boolean;
}

/** A running HTTP server process's parts. */
export interface HttpServerProcess {
  /** The API, listening. */
  readonly api: HttpApi;
  /** Base URL, e.g. `http://127.0.0.1:3000`. */
  readonly url: string;
  /** The process's logger. */
  readonly logger: Logger;
  /** Graceful stop: in-flight requests finish, then every connection closes. */
  stop(): Promise<void>;
}

/**
 * Builds and starts the HTTP ingestion server from validated configuration: the Postgres pool
 * (refused with a `ReadOnlyStoreError` when it reaches a standby or a read-only database),
 * migrations, the claim protocol, the LISTEN connection for `Prefer: wait`, the API (with its
 * outbox relay) and signal handling.
 */
export async function startHttpServerProcess(options: HttpServerProcessOptions): Promise<HttpServerProcess> {
  refuseUnknownOptions(options, optionNames<HttpServerProcessOptions>()(['config', 'logger', 'handleSignals']), 'startHttpServerProcess(options)');
  const { config } = options;
  const logger = options.logger ?? pino({ level: config.LOG_LEVEL });
  const db = createPostgresDb(
    {
      connectionString: config.DATABASE_URL,
      maxConnections: config.PG_POOL_SIZE ?? 10,
      applicationName: 'idempotent-jobs:http',
      preparedStatements: preparedStatementsOverDatabaseUrl(config),
    },
    (error) => logger.warn({ err: error }, 'idle Postgres connection failed; the pool replaces it'),
  );
  // LISTEN and the migrations' advisory lock need a session: Postgres itself (DATABASE_DIRECT_URL).
  const directUrl = directDatabaseUrl(config);
  const listener = new KeySettledListener({
    connectionString: directUrl,
    schema: config.SCHEMA,
    onError: (error) => logger.warn({ err: error }, 'listener error'),
  });
  const queues = queueConnectionFromEnv(config);
  let api: HttpApi | undefined;
  const closeAll = async () => {
    await api?.close();
    await queues.close();
    await listener.close();
    await db.destroy();
  };
  try {
    // A standby (a reader endpoint) or a read-only setting: refused before anything is claimed.
    await waitForWritableStore(db, { variable: 'DATABASE_URL', url: config.DATABASE_URL }, logger, Date.now() + config.STARTUP_WAIT_MS);
    if (config.MIGRATE) await migrateOver(directUrl === config.DATABASE_URL ? db : undefined, directUrl, { schema: config.SCHEMA, keysPartitions: config.KEYS_PARTITIONS });
    const keys = new IdempotencyKeys({ db, schema: config.SCHEMA, leaseMs: config.LEASE_MS, retentionMs: config.RETENTION_MS });
    api = await createHttpApi({
      keys,
      backend: queues.backend,
      connection: queues.connection,
      prefix: queues.prefix,
      queues: config.HTTP_QUEUES,
      tokens: Object.fromEntries(config.HTTP_TOKENS),
      adminTokens: Object.fromEntries(config.ADMIN_TOKENS),
      listener,
      maxWaitSeconds: config.HTTP_MAX_WAIT_SECONDS,
      bodyLimitBytes: config.HTTP_BODY_LIMIT_BYTES,
      jobOptions: { attempts: config.HTTP_JOB_ATTEMPTS, backoff: { type: 'exponential', delay: 1000 } },
      relay: config.HTTP_RELAY,
      logger,
    });
    const url = await api.listen({ host: config.HTTP_HOST, port: config.HTTP_PORT });
    logger.info({ url, queues: config.HTTP_QUEUES, tenants: [...new Set(config.HTTP_TOKENS.values())] }, 'HTTP API listening');
    let stopped: Promise<void> | undefined;
    const stop = () => (stopped ??= closeAll());
    if (options.handleSignals ?? true) onShutdownSignals(logger, stop);
    return { api, url, logger, stop };
  } catch (error) {
    await closeAll().catch(() => {});
    throw error;
  }
}

/** Runs the migrations over `db`, or over a connection of its own to `connectionString`, closed after. */
async function migrateOver(db: Kysely<any> | undefined, connectionString: string, options: MigrateOptions): Promise<void> {
  if (db) {
    await migrateSchema(db, options);
    return;
  }
  const direct = createPostgresDb({ connectionString, maxConnections: 1, applicationName: 'idempotent-jobs:http' }, () => {});
  try {
    await migrateSchema(direct, options);
  } finally {
    await direct.destroy();
  }
}
