import pg from 'pg';
import type { ClaimInput } from '../key-store.js';
import { compareLockOrder } from '../lock-order.js';

/** A key an optimistic group writes at its end: its claim input (`'complete'` mode) and the effect's result. */
export interface CompletedKeyRow {
  /** The key's claim input, in `'complete'` mode (its owner token becomes the row's). */
  readonly input: ClaimInput;
  /** JSON text of the result, or null when the effect returned nothing. */
  readonly resultJson: string | null;
}

/**
 * An optimistic group's keys, written once each at the group's end, as literal SQL that rides
 * with the COMMIT: every key inserted as `completed` with its result, as the fast path's claim
 * followed by its result would leave it (fence 1, attempts 1, owner the claim's token).
 *
 * A plain insert, with no `on conflict`: a key that has a row (settled, leased, or inserted by a
 * transaction that committed while this group ran) fails the whole statement with a unique
 * violation, Postgres skips the COMMIT after it, and the group rolls back: nothing of it is kept,
 * and its jobs run again the careful way (claim first). Writing the key after the effect is
 * invisible to every other transaction, since both commit together: a concurrent duplicate that
 * inserted the key first wins, and this group's insert waits on its index entry, then fails.
 *
 * The wait is bounded by `lockTimeoutMs` (`set local`: it holds until the COMMIT, which is next).
 * Rows go in lock order (`lock-order.ts`), so two groups that share keys wait in one order.
 */
export function insertCompletedKeysText(schema: string, rows: readonly CompletedKeyRow[], lockTimeoutMs: number): string[] {
  if (rows.length === 0) return [];
  const ordered = [...rows].sort((a, b) => compareLockOrder(a.input, b.input));
  const text = (value: string | null | undefined) => (value == null ? 'null' : pg.escapeLiteral(value));
  const values = ordered.map(({ input, resultJson }) =>
    [
      text(input.scope),
      text(input.key),
      text(input.fingerprint),
      `'completed'`,
      `${text(input.owner)}::uuid`,
      '1',
      '1',
      `${text(input.jobId)}`,
      `${text(input.queue)}`,
      `${text(input.jobName)}`,
      `${text(input.payloadJson)}::jsonb`,
      `${text(resultJson)}::jsonb`,
      'now()',
      `now() + ${milliseconds(input.retentionMs)} * interval '1 millisecond'`,
    ].join(', '),
  );
  return [
    `set local lock_timeout = ${milliseconds(lockTimeoutMs)}`,
    `insert into ${pg.escapeIdentifier(schema)}.idempotency_keys ` +
      '(scope, key, fingerprint, status, owner, fence, attempts, job_id, queue, job_name, payload, result, completed_at, expires_at) values ' +
      values.map((row) => `(${row})`).join(', '),
  ];
}

function milliseconds(value: number): string {
  if (!Number.isSafeInteger(value) || value < 0) throw new RangeError(`expected a whole number of milliseconds, got ${value}`);
  return String(value);
}
