/**
 * The `idempotent-jobs` command. Exit codes: 0 success, 1 runtime failure, 2 bad usage or
 * configuration, 3 not found (for commands that look a key up), 4 refused by the key's state
 * (see exit-codes.ts).
 */
import { Command, CommanderError } from 'commander';
import { startupFailureExitCode } from '../runtime/run-main.js';
import { registerMigrateCommand } from './migrate-command.js';
import { registerKeysCommand } from './keys-command.js';
import { registerStatsCommand } from './stats-command.js';
import { registerSchedulesCommand } from './schedules-command.js';
import { registerWorkerCommand } from './worker-command.js';
import { registerConsumeCommand } from './consume-command.js';
import { registerHttpCommand } from './http-command.js';
import { registerMaintenanceCommand } from './maintenance-command.js';
import { packageVersion } from './package-version.js';
import { registerRelayCommand } from './relay-command.js';

import { EXIT_FAILURE, EXIT_OK, EXIT_USAGE } from '../runtime/exit-codes.js';

// Defined in exit-codes.ts so that commands can import them without importing (and running) this module.
export { EXIT_CONFLICT, EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE } from '../runtime/exit-codes.js';

export function buildCli(): Command {
  const program = new Command('idempotent-jobs')
    .description('Exactly-once BullMQ jobs: workers and consumers, the HTTP API, the outbox relay, maintenance and schedules, migrations and key inspection.')
    .version(packageVersion(), '-V, --version', 'print the version')
    .exitOverride()
    .showHelpAfterError();
  registerWorkerCommand(program);
  registerConsumeCommand(program);
  registerHttpCommand(program);
  registerRelayCommand(program);
  registerMaintenanceCommand(program);
  registerMigrateCommand(program);
  registerKeysCommand(program);
  registerStatsCommand(program);
  registerSchedulesCommand(program);
  return program;
}

export async function runCli(argv: string[]): Promise<number> {
  try {
    await buildCli().parseAsync(argv, { from: 'user' });
    return process.exitCode === undefined ? EXIT_OK : Number(process.exitCode);
  } catch (error) {
    if (error instanceof CommanderError) return error.exitCode === 0 ? EXIT_OK : EXIT_USAGE;
    const startupExitCode = startupFailureExitCode(error);
    console.error(error instanceof Error ? error.message : error);
    return startupExitCode ?? EXIT_FAILURE;
  }
}

// Long-running commands (worker, consume, http, relay, maintenance) keep the process alive; the others exit with their code.
const code = await runCli(process.argv.slice(2));
if (code !== EXIT_OK) process.exit(code);
