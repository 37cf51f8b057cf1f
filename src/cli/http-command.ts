import type { Command } from 'commander';
import { loadHttpEnvConfig } from '../runtime/http-env-config.js';
import { startHttpServerProcess } from '../runtime/http-server-process.js';
import { startTracingFromEnv } from '../otel/start-tracing.js';

/** `http`: the HTTP ingestion API, with the key inspector at /ui/ for HTTP_ADMIN_TOKENS, until SIGTERM/SIGINT. */
export function registerHttpCommand(program: Command): void {
  program
    .command('http')
    .description('serve the HTTP API (Idempotency-Key ingestion) and the key inspector at /ui/, configured by the environment (HTTP_TOKENS, HTTP_QUEUES, HTTP_PORT, …)')
    .action(async () => {
      const config = loadHttpEnvConfig();
      await startTracingFromEnv({ serviceName: 'idempotent-jobs-http' });
      await startHttpServerProcess({ config });
    });
}
