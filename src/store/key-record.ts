/** A key's status: being worked on under a lease, done (result stored), or failed for good. */
export type KeyStatus = 'processing' | 'completed' | 'failed';

/** One row of `idempotency_keys`, as the library hands it out. */
export interface KeyRecord {
  /** Namespace of the key; keys are unique per scope. */
  readonly scope: string;
  /** The idempotency key. */
  readonly key: string;
  /** Fingerprint of the payload the key was first claimed with; a different one is refused as key reuse. */
  readonly fingerprint: string;
  /** Where the key is in its life: `processing`, `completed` or `failed`. */
  readonly status: KeyStatus;
  /** Token of the current claim; `null` once released after a retryable failure. */
  readonly owner: string | null;
  /** Bumped on every claim and takeover; a completion must carry the current fence. */
  readonly fence: number;
  /** Number of claims (first claim and every takeover). */
  readonly attempts: number;
  /** End of the current lease, by the database clock; `null` when no lease is held (completed, failed, or a fast-path claim). */
  readonly lockedUntil: Date | null;
  /** The stored result of a `completed` key (replayed to duplicates); `null` otherwise. */
  readonly result: unknown;
  /** The stored error ({@link StoredError}) of a `failed` key, or of the last retryable failure; `null` otherwise. */
  readonly error: unknown;
  /** Id of the job that claimed the key last (BullMQ job id, broker message id), when the claim named one. */
  readonly jobId: string | null;
  /** Queue of that job, when the claim named one; the sweeper asks this queue about the job. */
  readonly queue: string | null;
  /** Name of that job, when the claim named one. */
  readonly jobName: string | null;
  /** The job payload, when the producer asked for it to be stored (lets the sweeper re-enqueue). */
  readonly payload: unknown;
  /** When the key was first claimed (database clock). */
  readonly createdAt: Date;
  /** When the row last changed: a claim, an extension, a step, the completion. */
  readonly updatedAt: Date;
  /** When the key completed or failed; `null` while processing. */
  readonly completedAt: Date | null;
  /** When the janitor may delete a settled key (completion plus the retention); `null` while processing. */
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
