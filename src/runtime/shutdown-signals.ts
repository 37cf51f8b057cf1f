import type { Logger } from 'pino';

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
        () => process.exit(0),
        (error) => {
          logger.error({ err: error }, 'shutdown failed');
          process.exit(1);
        },
      );
    } else {
      logger.warn({ signal }, 'forcing shutdown');
      stop({ force: true }).finally(() => process.exit(1));
    }
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
}
