/** How long a start that failed waits for its connections to close before it reports the failure anyway. */
export const CLOSE_AFTER_FAILED_START_MS = 2_000;

/**
 * Waits for `closings` (their errors ignored) for at most `ms`: after a failed start a
 * connection may still hang on a server that never answers, and the caller must learn why the
 * start failed rather than wait on it.
 */
export async function closeWithin(ms: number, ...closings: Array<Promise<unknown> | undefined>): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    Promise.allSettled(closings),
    new Promise((resolve) => {
      timer = setTimeout(resolve, ms);
      timer.unref();
    }),
  ]);
  clearTimeout(timer);
}
