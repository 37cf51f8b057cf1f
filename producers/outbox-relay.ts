/** The outbox relay process: moves committed outbox rows into BullMQ until SIGTERM/SIGINT. */
import { pino } from 'pino';
import { OutboxRelay, createPostgresDb, loadEnvConfig, migrate, onShutdownSignals, openRedisConnection, runMain } from '../src/index.js';
import { startTracingFromEnv } from '../src/otel/index.js';

const config = await runMain(async () => {
  const loaded = loadEnvConfig();
  await startTracingFromEnv({ serviceName: 'idempotent-jobs-relay' });
  return loaded;
});
const logger = pino({ level: config.LOG_LEVEL });
// An idle connection that breaks (server restart, terminated backend) is dropped by the pool and
// replaced on the next batch; it is only logged.
const db = createPostgresDb({ connectionString: config.DATABASE_URL, maxConnections: 2, applicationName: 'idempotent-jobs:relay' }, (error) =>
  logger.warn({ err: error }, 'idle Postgres connection lost; the relay reconnects at its next batch'),
);
if (config.MIGRATE) await migrate(db, { schema: config.SCHEMA });
const redis = openRedisConnection({ url: config.REDIS_URL, clusterNodes: config.REDIS_CLUSTER_NODES });
const relay = new OutboxRelay({ db, schema: config.SCHEMA, connection: redis.connection, prefix: config.REDIS_PREFIX, logger });
relay.start();
logger.info('outbox relay running');
onShutdownSignals(logger, async () => {
  await relay.stop();
  await redis.close();
  await db.destroy();
});
