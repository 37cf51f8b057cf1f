import { otel, type Context, type Span } from './otel-api.js';

/**
 * W3C Trace Context (https://www.w3.org/TR/trace-context/) as it travels in job data and in
 * outbox rows: `traceparent` and, when there is one, `tracestate`, beside the wire contract's
 * fields. Foreign producers set `traceparent` to join a job to their trace.
 */
export interface TraceCarrier {
  /** W3C `traceparent`: version, trace id, parent span id, flags. @defaultValue absent (no trace to join) */
  traceparent?: string;
  /** W3C `tracestate`: vendor entries that go with `traceparent`. @defaultValue absent */
  tracestate?: string;
}

/**
 * The trace context a job's (or row's) data carries, as a parent context; the active context
 * when it carries none, or an invalid `traceparent` (which is ignored, as the W3C
 * recommendation says: the job is not refused for it).
 */
export function contextFromCarrier(data: unknown): Context | undefined {
  if (!otel) return undefined;
  const active = otel.context.active();
  if (data === null || typeof data !== 'object') return active;
  const { traceparent, tracestate } = data as Record<string, unknown>;
  if (typeof traceparent !== 'string') return active;
  const carrier: TraceCarrier = typeof tracestate === 'string' ? { traceparent, tracestate } : { traceparent };
  return otel.propagation.extract(active, carrier);
}

/**
 * The trace context of `span` to write into a job's data, or undefined when there is none to
 * write (no API, or no propagator registered: no SDK).
 */
export function carrierOf(span: Span | undefined): TraceCarrier | undefined {
  if (!otel || !span) return undefined;
  const carrier: TraceCarrier = {};
  otel.propagation.inject(otel.trace.setSpan(otel.context.active(), span), carrier);
  return carrier.traceparent === undefined ? undefined : carrier;
}

/**
 * `data` with the trace context of `span` in place of any it had (a copy; `data` itself is
 * kept), or `data` as it is when there is nothing to write or it is not an object.
 */
export function withTraceContext<D>(data: D, span: Span | undefined): D {
  const carrier = carrierOf(span);
  if (!carrier || data === null || typeof data !== 'object' || Array.isArray(data)) return data;
  const { traceparent: _parent, tracestate: _state, ...rest } = data as Record<string, unknown>;
  return { ...rest, ...carrier } as D;
}
