/**
 * The standalone maintenance process: the janitor (expired keys, old outbox rows) and the
 * sweeper (lost jobs), for deployments that run them apart from the workers. Configured by
 * the environment (docs/configuration.md); /metrics and /healthz on METRICS_PORT when set.
 * Safe beside workers that run maintenance too: one process at a time runs each task.
 *
 *   node --import tsx workers/janitor.ts
 */
import { loadEnvConfig, runMain, startMaintenanceProcess } from '../src/process/index.js';
import { startTracingFromEnv } from '../src/otel/index.js';

await runMain(async () => {
  await startTracingFromEnv({ serviceName: 'idempotent-jobs-maintenance' });
  await startMaintenanceProcess({ config: loadEnvConfig() });
});
