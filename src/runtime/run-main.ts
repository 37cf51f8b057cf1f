import { EXIT_FAILURE, EXIT_USAGE } from './exit-codes.js';
import { ConfigError, ValidationError } from '../errors.js';
import { DatabaseUnreachableError } from './database-problems.js';
import { StoreUnreachableAtStartError } from './wait-for-store.js';

/**
 * The exit code for an error that stops a process from starting and whose message says all
 * there is to fix, so that it is printed alone, without a stack trace: bad configuration or a
 * bad argument (each variable or option and what is wrong with it, a database or schema that is
 * not there) exits 2; a server that stayed unreachable through the start's wait, or did not
 * answer a command, exits 1. `undefined` for anything else: that is
 * a defect, and its stack trace is what a report needs.
 */
export function startupFailureExitCode(error: unknown): number | undefined {
  if (error instanceof ConfigError || error instanceof ValidationError) return EXIT_USAGE;
  if (error instanceof StoreUnreachableAtStartError || error instanceof DatabaseUnreachableError) return EXIT_FAILURE;
  return undefined;
}

/**
 * Runs a runnable process's start (the workers, the HTTP server, the relay, the maintenance
 * process, the demo) and ends the process the way `npx idempotent-jobs` does when the start
 * fails for a reason its message explains (see {@link startupFailureExitCode}): the message on
 * standard error and the exit code, nothing else. Other errors are rethrown unchanged.
 * Resolves to what `start` returns, e.g. `const config = await runMain(() => loadEnvConfig())`.
 */
export async function runMain<T>(start: () => Promise<T> | T): Promise<T> {
  try {
    return await start();
  } catch (error) {
    const exitCode = startupFailureExitCode(error);
    if (exitCode === undefined) throw error;
    console.error((error as Error).message);
    process.exit(exitCode);
  }
}
