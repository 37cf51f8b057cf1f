import { DEFAULT_SCOPE } from '../protocol/validate.js';
import { MessageSpans } from '../telemetry/message-spans.js';
import { tracingOff } from '../telemetry/otel-api.js';
import { contextFromCarrier } from '../telemetry/trace-carrier.js';
import { messageAttributes } from '../telemetry/trace-attributes.js';
import type { OutboxRow } from '../store/records.js';

function rowAttributes(row: OutboxRow, operation: 'send' | 'receive') {
  const data = (row.data ?? {}) as { idempotencyKey?: unknown; scope?: unknown };
  return () => messageAttributes(row.queue, row.jobId, data.scope ?? DEFAULT_SCOPE, data.idempotencyKey, operation);
}

/**
 * The spans of one relay batch: per row, `outbox relay` (a child of the row's trace context,
 * written by the producer's `outbox insert`), ended once the batch committed, and its child
 * `send <queue>` around the BullMQ add, whose trace context the job's data carries on.
 */
export class RelayBatchTracing {
  readonly #rows: readonly OutboxRow[];
  readonly #relaySpans: MessageSpans | undefined;
  readonly #sendSpans = new Map<string, MessageSpans | undefined>();

  constructor(rows: readonly OutboxRow[]) {
    this.#rows = rows;
    this.#relaySpans = tracingOff()
      ? undefined
      : MessageSpans.start(
          'outbox relay',
          'consumer',
          rows.map((row) => ({ parent: contextFromCarrier(row.data), attributes: rowAttributes(row, 'receive') })),
        );
  }

  /** Starts the `send` spans of one queue's rows; returns each row's data carrying its span's context. */
  send(queue: string, rows: readonly OutboxRow[]): unknown[] {
    if (!this.#relaySpans) return rows.map((row) => row.data);
    const spans = MessageSpans.start(
      `send ${queue}`,
      'producer',
      rows.map((row) => ({ parent: this.#relaySpans!.contextOf(this.#rows.indexOf(row)), attributes: rowAttributes(row, 'send') })),
    );
    this.#sendSpans.set(queue, spans);
    return rows.map((row, i) => spans?.dataFor(i, row.data) ?? row.data);
  }

  /** Ends one queue's `send` spans with each row's add outcome. */
  sent(queue: string, outcomes: readonly string[]): void {
    const spans = this.#sendSpans.get(queue);
    outcomes.forEach((outcome, i) => spans?.setOutcome(i, outcome));
    spans?.end();
    this.#sendSpans.delete(queue);
  }

  /** Ends every span: after the commit (rows marked sent), or with the batch's error. */
  end(error?: unknown): void {
    for (const spans of this.#sendSpans.values()) if (error !== undefined) spans?.end(error);
    if (error === undefined) this.#relaySpans?.addEvent('committed');
    this.#relaySpans?.end(error);
  }
}
