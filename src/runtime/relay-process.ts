import { pino, type Logger } from 'pino';
import { OutboxRelay } from '../bullmq/outbox-relay.js';
import { queueConnectionFromEnv } from './queue-connection-from-env.js';
import { preparedStatementsOverDatabaseUrl, type EnvConfig } from './env-config.js';
import { createPostgresDb } from '../store/create-postgres-db.js';
import { migrateSchema } from '../store/migrate.js';
import { waitForWritableStore } from './writable-store.js';
import { onShutdownSignals } from './shutdown-signals.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** What {@link startOutboxRelayProcess} needs. */
export interface OutboxRelayProcessOptions {
  /** The validated environment ({@link loadEnvConfig}). */
  readonly config: EnvConfig;
  /** Structured logger. @defaultValue `pino()` at `LOG_LEVEL` */
  readonly logger?: Logger;
  /** Install SIGTERM/SIGINT handlers that stop and exit. @defaultValue `true` */
  readonly handleSignals?: boolean;
}

/** A running outbox relay process. */
export interface OutboxRelayProcess {
  /** The relay, moving committed outbox rows into BullMQ. */
  readonly relay: OutboxRelay;
  /** The process's logger. */
  readonly logger: Logger;
  /** Stops the relay (its batch in progress finishes), then closes Redis and the pool. */
  stop(): Promise<void>;
}

/**
 * The standalone outbox relay (`idempotent-jobs relay`): moves rows that producers wrote with
 * `producer.enqueue(job, { tx })` into BullMQ once their transaction has committed, for
 * deployments whose HTTP API does not run one (`HTTP_RELAY=false`) or that enqueue through the
 * outbox without it. Refuses a standby or a read-only database (`ReadOnlyStoreError`), then
 * migrates `SCHEMA` when `MIGRATE` is on. An idle connection that
 * breaks (a server restart, a terminated backend) is only logged: the pool replaces it at the
 * next batch.
 */
export async function startOutboxRelayProcess(options: OutboxRelayProcessOptions): Promise<OutboxRelayProcess> {
  refuseUnknownOptions(options, optionNames<OutboxRelayProcessOptions>()(['config', 'logger', 'handleSignals']), 'startOutboxRelayProcess(options)');
  const { config } = options;
  const logger = options.logger ?? pino({ level: config.LOG_LEVEL });
  const db = createPostgresDb(
    { connectionString: config.DATABASE_URL, maxConnections: 2, applicationName: 'idempotent-jobs:relay', preparedStatements: preparedStatementsOverDatabaseUrl(config) },
    (error) => logger.warn({ err: error }, 'idle Postgres connection lost; the relay reconnects at its next batch'),
  );
  try {
    // The relay deletes what it sent: on a standby it could move nothing.
    await waitForWritableStore(db, { variable: 'DATABASE_URL', url: config.DATABASE_URL }, logger, Date.now() + config.STARTUP_WAIT_MS);
    if (config.MIGRATE) await migrateSchema(db, { schema: config.SCHEMA });
  } catch (error) {
    await db.destroy();
    throw error;
  }
  const queues = queueConnectionFromEnv(config);
  const relay = new OutboxRelay({ db, schema: config.SCHEMA, backend: queues.backend, connection: queues.connection, prefix: queues.prefix, logger });
  relay.start();
  logger.info({ schema: config.SCHEMA }, 'outbox relay running');
  let stopped: Promise<void> | undefined;
  const stop = () =>
    (stopped ??= (async () => {
      await relay.stop();
      await queues.close();
      await db.destroy();
    })());
  if (options.handleSignals ?? true) onShutdownSignals(logger, stop);
  return { relay, logger, stop };
}
