/** Kinds of {@link WorkerEvent}; the metrics and the chaos checker count them. */
export type WorkerEventKind =
  | 'claimed'
  | 'taken-over'
  | 'replayed'
  | 'replayed-failure'
  | 'result-expired'
  | 'deferred'
  | 'concurrency-limited'
  | 'coalesced'
  | 'key-reused'
  | 'invalid'
  | 'completed'
  | 'released'
  | 'failed'
  | 'lease-lost'
  | 'fenced'
  | 'lease-extended'
  | 'store-unavailable'
  | 'retention-clamped'
  | StepEventKind;

/**
 * Kinds of {@link WorkerEvent} for one call of `ctx.step` (named in `step`): ran under this
 * claim and recorded; replayed (returned a result an earlier run recorded); lease-lost (the
 * record was refused: another worker took the key over); failed (the step threw, or the
 * determinism guard refused the call).
 */
export type StepEventKind = 'step-ran' | 'step-replayed' | 'step-lease-lost' | 'step-failed';

/** One thing that happened to a job (a message), emitted as `'event'` by every worker and consumer. */
export interface WorkerEvent {
  /** What happened: see {@link WorkerEventKind}. */
  readonly kind: WorkerEventKind;
  /** The BullMQ job id, or the broker's message id. */
  readonly jobId?: string;
  /** The key's scope, once the message's identity was read. */
  readonly scope?: string;
  /** The message's idempotency key, once read. */
  readonly key?: string;
  /** The claim's fence, on events of a held claim. */
  readonly fence?: number;
  /** Handler run time, on `completed`. */
  readonly durationMs?: number;
  /** The step's name, on step events. */
  readonly step?: string;
  /** The step's 1-based position in its key's sequence, on step events. */
  readonly position?: number;
  /**
   * On `store-unavailable`: what Postgres answered, SQLSTATE first when there is one (e.g.
   * `53100 could not extend file …: No space left on device`), for a health check to say.
   */
  readonly cause?: string;
  /** The job's concurrency key, on `concurrency-limited` (deferred: its key at its limit). */
  readonly concurrencyKey?: string;
  /**
   * On `retention-clamped` (the job asked for a retention above the workers' bound and got the
   * bound; it still runs): which part, `resultMs` or `tombstoneMs`.
   */
  readonly retentionPart?: 'resultMs' | 'tombstoneMs';
}
