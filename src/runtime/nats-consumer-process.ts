import { pino, type Logger } from 'pino';
import type { EnvConfig } from './env-config.js';
import type { FaultHook } from '../fault-hook.js';
import type { MetricsServer } from '../metrics/metrics-server.js';
import type { Maintenance } from '../ops/maintenance.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { operateConsumer } from './consumer-operations.js';
import { openKeyStoreFromEnv, runnerSettingsFromEnv } from './key-store-from-env.js';
import { onShutdownSignals } from './shutdown-signals.js';
import { createIdempotentNatsConsumer, type IdempotentNatsConsumer, type IdempotentNatsConsumerOptions } from '../nats/idempotent-nats-consumer.js';
import { ensureJetStreamConsumerAt } from '../nats/jetstream-setup.js';
import type { NatsKeySource } from '../nats/nats-message-identity.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** What {@link startNatsConsumerProcess} needs besides the environment. */
export interface NatsConsumerProcessOptions<P, R> {
  /** Postgres, schema, lease and shutdown settings (`CONCURRENCY` too, unless given here). */
  readonly config: EnvConfig;
  /** A function, or a database-only handler (`{ transaction }`: fast path and group commit unless `FAST_PATH` / `GROUP_COMMIT` are false). */
  readonly handler: IdempotentNatsConsumerOptions<P, R>['handler'];
  /** NATS servers. @defaultValue `$NATS_URL` or `'127.0.0.1:4222'` */
  readonly servers?: string;
  /** The stream the messages are in (it must exist). */
  readonly stream: string;
  /** The durable pull consumer's name (created when missing). */
  readonly consumer: string;
  /**
   * Where dead letters go; a stream `<stream>_DEAD_LETTERS` capturing it is created when missing.
   * @defaultValue `dead-letters.<stream>.<consumer>`
   */
  readonly deadLetterSubject?: string;
  /** Messages run at once. @defaultValue `config.CONCURRENCY` */
  readonly concurrency?: number;
  /** Where the key comes from. @defaultValue `'wire-contract'` */
  readonly keyFrom?: NatsKeySource;
  /** The scope of keys read from `Nats-Msg-Id`. @defaultValue `'default'` */
  readonly scope?: string;
  /** Structured logger. @defaultValue `pino()` at `LOG_LEVEL` */
  readonly logger?: Logger;
  /** Chaos testing only. @defaultValue unset */
  readonly faultHook?: FaultHook;
  /** Install SIGTERM/SIGINT handlers that close gracefully and exit. @defaultValue `true` */
  readonly handleSignals?: boolean;
}

/** A running consumer process's parts. */
export interface NatsConsumerProcess<P, R> {
  /** The consumer, pulling messages. */
  readonly consumer: IdempotentNatsConsumer<P, R>;
  /** The claim protocol, over the process's Postgres pool. */
  readonly keys: IdempotencyKeys;
  /** The process's logger. */
  readonly logger: Logger;
  /** `/metrics` and `/healthz` (checks `postgres`, `broker`, `consumer`), when `METRICS_PORT` is set. */
  readonly metricsServer?: MetricsServer;
  /** The janitor and the key statistics (one process at a time runs each), unless turned off; never the sweeper. */
  readonly maintenance?: Maintenance;
  /** Graceful stop (force: release unfinished messages' keys at once), then close every connection. */
  stop(options?: { force?: boolean }): Promise<void>;
}

/**
 * Builds and starts a JetStream consumer process: the Postgres pools (waited for up to
 * STARTUP_WAIT_MS, migrated when MIGRATE), the durable consumer and dead-letter stream when
 * missing, the claim protocol, the consumer, metrics events, `/metrics` and `/healthz` on
 * METRICS_PORT, maintenance as the worker process runs it (without the sweeper: see
 * `operateConsumer`), and signal handling (first SIGTERM/SIGINT: graceful close within
 * SHUTDOWN_TIMEOUT_MS; second: force).
 */
export async function startNatsConsumerProcess<P, R>(options: NatsConsumerProcessOptions<P, R>): Promise<NatsConsumerProcess<P, R>> {
  refuseUnknownOptions(options, optionNames<NatsConsumerProcessOptions<unknown, unknown>>()(['config', 'handler', 'servers', 'stream', 'consumer', 'deadLetterSubject', 'concurrency', 'keyFrom', 'scope', 'logger', 'faultHook', 'handleSignals']), 'startNatsConsumerProcess(options)');
  const { config } = options;
  const logger = options.logger ?? pino({ level: config.LOG_LEVEL });
  const servers = options.servers ?? process.env.NATS_URL ?? '127.0.0.1:4222';
  const concurrency = options.concurrency ?? config.CONCURRENCY;
  const deadLetterSubject = options.deadLetterSubject ?? `dead-letters.${options.stream}.${options.consumer}`;
  const store = await openKeyStoreFromEnv(config, { logger, applicationName: `idempotent-jobs:nats:${options.stream}`, concurrency });
  const { keys } = store;
  const operated = await operateConsumer(
    config,
    store,
    async () => {
      await ensureJetStreamConsumerAt(servers, {
        stream: options.stream,
        consumer: options.consumer,
        // Twice the lease: working() beats every heartbeat (a third of the lease), well inside it.
        ackWaitMs: 2 * config.LEASE_MS,
        deadLetter: { stream: `${options.stream}_DEAD_LETTERS`, subject: deadLetterSubject },
      });
      return createIdempotentNatsConsumer<P, R>({
        servers,
        stream: options.stream,
        consumer: options.consumer,
        deadLetterSubject,
        keys,
        handler: options.handler,
        concurrency,
        keyFrom: options.keyFrom,
        scope: options.scope,
        ...runnerSettingsFromEnv(config),
        logger,
        faultHook: options.faultHook,
      });
    },
    {
      logger,
      component: 'nats-consumer',
      queueLabel: `${options.stream}/${options.consumer}`,
      notConsuming: 'not pulling from JetStream (the NATS connection is closed or reconnecting, or the pull is being made again)',
      start: (started) => started.waitUntilReady(),
    },
  );
  const { consumer, metricsServer, maintenance } = operated;
  logger.info(
    { pid: process.pid, stream: options.stream, consumer: options.consumer, concurrency, leaseMs: config.LEASE_MS, metricsPort: metricsServer?.port },
    'nats consumer ready',
  );
  const stop = (stopOptions: { force?: boolean } = {}) => (stopOptions.force ? consumer.close({ force: true }) : operated.stop());
  if (options.handleSignals ?? true) onShutdownSignals(logger, stop);
  return { consumer, keys, logger, stop, metricsServer, maintenance };
}
