import type { IncomingHttpHeaders } from 'node:http';
import { otel, tracingOff, type Span } from './otel-api.js';
import { startSpan } from './spans.js';
import { ATTR } from './trace-attributes.js';

/** What a request is to its span: Fastify's request fits. */
export interface TracedRequest {
  readonly method: string;
  readonly headers: IncomingHttpHeaders;
}

/**
 * Server spans of the HTTP API, `<METHOD> <route>`, whose parent is the caller's `traceparent`
 * header (W3C Trace Context), so a client's trace goes on into the job. A span starts when
 * the route's handler does, and ends when the response has been sent ({@link end}), with the
 * status code; 5xx marks it failed.
 */
export class RequestTracing {
  readonly #spans = new WeakMap<object, Span>();

  /** A route's handler that runs inside the request's span. */
  wrap<Request extends TracedRequest, Reply, T>(route: string, handler: (request: Request, reply: Reply) => T): (request: Request, reply: Reply) => T {
    if (!otel) return handler;
    const run = (request: Request, work: () => T) => this.#run(request, route, work);
    // A function, not an arrow: Fastify calls handlers with the server instance as `this`.
    return function (this: unknown, request, reply) {
      return run(request, () => handler.call(this, request, reply));
    };
  }

  #run<T>(request: TracedRequest & { readonly params?: unknown }, route: string, work: () => T): T {
    if (!otel || tracingOff()) return work();
    const queue = (request.params as { queue?: unknown } | undefined)?.queue;
    const parent = otel.propagation.extract(otel.context.active(), request.headers);
    const span = startSpan(`${request.method} ${route}`, {
      kind: 'server',
      parent,
      attributes: () => ({ 'http.request.method': request.method, 'http.route': route, ...(typeof queue === 'string' && { [ATTR.queue]: queue }) }),
    });
    if (!span.isRecording() && !otel.trace.isSpanContextValid(span.spanContext())) return work();
    this.#spans.set(request, span);
    return otel.context.with(otel.trace.setSpan(parent, span), work);
  }

  /** Ends the request's span (if it has one) once the response is sent. */
  end(request: object, statusCode: number): void {
    const span = this.#spans.get(request);
    if (!span) return;
    this.#spans.delete(request);
    span.setAttribute('http.response.status_code', statusCode);
    if (statusCode >= 500) span.setStatus({ code: otel!.SpanStatusCode.ERROR });
    span.end();
  }
}
