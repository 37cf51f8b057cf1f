/**
 * The `idempotent-jobs/otel` entry point: starts the OpenTelemetry Node SDK with an OTLP
 * exporter for the runnable processes (worker, HTTP server, relay, maintenance), configured by
 * the standard `OTEL_*` variables. The SDK packages are optional peer dependencies, loaded
 * only when tracing is turned on, so importing this module costs nothing without them.
 */
import { ConfigError } from '../errors.js';
import { configureTracing } from '../telemetry/trace-attributes.js';
import { addExitHook } from '../runtime/shutdown-signals.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** A started (or not started) SDK, as {@link startTracingFromEnv} returns it. */
export interface Tracing {
  /** True when the SDK was started. */
  readonly enabled: boolean;
  /** Exports what is buffered and stops the SDK (a no-op when not enabled). */
  shutdown(): Promise<void>;
}

/** Options of {@link startTracingFromEnv}. */
export interface StartTracingOptions {
  /** `service.name` of the traces when `OTEL_SERVICE_NAME` is not set, e.g. `'payments-worker'`. */
  readonly serviceName: string;
}

/**
 * True when the environment asks for traces: `OTEL_EXPORTER_OTLP_ENDPOINT`,
 * `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or an `OTEL_TRACES_EXPORTER` other than `none` is set,
 * and `OTEL_SDK_DISABLED` is not `true`.
 */
export function tracingRequested(env: NodeJS.ProcessEnv = process.env): boolean {
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === 'true') return false;
  const exporters = env.OTEL_TRACES_EXPORTER?.split(',').map((name) => name.trim()).filter((name) => name !== '');
  if (exporters && exporters.length > 0) return !exporters.includes('none');
  return Boolean(env.OTEL_EXPORTER_OTLP_ENDPOINT || env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
}

const NOT_STARTED: Tracing = { enabled: false, shutdown: async () => {} };

/**
 * Starts the OpenTelemetry Node SDK when {@link tracingRequested}: traces only (no metrics or
 * logs: those are Prometheus and pino's), exported as `OTEL_TRACES_EXPORTER` says (default
 * OTLP, `OTEL_EXPORTER_OTLP_PROTOCOL` default `http/protobuf`), W3C Trace Context propagation.
 * `TRACE_KEYS=true` puts idempotency keys on spans (otherwise a hash). Buffered spans are
 * exported when the process stops on SIGTERM/SIGINT through `onShutdownSignals`, or by
 * {@link Tracing.shutdown}. Call it first thing, before the process opens connections, so
 * that the SDK's instrumentations see them.
 *
 * Throws a {@link ConfigError} when tracing is requested but `@opentelemetry/sdk-node` is not
 * installed: a process asked to trace should not start silently without it.
 *
 * @example
 * ```ts
 * import { loadEnvConfig, startWorkerProcess } from 'idempotent-jobs/process';
 * import { startTracingFromEnv } from 'idempotent-jobs/otel';
 *
 * // OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 turns it on; without OTEL_* it does nothing.
 * const tracing = await startTracingFromEnv({ serviceName: 'payments-worker' });
 * console.log(tracing.enabled ? 'exporting traces' : 'tracing off');
 * await startWorkerProcess({
 *   config: loadEnvConfig(),
 *   handler: (ctx) => ctx.transaction((tx) => tx.insertInto('ledger').values({ order_id: ctx.key }).execute()),
 * });
 * ```
 */
export async function startTracingFromEnv(options: StartTracingOptions): Promise<Tracing> {
  refuseUnknownOptions(options, optionNames<StartTracingOptions>()(['serviceName']), 'startTracingFromEnv(options)');
  const env = process.env;
  configureTracing({ recordKeys: env.TRACE_KEYS?.trim().toLowerCase() === 'true' });
  if (!tracingRequested(env)) return NOT_STARTED;
  let sdkModule: typeof import('@opentelemetry/sdk-node');
  try {
    sdkModule = await import('@opentelemetry/sdk-node');
  } catch (error) {
    throw new ConfigError(
      'OpenTelemetry tracing is turned on (OTEL_* variables) but its SDK is not installed: ' +
        `npm install @opentelemetry/api @opentelemetry/sdk-node, or unset the OTEL_* variables (${(error as Error).message}).`,
    );
  }
  const sdk = new sdkModule.NodeSDK({
    ...(env.OTEL_SERVICE_NAME ? {} : { serviceName: options.serviceName }),
    metricReaders: [],
    logRecordProcessors: [],
  });
  sdk.start();
  const tracing: Tracing = { enabled: true, shutdown: () => sdk.shutdown() };
  addExitHook(() => tracing.shutdown());
  return tracing;
}
