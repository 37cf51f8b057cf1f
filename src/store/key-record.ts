/** A key's status: being worked on under a lease, done (result stored), or failed for good. */
export type KeyStatus = 'processing' | 'completed' | 'failed';

/** One row of `idempotency_keys`, as the library hands it out. */
export interface KeyRecord {
  readonly scope: string;
  readonly key: string;
  readonly fingerprint: string;
  readonly status: KeyStatus;
  /** Token of the current claim; `null` once released after a retryable failure. */
  readonly owner: string | null;
  /** Bumped on every claim and takeover; a completion must carry the current fence. */
  readonly fence: number;
  /** Number of claims (first claim and every takeover). */
  readonly attempts: number;
  readonly lockedUntil: Date | null;
  readonly result: unknown;
  readonly error: unknown;
  readonly jobId: string | null;
  readonly queue: string | null;
  readonly jobName: string | null;
  /** The job payload, when the producer asked for it to be stored (lets the sweeper re-enqueue). */
  readonly payload: unknown;
  readonly createdAt: Date;
  readonly updatedAt: Date;
  readonly completedAt: Date | null;
  readonly expiresAt: Date | null;
}

/** The columns of `idempotency_keys` as Kysely sees them. */
export interface IdempotencyKeysTable {
  scope: string;
  key: string;
  fingerprint: string;
  status: KeyStatus;
  owner: string | null;
  fence: string | number;
  attempts: number;
  locked_until: Date | null;
  result: unknown;
  error: unknown;
  job_id: string | null;
  queue: string | null;
  job_name: string | null;
  payload: unknown;
  created_at: Date;
  updated_at: Date;
  completed_at: Date | null;
  expires_at: Date | null;
}

/** Maps a raw row (snake_case, bigint fence as string) to a {@link KeyRecord}. */
export function toKeyRecord(row: IdempotencyKeysTable): KeyRecord {
  return {
    scope: row.scope,
    key: row.key,
    fingerprint: row.fingerprint,
    status: row.status,
    owner: row.owner,
    fence: Number(row.fence),
    attempts: row.attempts,
    lockedUntil: row.locked_until,
    result: row.result,
    error: row.error,
    jobId: row.job_id,
    queue: row.queue,
    jobName: row.job_name,
    payload: row.payload,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    completedAt: row.completed_at,
    expiresAt: row.expires_at,
  };
}
