import { otel, tracingOff, type Attributes, type Context, type Span } from './otel-api.js';
import { recordError, startSpan, type SpanStart } from './spans.js';
import { withTraceContext } from './trace-carrier.js';
import { ATTR } from './trace-attributes.js';

/** One message of a batch, as {@link MessageSpans.start} sees it. */
export interface TracedMessage {
  /** The parent of its span (the trace context its data carried); the active context if unset. */
  readonly parent?: Context;
  readonly attributes: () => Attributes;
}

/**
 * One span per message of a batch that is written in one go (an outbox insert, a BullMQ bulk
 * add, a relay batch): each message's data carries its own span's trace context, so each
 * job's trace goes on from its own span.
 */
export class MessageSpans {
  readonly #spans: readonly Span[];

  private constructor(spans: readonly Span[]) {
    this.#spans = spans;
  }

  /**
   * Starts a span per message, or returns undefined when there is nothing to trace (no API,
   * or no SDK: spans that neither record nor carry a trace on).
   */
  static start(name: string, kind: SpanStart['kind'], messages: readonly TracedMessage[]): MessageSpans | undefined {
    if (tracingOff() || messages.length === 0) return undefined;
    const spans = messages.map((message) => startSpan(name, { kind, parent: message.parent, attributes: message.attributes }));
    if (spans.every((span) => !span.isRecording() && !otel!.trace.isSpanContextValid(span.spanContext()))) return undefined;
    return new MessageSpans(spans);
  }

  /** The span of message `index`, to parent spans started for it. */
  contextOf(index: number): Context {
    return otel!.trace.setSpan(otel!.context.active(), this.#spans[index]!);
  }

  /** `data` carrying the trace context of message `index`'s span (see {@link withTraceContext}). */
  dataFor<D>(index: number, data: D): D {
    return withTraceContext(data, this.#spans[index]);
  }

  /** Records what became of message `index` (added, duplicate, …). */
  setOutcome(index: number, outcome: string): void {
    this.#spans[index]!.setAttribute(ATTR.outcome, outcome);
  }

  addEvent(name: string): void {
    for (const span of this.#spans) span.addEvent(name);
  }

  /** Ends every span; with `error`, marked failed by it. */
  end(error?: unknown): void {
    for (const span of this.#spans) {
      if (error !== undefined) recordError(span, error);
      span.end();
    }
  }
}
