import type { Command } from 'commander';

/** `http`: the HTTP ingestion API, with the key inspector at /ui/ for HTTP_ADMIN_TOKENS, until SIGTERM/SIGINT. */
export function registerHttpCommand(program: Command): void {
  program
    .command('http')
    .description('serve the HTTP API (Idempotency-Key ingestion) and the key inspector at /ui/, configured by the environment (HTTP_TOKENS, HTTP_QUEUES, HTTP_PORT, …)')
    .action(async () => {
      // Loaded when the command runs (as every long-running command's process): the other
      // commands, and --help, start without Fastify, BullMQ and OpenTelemetry.
      const [{ loadHttpEnvConfig }, { startHttpServerProcess }, { startTracingFromEnv }] = await Promise.all([
        import('../runtime/http-env-config.js'),
        import('../runtime/http-server-process.js'),
        import('../otel/start-tracing.js'),
      ]);
      const config = loadHttpEnvConfig();
      await startTracingFromEnv({ serviceName: 'idempotent-jobs-http' });
      await startHttpServerProcess({ config });
    });
}
