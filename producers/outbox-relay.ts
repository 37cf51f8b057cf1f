/** The outbox relay process: moves committed outbox rows into BullMQ until SIGTERM/SIGINT. */
import { pino } from 'pino';
import { OutboxRelay, createPostgresDb, loadEnvConfig, migrate, onShutdownSignals } from '../src/index.js';

const config = loadEnvConfig();
const logger = pino({ level: config.LOG_LEVEL });
const db = createPostgresDb({ connectionString: config.DATABASE_URL, maxConnections: 2, applicationName: 'idempotent-jobs:relay' });
if (config.MIGRATE) await migrate(db, { schema: config.SCHEMA });
const relay = new OutboxRelay({ db, schema: config.SCHEMA, connection: { url: config.REDIS_URL }, prefix: config.REDIS_PREFIX, logger });
relay.start();
logger.info('outbox relay running');
onShutdownSignals(logger, async () => {
  await relay.stop();
  await db.destroy();
});
