import { libraryTracer, otel, tracingOff, type Attributes, type Context, type Span } from './otel-api.js';

/** How a span is started by {@link inSpan}. */
export interface SpanStart {
  /** Defaults to internal. */
  readonly kind?: 'server' | 'producer' | 'consumer' | 'internal';
  /** Computed only when the span records: nothing is built for a no-op tracer. */
  readonly attributes?: () => Attributes;
  /** The parent; defaults to the active context. */
  readonly parent?: Context;
  /** Errors that end the operation as planned (a deferral), not as a failure. @defaultValue none */
  readonly isExpected?: (error: unknown) => boolean;
}

/**
 * Runs `work` inside a new active span (so spans started within are its children) and ends
 * the span when `work` settles, recording a thrown error. Without the OpenTelemetry API it
 * just runs `work` (with no span).
 */
export function inSpan<T>(name: string, start: SpanStart, work: (span: Span | undefined) => Promise<T>): Promise<T> {
  return tracingOff() ? work(undefined) : inActiveSpan(name, start, work);
}

async function inActiveSpan<T>(name: string, start: SpanStart, work: (span: Span | undefined) => Promise<T>): Promise<T> {
  if (!otel) return work(undefined);
  const span = startSpan(name, start);
  // No SDK (or a span that neither records nor carries a trace on): nothing to make active.
  if (!span.isRecording() && !otel.trace.isSpanContextValid(span.spanContext())) return work(undefined);
  try {
    return await otel.context.with(otel.trace.setSpan(start.parent ?? otel.context.active(), span), work, undefined, span);
  } catch (error) {
    if (!start.isExpected?.(error)) recordError(span, error);
    throw error;
  } finally {
    span.end();
  }
}

/** Starts a span that the caller ends (for spans that outlive one call, or many at once). */
export function startSpan(name: string, start: SpanStart): Span {
  const kinds = otel!.SpanKind;
  const kind = start.kind === 'server' ? kinds.SERVER : start.kind === 'producer' ? kinds.PRODUCER : start.kind === 'consumer' ? kinds.CONSUMER : kinds.INTERNAL;
  const span = libraryTracer()!.startSpan(name, { kind }, start.parent);
  if (start.attributes && span.isRecording()) span.setAttributes(start.attributes());
  return span;
}

/** Marks a span failed by `error`. */
export function recordError(span: Span, error: unknown): void {
  if (!span.isRecording()) return;
  if (error instanceof Error) span.recordException(error);
  span.setStatus({ code: otel!.SpanStatusCode.ERROR, message: error instanceof Error ? error.message : String(error) });
}

/** Sets attributes on a recording span; `attributes` is not called otherwise. */
export function annotate(span: Span | undefined, attributes: () => Attributes): void {
  if (span?.isRecording()) span.setAttributes(attributes());
}
