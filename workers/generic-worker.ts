/**
 * Runs a user's handler module as an idempotent worker:
 *   npx idempotent-jobs worker --queue <name> --handler <module> [--concurrency N]
 * The module's default export is the handler: `async (ctx) => result`, or a database-only
 * handler `{ transaction: async (tx, ctx) => result }` (fast path and group commit unless
 * FAST_PATH or GROUP_COMMIT is false). Everything else comes from the environment (see
 * docs/configuration.md).
 */
import { loadEnvConfig, loadHandlerModule, startWorkerProcess } from '../src/index.js';
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
  const handler = await loadHandlerModule(args.handler);
  await startTracingFromEnv({ serviceName: `idempotent-jobs-worker-${config.QUEUE}` });
  await startWorkerProcess({ config, handler });
}
