/** The demo payments worker: env config → schema and demo tables → worker process (signals handled there). */
import { createPostgresDb, loadEnvConfig, migrate, startWorkerProcess } from '../src/index.js';
import { SimulatedPaymentProvider, chargeHandler, createPaymentsTables } from './payments/payments-domain.js';

const config = loadEnvConfig();
const domainDb = createPostgresDb({ connectionString: config.DATABASE_URL, maxConnections: 4, applicationName: 'payments-provider' });
await migrate(domainDb, { schema: config.SCHEMA });
await createPaymentsTables(domainDb, config.SCHEMA);
await startWorkerProcess({
  config: { ...config, MIGRATE: false },
  handler: chargeHandler(new SimulatedPaymentProvider(domainDb, config.SCHEMA), config.SCHEMA),
});
