import type { Command } from 'commander';

/** `worker --queue <name> --handler <module> [--concurrency N]`: runs a user's handler. */
export function registerWorkerCommand(program: Command): void {
  program
    .command('worker')
    .description('run an idempotent worker with your handler module (its default export: async (ctx) => result, or { transaction: async (tx, ctx) => result })')
    .requiredOption('--handler <module>', 'path to the handler module')
    .option('--queue <name>', 'BullMQ queue your producers enqueue to (required, unless $QUEUE is set)')
    .option('--concurrency <n>', 'jobs at once (default: $CONCURRENCY or 8)', (v) => Number.parseInt(v, 10))
    .action(async (options: { handler: string; queue?: string; concurrency?: number }) => {
      const [{ runGenericWorker }, { startTracingFromEnv }] = await Promise.all([import('../runtime/generic-worker.js'), import('../otel/start-tracing.js')]);
      await runGenericWorker(options, (serviceName) => startTracingFromEnv({ serviceName }));
    });
}
