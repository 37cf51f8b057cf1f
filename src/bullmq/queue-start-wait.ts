import type { Logger } from 'pino';
import { ServiceUnreachableError, shownAddress, startupWaitMs, waitForService } from '../service-unreachable.js';
import type { QueueConnectionOptions } from './queue-connection.js';
import { isRedisConnectionError } from './worker-error-log.js';

/** A BullMQ queue or worker: it connects by itself, and says so through `waitUntilReady`. */
interface Connecting {
  waitUntilReady(): Promise<unknown>;
  on(event: 'error', listener: (error: Error) => void): unknown;
  off(event: 'error', listener: (error: Error) => void): unknown;
}

/** The queue's Redis as an error or a log line may show it: its URL without the password, else host:port. */
export function redisAddress(options: QueueConnectionOptions): string {
  const connection = options.connection as Record<string, unknown> & { options?: Record<string, unknown>; isCluster?: boolean };
  if (connection.isCluster === true) return 'the Redis Cluster given';
  if (typeof connection.url === 'string') return shownAddress(connection.url);
  const settings = (typeof connection.options === 'object' && connection.options !== null ? connection.options : connection) as Record<string, unknown>;
  if (Array.isArray(settings.sentinels)) return `the Redis master "${String(settings.name ?? 'mymaster')}" of the sentinels given`;
  return `${String(settings.host ?? '127.0.0.1')}:${String(settings.port ?? 6379)}`;
}

/**
 * Resolves once `client` is connected to Redis. While Redis is down, ioredis reconnects by
 * itself and BullMQ's readiness neither resolves nor fails; so this waits, one warning line per
 * try, until `deadline` (now + `STARTUP_WAIT_MS`, default 60 s), then rejects with a
 * `ServiceUnreachableError` naming Redis, its address and what to do. An error that waiting
 * cannot fix (a refused password) is thrown at once.
 */
export async function redisReadyBeforeDeadline(
  client: Connecting,
  options: QueueConnectionOptions,
  logger: Logger,
  deadline: number = Date.now() + startupWaitMs(),
  signal?: AbortSignal,
): Promise<void> {
  let lastError: Error | undefined;
  const remember = (error: Error) => {
    lastError = error;
  };
  client.on('error', remember);
  const ready = client.waitUntilReady();
  ready.catch(() => {}); // Observed by each try below; never left unhandled.
  try {
    await waitForService(() => readyWithin(ready, Math.max(0, Math.min(1_000, deadline - Date.now() - 20)), () => lastError), {
      service: 'Redis',
      address: redisAddress(options),
      deadline,
      logger,
      retryable: (error) => error instanceof NotConnectedYet || (error instanceof Error && isRedisConnectionError(error)),
      ...(signal ? { signal } : {}),
    });
  } finally {
    client.off('error', remember);
  }
}

/** Redis had neither answered nor failed to connect when a try's time ran out. */
class NotConnectedYet extends Error {
  constructor() {
    super('no answer yet');
    this.name = new.target.name;
  }
}

/** `ready`, or at the end of `ms` the last connection error (the try's outcome), else {@link NotConnectedYet}. */
function readyWithin(ready: Promise<unknown>, ms: number, lastError: () => Error | undefined): Promise<unknown> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(lastError() ?? new NotConnectedYet()), ms);
  });
  return Promise.race([ready, timeout]).finally(() => clearTimeout(timer));
}

/** A start being watched: its outcome, and a way to stop watching (the object was closed meanwhile). */
export interface StartWatch {
  /** Resolves once connected, or to the error that ended the start. Never rejects. */
  readonly failure: Promise<ServiceUnreachableError | undefined>;
  /** Stops waiting: the object is closing by its owner's hand. */
  stop(): void;
}

/**
 * Watches a worker's or producer's first connection to Redis: when Redis has not answered by
 * the deadline, `onGiveUp` closes the object (so ioredis stops reconnecting and the process can
 * end) and `failure` resolves to the {@link ServiceUnreachableError}. Other backends, and a
 * wait of `Infinity`, are not watched.
 */
export function watchRedisStart(
  client: Connecting,
  options: QueueConnectionOptions & { readonly startupWaitMs?: number },
  logger: Logger,
  onGiveUp: (failure: ServiceUnreachableError) => Promise<void>,
): StartWatch {
  const waitMs = options.startupWaitMs ?? startupWaitMs();
  if ((options.backend ?? 'redis') !== 'redis' || waitMs === Infinity) return { failure: Promise.resolve(undefined), stop: () => {} };
  const stopped = new AbortController();
  const failure = redisReadyBeforeDeadline(client, options, logger, Date.now() + waitMs, stopped.signal).then(
    () => undefined,
    async (error: unknown) => {
      if (stopped.signal.aborted || !(error instanceof ServiceUnreachableError)) return undefined;
      await onGiveUp(error).catch(() => {});
      return error;
    },
  );
  return { failure, stop: () => stopped.abort() };
}
