/**
 * The OpenTelemetry API, when the application has `@opentelemetry/api` installed; otherwise
 * undefined, and every tracing helper runs its work untraced. It is an optional peer
 * dependency: a BullMQ user installs nothing for tracing, and an application that traces gets
 * the one copy of the API its SDK registered with (two copies of different minor versions do
 * not always see each other's global tracer provider).
 */
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import type * as OtelApi from '@opentelemetry/api';

export type { Attributes, Context, Span } from '@opentelemetry/api';

/**
 * Loads the API synchronously: a top-level `await` anywhere in the library's module graph would
 * make `require('idempotent-jobs')` (Node's require of an ES module, which CommonJS
 * applications rely on) fail with ERR_REQUIRE_ASYNC_MODULE. It resolves the specifier as an
 * `import` would, then requires that file: for an ES module build, Node's require of an ES
 * module returns the same module instance an `import` gets, so the library and the application
 * share one copy of the API, and with it the tracer provider the application's SDK registered
 * (its ES and CommonJS builds are two copies, each with its own proxy provider).
 */
function loadOtelApi(): typeof OtelApi | undefined {
  const require = createRequire(import.meta.url);
  const resolved = resolveOtelApi(require);
  return resolved === undefined ? undefined : (require(resolved) as typeof OtelApi);
}

/**
 * The API's file as this module's own kind of load would find it, or undefined when it is not
 * installed. `import.meta.resolve` is absent where a TypeScript runner (tsx, ts-node) compiled
 * the library to CommonJS for a CommonJS application: there the module is loaded by `require`,
 * so `require.resolve` finds the copy the application's own `require` gets.
 */
function resolveOtelApi(require: NodeJS.Require): string | undefined {
  const resolveAsImport = (import.meta as Partial<ImportMeta>).resolve;
  try {
    if (typeof resolveAsImport !== 'function') return require.resolve('@opentelemetry/api');
    const resolved = resolveAsImport('@opentelemetry/api');
    return resolved.startsWith('file:') ? fileURLToPath(resolved) : resolved;
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === 'ERR_MODULE_NOT_FOUND' || code === 'MODULE_NOT_FOUND') return undefined;
    throw error;
  }
}

/** The API's module, loaded once when this module is first imported. */
export const otel: typeof OtelApi | undefined = loadOtelApi();

/**
 * The library's tracer, from the provider registered now (asked at each span, not kept: an
 * application whose SDK registered through another copy of the API, its CommonJS build say,
 * registers that copy's provider globally, which a tracer kept from this copy's would not see).
 */
export function libraryTracer(): OtelApi.Tracer | undefined {
  return otel?.trace.getTracer('idempotent-jobs');
}

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
  // Another copy's proxy (registered globally by an SDK through it) is not an instance of this
  // copy's class; it is there because a provider was registered.
  return provider instanceof otel.ProxyTracerProvider && provider.getDelegate() === NO_PROVIDER;
}
