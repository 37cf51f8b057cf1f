/** The outbox relay process: moves committed outbox rows into BullMQ until SIGTERM/SIGINT. */
import { loadEnvConfig, runMain, startOutboxRelayProcess } from '../src/process/index.js';
import { startTracingFromEnv } from '../src/otel/index.js';

await runMain(async () => {
  const config = loadEnvConfig();
  await startTracingFromEnv({ serviceName: 'idempotent-jobs-relay' });
  await startOutboxRelayProcess({ config });
});
