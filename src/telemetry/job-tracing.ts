import { tracingOff, type Span } from './otel-api.js';
import { inSpan } from './spans.js';
import { contextFromCarrier } from './trace-carrier.js';
import { ATTR, keyAttributes } from './trace-attributes.js';

/** What a job is to its span: BullMQ's `Job` fits. */
export interface TracedJob {
  readonly id?: string;
  readonly data: unknown;
  /** Attempts BullMQ has counted as used (0 on the first). */
  readonly attemptsMade: number;
}

/** The claim an event is about, when there is one. */
export interface TracedClaim {
  readonly scope: string;
  readonly key: string;
  readonly fence: number;
  readonly attempts: number;
}

/**
 * Events that decide what became of a job: the last one recorded is its span's
 * `idempotent_jobs.outcome`. The others (claimed, taken-over, lease-extended, lease-lost,
 * step-…) are only events.
 */
const FINAL_OUTCOMES: ReadonlySet<string> = new Set([
  'completed',
  'replayed',
  'replayed-failure',
  'result-expired',
  'deferred',
  'concurrency-limited',
  'coalesced',
  'key-reused',
  'invalid',
  'failed',
  'released',
  'fenced',
  'store-unavailable',
]);

/**
 * One consumer span per job run, `process <queue>`, whose parent is the trace context the job
 * carries (`traceparent` in its data, written by the producer or the outbox relay, or by a
 * foreign producer). The claim, the effect transaction and the steps run inside it, so their
 * spans are its children; what the worker reports (claimed, replayed, deferred, taken over,
 * fenced…) becomes its events, and the final one its outcome.
 */
export class JobTracing {
  readonly #queue: string;
  readonly #isDeferral: (error: unknown) => boolean;
  readonly #keyOf: (job: TracedJob) => { readonly scope: string; readonly key: string } | undefined;
  /** The span of each job being run (WeakMap: a job whose run ended leaves nothing behind). */
  readonly #spans = new WeakMap<object, Span>();

  /**
   * `isDeferral`: the error a run throws when it has moved its job to delayed (not a failure).
   * `keyOf`: the job's scope and key, read from its data when the span starts (undefined for
   * data that names none), so that every run's span is about its key, a replay's too, which
   * claims nothing.
   */
  constructor(queue: string, isDeferral: (error: unknown) => boolean, keyOf: (job: TracedJob) => { readonly scope: string; readonly key: string } | undefined = () => undefined) {
    this.#queue = queue;
    this.#isDeferral = isDeferral;
    this.#keyOf = keyOf;
  }

  /** Runs one job inside its span. */
  run<T>(job: TracedJob, work: () => Promise<T>): Promise<T> {
    if (tracingOff()) return work();
    return inSpan(
      `process ${this.#queue}`,
      {
        kind: 'consumer',
        parent: contextFromCarrier(job.data),
        isExpected: this.#isDeferral,
        attributes: () => ({
          ...this.#keyAttributesOf(job),
          [ATTR.messagingSystem]: 'bullmq',
          [ATTR.messagingOperation]: 'process',
          [ATTR.messagingDestination]: this.#queue,
          [ATTR.queue]: this.#queue,
          [ATTR.messageId]: job.id ?? '',
          [ATTR.deliveryAttempt]: job.attemptsMade + 1,
        }),
      },
      async (span) => {
        if (!span?.isRecording()) return work();
        this.#spans.set(job, span);
        try {
          return await work();
        } finally {
          this.#spans.delete(job);
        }
      },
    );
  }

  #keyAttributesOf(job: TracedJob) {
    const named = this.#keyOf(job);
    return named ? keyAttributes(named.scope, named.key) : {};
  }

  /** Records what happened to a job being run (late reports, after its run ended, are dropped). */
  record(kind: string, job: object, claim?: TracedClaim, step?: { readonly name: string; readonly position: number }): void {
    const span = this.#spans.get(job);
    if (!span) return;
    if (claim) {
      span.setAttributes({ ...keyAttributes(claim.scope, claim.key), [ATTR.fence]: claim.fence, [ATTR.attempt]: claim.attempts });
    }
    if (FINAL_OUTCOMES.has(kind)) span.setAttribute(ATTR.outcome, kind);
    span.addEvent(kind, {
      ...(claim && { [ATTR.fence]: claim.fence }),
      ...(step && { [ATTR.step]: step.name, [ATTR.stepPosition]: step.position }),
    });
  }
}
