/** The demo payments worker: env config → schema and demo tables → worker process (signals handled there). */
import { createPostgresDb, migrate } from '../src/index.js';
import { loadEnvConfig, runMain, startWorkerProcess } from '../src/process/index.js';
import { startTracingFromEnv } from '../src/otel/index.js';
import { SimulatedMailer, SimulatedPaymentProvider, createPaymentsTables, paymentHandler } from './payments/payments-domain.js';

await runMain(async () => {
  const config = loadEnvConfig();
  await startTracingFromEnv({ serviceName: `idempotent-jobs-worker-${config.QUEUE}` });
  const domainDb = createPostgresDb({ connectionString: config.DATABASE_URL, maxConnections: 4, applicationName: 'payments-provider' });
  await migrate(domainDb, { schema: config.SCHEMA });
  await createPaymentsTables(domainDb, config.SCHEMA);
  await startWorkerProcess({
    config: { ...config, MIGRATE: false },
    handler: paymentHandler(domainDb, new SimulatedPaymentProvider(domainDb, config.SCHEMA), new SimulatedMailer(domainDb, config.SCHEMA), config.SCHEMA),
  });
});
