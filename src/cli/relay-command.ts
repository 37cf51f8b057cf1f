import type { Command } from 'commander';
import { loadEnvConfig } from '../runtime/env-config.js';

/** `relay`: the outbox relay, moving committed outbox rows into BullMQ until SIGTERM/SIGINT. */
export function registerRelayCommand(program: Command): void {
  program
    .command('relay')
    .description('run the outbox relay: move committed outbox rows (producer.enqueue(job, { tx })) into BullMQ')
    .action(async () => {
      const config = loadEnvConfig();
      // Loaded when the command runs, as the worker's: the other commands start without BullMQ.
      const [{ startOutboxRelayProcess }, { startTracingFromEnv }] = await Promise.all([import('../runtime/relay-process.js'), import('../otel/start-tracing.js')]);
      await startTracingFromEnv({ serviceName: 'idempotent-jobs-relay' });
      await startOutboxRelayProcess({ config });
    });
}
