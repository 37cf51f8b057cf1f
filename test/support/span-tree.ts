/** An in-memory OpenTelemetry SDK for the tracing tests, and helpers to read the span tree it collects. */
import { context, propagation, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider, type ReadableSpan } from '@opentelemetry/sdk-trace';

export interface InMemoryTracing {
  readonly exporter: InMemorySpanExporter;
  /** Unregisters the provider, propagator and context manager. */
  stop(): Promise<void>;
}

/** Registers a tracer provider that keeps finished spans in memory, W3C propagation and async context. */
export function startInMemoryTracing(): InMemoryTracing {
  const exporter = new InMemorySpanExporter();
  const provider = new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter })] });
  const contextManager = new AsyncLocalStorageContextManager().enable();
  context.setGlobalContextManager(contextManager);
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  trace.setGlobalTracerProvider(provider);
  return {
    exporter,
    async stop() {
      await provider.shutdown();
      trace.disable();
      propagation.disable();
      context.disable();
    },
  };
}

/** A foreign producer's trace context: a fresh trace id and span id, sampled. */
export function foreignTraceparent(): { traceparent: string; traceId: string; spanId: string } {
  const hex = (bytes: number) => [...crypto.getRandomValues(new Uint8Array(bytes))].map((b) => b.toString(16).padStart(2, '0')).join('');
  const traceId = hex(16);
  const spanId = hex(8);
  return { traceparent: `00-${traceId}-${spanId}-01`, traceId, spanId };
}

/** The spans of one trace, with lookups by name and parent. */
export class SpanTree {
  constructor(readonly spans: readonly ReadableSpan[]) {}

  static of(exporter: InMemorySpanExporter, traceId: string): SpanTree {
    return new SpanTree(exporter.getFinishedSpans().filter((span) => span.spanContext().traceId === traceId));
  }

  /** The spans named `name`. */
  named(name: string): ReadableSpan[] {
    return this.spans.filter((span) => span.name === name);
  }

  /** The one span named `name` (throws when there are none or several). */
  one(name: string): ReadableSpan {
    const found = this.named(name);
    if (found.length !== 1) throw new Error(`expected one span "${name}", found ${found.length}: ${this.describe()}`);
    return found[0]!;
  }

  children(parent: ReadableSpan): ReadableSpan[] {
    return this.spans.filter((span) => span.parentSpanContext?.spanId === parent.spanContext().spanId);
  }

  /** Names from `span` up to the trace's root, `span` first. */
  ancestry(span: ReadableSpan): string[] {
    const names = [span.name];
    let current: ReadableSpan | undefined = span;
    while (current?.parentSpanContext) {
      const parentId: string = current.parentSpanContext.spanId;
      current = this.spans.find((candidate) => candidate.spanContext().spanId === parentId);
      if (current) names.push(current.name);
    }
    return names;
  }

  /** One line per span, indented under its parent (for failure messages). */
  describe(): string {
    const roots = this.spans.filter((span) => !this.spans.some((p) => p.spanContext().spanId === span.parentSpanContext?.spanId));
    const lines: string[] = [];
    const walk = (span: ReadableSpan, depth: number) => {
      lines.push(`${'  '.repeat(depth)}${span.name} ${JSON.stringify(span.attributes)} [${span.events.map((e) => e.name).join(', ')}]`);
      for (const child of this.children(span)) walk(child, depth + 1);
    };
    for (const root of roots) walk(root, 0);
    return `\n${lines.join('\n')}`;
  }
}
