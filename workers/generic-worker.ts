/**
 * Runs a user's handler module as an idempotent worker:
 *   npx idempotent-jobs worker --queue <name> --handler <module> [--concurrency N]
 * The module's default export is the handler `async (ctx) => result`. Everything else comes
 * from the environment (see docs/configuration.md).
 */
import { pathToFileURL } from 'node:url';
import { resolve } from 'node:path';
import { ConfigError, loadEnvConfig, startWorkerProcess, type JobHandler } from '../src/index.js';
import { startTracingFromEnv } from '../src/otel/index.js';

export interface GenericWorkerArgs {
  readonly queue?: string;
  readonly handler: string;
  readonly concurrency?: number;
}

export async function runGenericWorker(args: GenericWorkerArgs): Promise<void> {
  const config = loadEnvConfig({
    ...process.env,
    ...(args.queue ? { QUEUE: args.queue } : {}),
    ...(args.concurrency ? { CONCURRENCY: String(args.concurrency) } : {}),
  });
  const module = await import(pathToFileURL(resolve(args.handler)).href);
  const handler = module.default as JobHandler | undefined;
  if (typeof handler !== 'function') {
    throw new ConfigError(`--handler ${args.handler}: the module has no default export function (async (ctx) => result).`);
  }
  await startTracingFromEnv({ serviceName: `idempotent-jobs-worker-${config.QUEUE}` });
  await startWorkerProcess({ config, handler });
}
