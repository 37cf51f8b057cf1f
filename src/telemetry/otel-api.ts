/**
 * The OpenTelemetry API, when the application has `@opentelemetry/api` installed; otherwise
 * undefined, and every tracing helper runs its work untraced. It is an optional peer
 * dependency: a BullMQ user installs nothing for tracing, and an application that traces gets
 * the one copy of the API its SDK registered with (two copies of different minor versions do
 * not always see each other's global tracer provider).
 */
import type * as OtelApi from '@opentelemetry/api';

export type { Attributes, Context, Span } from '@opentelemetry/api';

async function loadOtelApi(): Promise<typeof OtelApi | undefined> {
  try {
    return await import('@opentelemetry/api');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ERR_MODULE_NOT_FOUND') return undefined;
    throw error;
  }
}

/** The API's module, loaded once when this module is first imported. */
export const otel: typeof OtelApi | undefined = await loadOtelApi();

/** The library's tracer (a proxy: spans go to whichever provider is registered when they start). */
export const tracer: OtelApi.Tracer | undefined = otel?.trace.getTracer('idempotent-jobs');

/** What the API's global proxy delegates to while no SDK has registered a provider (a fresh proxy's delegate). */
const NO_PROVIDER = otel ? new otel.ProxyTracerProvider().getDelegate() : undefined;

/**
 * True when spans would be no-ops: no API, or no tracer provider registered. Checked before
 * each traced operation, so that a process without an SDK builds no span, context or
 * attribute at all; an SDK registered later is seen at the next operation.
 */
export function tracingOff(): boolean {
  if (!otel) return true;
  const provider = otel.trace.getTracerProvider();
  return provider instanceof otel.ProxyTracerProvider && provider.getDelegate() === NO_PROVIDER;
}
