/**
 * `idempotent-jobs/otel`: starts the OpenTelemetry SDK for a process from the `OTEL_*`
 * variables. The library itself traces through `@opentelemetry/api` alone (see
 * `configureTracing` in the main entry point). Needs the optional peer dependency
 * `@opentelemetry/sdk-node` when tracing is turned on.
 *
 * @packageDocumentation
 * @module idempotent-jobs/otel
 */
export type { StartTracingOptions, Tracing } from './start-tracing.js';
export { startTracingFromEnv, tracingRequested } from './start-tracing.js';
