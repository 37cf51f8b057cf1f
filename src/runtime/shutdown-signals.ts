import type { Logger } from 'pino';

/** Run after a graceful stop, before the process exits (say, to export buffered spans). */
const exitHooks: (() => Promise<void>)[] = [];

/** Registers `hook` to run (with the others, at once) when {@link onShutdownSignals} has stopped the process, before it exits. */
export function addExitHook(hook: () => Promise<void>): void {
  exitHooks.push(hook);
}

async function runExitHooks(logger: Logger): Promise<void> {
  const results = await Promise.allSettled(exitHooks.map((hook) => hook()));
  for (const result of results) if (result.status === 'rejected') logger.warn({ err: result.reason }, 'exit hook failed');
}

/**
 * First SIGTERM/SIGINT: graceful stop, then exit 0. A second signal while stopping: force
 * (release unfinished jobs' keys at once), then exit 1.
 */
export function onShutdownSignals(logger: Logger, stop: (options?: { force?: boolean }) => Promise<void>): void {
  let signals = 0;
  const onSignal = (signal: NodeJS.Signals) => {
    signals++;
    if (signals === 1) {
      logger.info({ signal }, 'shutting down gracefully (send again to force)');
      stop().then(
        () => runExitHooks(logger).finally(() => process.exit(0)),
        (error) => {
          logger.error({ err: error }, 'shutdown failed');
          process.exit(1);
        },
      );
    } else {
      logger.warn({ signal }, 'forcing shutdown');
      stop({ force: true })
        .then(() => runExitHooks(logger))
        .finally(() => process.exit(1));
    }
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
}
