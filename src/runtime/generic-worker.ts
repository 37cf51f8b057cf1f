import { ConfigError } from '../errors.js';
import { loadEnvConfig } from './env-config.js';
import { loadHandlerModule } from './handler-module.js';
import { startWorkerProcess } from './worker-process.js';

/** What `idempotent-jobs worker` was given. */
export interface GenericWorkerArgs {
  /** BullMQ queue; required, here or in `$QUEUE`. */
  readonly queue?: string;
  /** Path of the handler module; its default export is the handler. */
  readonly handler: string;
  /** Jobs at once. @defaultValue `$CONCURRENCY` or `8` */
  readonly concurrency?: number;
}

/**
 * Runs a user's handler module as an idempotent worker (`idempotent-jobs worker --queue <name>
 * --handler <module> [--concurrency N]`; the queue is required, by `--queue` or `QUEUE`). The module's default export is the handler:
 * `async (ctx) => result`, or a database-only handler `{ transaction: async (tx, ctx) => result }`
 * (fast path and group commit unless FAST_PATH or GROUP_COMMIT is false). Everything else comes
 * from the environment (see docs/configuration.md). `startTracing` runs once the handler is
 * loaded and before the worker starts, with the process's service name (the command passes the
 * OpenTelemetry SDK's start, which lives above this room).
 */
export async function runGenericWorker(args: GenericWorkerArgs, startTracing: (serviceName: string) => Promise<unknown>): Promise<void> {
  // A worker on a queue nobody enqueues to waits for ever, silently: the queue is named, never guessed.
  if (!args.queue && !process.env.QUEUE?.trim()) {
    throw new ConfigError('worker: no queue named. Pass --queue <name> (or set QUEUE): the BullMQ queue your producers enqueue to, e.g. --queue payments.');
  }
  const config = loadEnvConfig({
    ...process.env,
    ...(args.queue ? { QUEUE: args.queue } : {}),
    ...(args.concurrency ? { CONCURRENCY: String(args.concurrency) } : {}),
  });
  const handler = await loadHandlerModule(args.handler);
  await startTracing(`idempotent-jobs-worker-${config.QUEUE}`);
  await startWorkerProcess({ config, handler });
}
