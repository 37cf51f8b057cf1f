import type { Command } from 'commander';
import { loadEnvConfig } from '../runtime/env-config.js';
import { startMaintenanceProcess } from '../runtime/maintenance-process.js';
import { startTracingFromEnv } from '../otel/start-tracing.js';

/** `maintenance`: the janitor, the sweeper and the scheduler apart from the workers, until SIGTERM/SIGINT. */
export function registerMaintenanceCommand(program: Command): void {
  program
    .command('maintenance')
    .description('run the janitor (expired keys, sent outbox rows), the sweeper (lost jobs) and the scheduler (the ticks of schedules) apart from the workers; safe beside workers and other maintenance processes')
    .action(async () => {
      const config = loadEnvConfig();
      await startTracingFromEnv({ serviceName: 'idempotent-jobs-maintenance' });
      await startMaintenanceProcess({ config });
    });
}
