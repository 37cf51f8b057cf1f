/**
 * `idempotent-jobs/otel`: starts the OpenTelemetry SDK for a process from the `OTEL_*`
 * variables, and `configureTracing`: the library itself traces through `@opentelemetry/api`
 * alone, a no-op without it, and needs no SDK to do so. Needs the optional peer dependency
 * `@opentelemetry/sdk-node` when tracing is turned on.
 *
 * @packageDocumentation
 * @module idempotent-jobs/otel
 */
export type { StartTracingOptions, Tracing } from './start-tracing.js';
export { startTracingFromEnv, tracingRequested } from './start-tracing.js';
export type { TracingOptions } from '../telemetry/trace-attributes.js';
export { configureTracing } from '../telemetry/trace-attributes.js';
