import type { KeyRecord, StepRecord, TombstoneRecord } from '../store/records.js';

/** One step of a key, as the job view shows it. */
export interface JobKeyStepView {
  /** The step's name (`ctx.step`'s first argument). */
  readonly name: string;
  /** `recorded`, or `started, not recorded` (an external step whose run stopped before it recorded). */
  readonly state: string;
  /** How many times the step started. */
  readonly starts: number;
  /** The recorded result. */
  readonly result?: unknown;
}

/** A deleted key's tombstone, as the job view shows it. */
export interface JobKeyTombstoneView {
  /** How the key finished: `completed` or `failed`. */
  readonly outcome: string;
  /** When it finished (ISO 8601, the database's clock). */
  readonly finishedAt: string;
  /** Until when a duplicate is refused (ISO 8601). */
  readonly refusesDuplicatesUntil: string;
}

/** What a queue dashboard shows of one job's idempotency key: plain JSON, every value text or numbers. */
export interface JobKeyView {
  /** The key's scope. */
  readonly scope: string;
  /** The idempotency key. */
  readonly key: string;
  /**
   * Where the key is: `processing`, `completed`, `failed`; `deleted (tombstone)` once the janitor
   * deleted it after its retention; `not claimed yet` before a worker took the job.
   */
  readonly status: string;
  /** Whose run made the effect: this job's, or another job's that this one replays. Absent until a run claimed the key. */
  readonly effect?: string;
  /** The current claim's token (`null` once released); absent without a row. */
  readonly owner?: string | null;
  /** Bumped on every claim and takeover; a completion must carry the current one. */
  readonly fence?: number;
  /** Claims so far (the first and every takeover). */
  readonly claims?: number;
  /** The lease by the database's clock: how long is left, or when it ended. */
  readonly lease?: string;
  /** The key's steps (`ctx.step`), in order. */
  readonly steps?: readonly JobKeyStepView[];
  /** The stored result of a completed key (what duplicates replay). */
  readonly result?: unknown;
  /** The stored error of a failed key, or of its last retryable failure. */
  readonly error?: unknown;
  /** A deleted key's tombstone: how it finished, and until when duplicates are refused. */
  readonly tombstone?: JobKeyTombstoneView;
  /** The key's page in the key inspector, when the adapter knows where it is. */
  readonly inspector?: string;
}

/** The key's state as one line, for the job's name in the list (`charge · key completed, fence 1`). */
export function keySummary(view: JobKeyView): string {
  if (view.status === 'completed' && view.effect?.startsWith('replays')) return `key completed by another job (replayed)`;
  if (view.fence !== undefined) return `key ${view.status}, fence ${view.fence}`;
  return `key ${view.status}`;
}

/** The view of one key, from what the store read of it (`record`, `steps`, `tombstone`) at the database time `now`. */
export function jobKeyView(input: {
  readonly jobId: string | undefined;
  readonly scope: string;
  readonly key: string;
  readonly record: KeyRecord | undefined;
  readonly steps: readonly StepRecord[];
  readonly tombstone: TombstoneRecord | undefined;
  readonly now: Date;
  readonly inspector: string | undefined;
}): JobKeyView {
  const { record, scope, key, now } = input;
  const link = input.inspector === undefined ? {} : { inspector: input.inspector };
  if (!record) {
    if (input.tombstone) {
      const tombstone = input.tombstone;
      return {
        scope,
        key,
        status: 'deleted (tombstone)',
        tombstone: { outcome: tombstone.outcome, finishedAt: tombstone.finishedAt.toISOString(), refusesDuplicatesUntil: tombstone.expiresAt.toISOString() },
        ...link,
      };
    }
    return { scope, key, status: 'not claimed yet', ...link };
  }
  const ranHere = record.jobId !== null && record.jobId === input.jobId;
  const effect =
    record.jobId === null
      ? undefined
      : ranHere
        ? "this job's run"
        : `replays job ${record.jobId}'s run${record.queue ? ` (queue ${record.queue})` : ''}: this job ran no effect of its own`;
  return {
    scope,
    key,
    status: record.status,
    ...(effect !== undefined ? { effect } : {}),
    owner: record.owner,
    fence: record.fence,
    claims: record.attempts,
    lease: leaseOf(record, now),
    steps: input.steps.map((step) => ({
      name: step.name,
      state: step.recordedAt ? 'recorded' : 'started, not recorded',
      starts: step.starts,
      ...(step.recordedAt ? { result: step.result } : {}),
    })),
    ...(record.status === 'completed' ? { result: record.result } : {}),
    ...(record.error !== null && record.error !== undefined ? { error: record.error } : {}),
    ...link,
  };
}

function leaseOf(record: KeyRecord, now: Date): string {
  if (record.status !== 'processing') return 'none (the key is settled)';
  if (record.owner === null) return 'none (released: the next claim takes the key over)';
  if (record.lockedUntil === null) return 'none (a single-transaction claim)';
  const leftMs = record.lockedUntil.getTime() - now.getTime();
  return leftMs >= 0 ? `${(leftMs / 1000).toFixed(1)} s left` : `ended ${(-leftMs / 1000).toFixed(1)} s ago (the next claim takes the key over)`;
}
