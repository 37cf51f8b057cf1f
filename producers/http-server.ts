/**
 * The HTTP ingestion server: other services enqueue jobs over HTTP with Idempotency-Key
 * semantics. Configuration: the environment (see docs/configuration.md). SIGTERM/SIGINT:
 * in-flight requests finish, then it exits.
 */
import { loadHttpEnvConfig, runMain, startHttpServerProcess } from '../src/process/index.js';
import { startTracingFromEnv } from '../src/otel/index.js';

await runMain(async () => {
  await startTracingFromEnv({ serviceName: 'idempotent-jobs-http' });
  await startHttpServerProcess({ config: loadHttpEnvConfig() });
});
