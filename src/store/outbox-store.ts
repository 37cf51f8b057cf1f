import type { Kysely } from 'kysely';
import type { OutboxEntry, OutboxRow } from './records.js';
import { insertOutboxRows, lockUnsentOutboxRows, markOutboxRowsSent } from './sql/outbox.js';

/**
 * The outbox's statements, for the producer (rows written in the caller's transaction) and the
 * relay (rows taken and marked sent in its own). Each takes the transaction it runs in; the
 * statements and why they are written so are in `sql/outbox.ts`.
 */
export class OutboxStore {
  constructor(
    /** Schema holding the `outbox` table. */
    readonly schema: string,
  ) {}

  /** Writes jobs into the outbox inside `tx`: they exist if and only if it commits. */
  insert(tx: Kysely<any>, entries: readonly OutboxEntry[]): Promise<void> {
    return insertOutboxRows(tx, this.schema, entries);
  }

  /** Locks the oldest unsent rows in `tx` for this relay, except `excludedIds`. */
  lockUnsent(tx: Kysely<any>, limit: number, excludedIds: readonly string[] = []): Promise<OutboxRow[]> {
    return lockUnsentOutboxRows(tx, this.schema, limit, excludedIds);
  }

  /** Marks rows delivered to BullMQ, in `tx`. */
  markSent(tx: Kysely<any>, ids: readonly string[]): Promise<void> {
    return markOutboxRowsSent(tx, this.schema, ids);
  }
}
