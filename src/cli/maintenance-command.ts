import type { Command } from 'commander';
import { loadEnvConfig } from '../runtime/env-config.js';

/** `maintenance`: the janitor, the sweeper and the scheduler apart from the workers, until SIGTERM/SIGINT. */
export function registerMaintenanceCommand(program: Command): void {
  program
    .command('maintenance')
    .description('run the janitor (expired keys, sent outbox rows), the sweeper (lost jobs) and the scheduler (the ticks of schedules) apart from the workers; safe beside workers and other maintenance processes')
    .action(async () => {
      const config = loadEnvConfig();
      // Loaded when the command runs, as the worker's: the other commands start without BullMQ.
      const [{ startMaintenanceProcess }, { startTracingFromEnv }] = await Promise.all([import('../runtime/maintenance-process.js'), import('../otel/start-tracing.js')]);
      await startTracingFromEnv({ serviceName: 'idempotent-jobs-maintenance' });
      await startMaintenanceProcess({ config });
    });
}
