import type { Command } from 'commander';
import { loadEnvConfig } from '../runtime/env-config.js';
import { startTracingFromEnv } from '../otel/start-tracing.js';
import { startOutboxRelayProcess } from '../runtime/relay-process.js';

/** `relay`: the outbox relay, moving committed outbox rows into BullMQ until SIGTERM/SIGINT. */
export function registerRelayCommand(program: Command): void {
  program
    .command('relay')
    .description('run the outbox relay: move committed outbox rows (producer.enqueue(job, { tx })) into BullMQ')
    .action(async () => {
      const config = loadEnvConfig();
      await startTracingFromEnv({ serviceName: 'idempotent-jobs-relay' });
      await startOutboxRelayProcess({ config });
    });
}
