/**
 * The records the store hands out and takes in: keys, steps, claims, statistics, audit entries,
 * pages and the outbox's rows. A leaf: the statement files in `sql/`, the store's interfaces and
 * their callers all import their records from here, and this module imports nothing.
 */
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
  /**
   * The key's own tombstone window, as its job asked ({@link KeyRetention.tombstoneMs}): the
   * janitor keeps its tombstone this long after it finished; `null`: the janitor's `tombstoneMs`.
   */
  readonly tombstoneMs: number | null;
}

/**
 * How long one job's key is kept, as the job asked (bounded by the worker's configuration):
 * its result, and its tombstone once the janitor deleted it. Unset parts: the configured ones
 * (`retentionMs`, the janitor's `tombstoneMs`).
 */
export interface KeyRetention {
  /** How long the finished key (its result or error) is kept and replayed, from when it finished. @defaultValue the worker's `retentionMs` */
  readonly resultMs?: number;
  /**
   * How long, from when the key finished, its tombstone refuses duplicates once the janitor
   * deleted the key; `0`: no tombstone for this key. @defaultValue the janitor's `tombstoneMs`
   */
  readonly tombstoneMs?: number;
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
  /** A bigint: text from node-postgres; absent from a row read before migration 023. */
  tombstone_ms?: string | number | null;
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
    tombstoneMs: row.tombstone_ms === null || row.tombstone_ms === undefined ? null : Number(row.tombstone_ms),
  };
}

/**
 * What {@link KeyStore.claim} needs; the schema is the store's own.
 *
 * Not stable: may change in a minor release.
 *
 * @interface
 * @experimental
 */
export type ClaimInput = Omit<ClaimStatementInput, 'schema'>;

/**
 * A key a group writes at its end: its claim input (`'complete'` mode) and the effect's result.
 *
 * Not stable: may change in a minor release.
 *
 * @experimental
 */
export interface CompletedKeyRow {
  /** The key's claim input, in `'complete'` mode (its owner token becomes the row's). */
  readonly input: ClaimInput;
  /** JSON text of the result, or null when the effect returned nothing. */
  readonly resultJson: string | null;
}

/** Everything one claim statement needs. */
export interface ClaimStatementInput {
  /** Postgres schema of the keys table. */
  readonly schema: string;
  /** Namespace of the key; keys are unique per scope. */
  readonly scope: string;
  /** The idempotency key. */
  readonly key: string;
  /** Fingerprint of the payload; a key claimed before with another one is `key-reused`. */
  readonly fingerprint: string;
  /** Fresh random token for this claim. */
  readonly owner: string;
  /** Length of the lease a `'lease'` claim takes, by the database clock. */
  readonly leaseMs: number;
  /** Longest wait on the key's row lock (another transaction inserting or updating it) before the claim answers `in-progress`. */
  readonly lockTimeoutMs: number;
  /**
   * `'lease'`: claim as `processing` under a lease (the effect commits later, fenced).
   * `'complete'`: the fast path: claim as `completed` inside the caller's open transaction,
   * so the claim commits, or rolls back, with the effect.
   */
  readonly mode: 'lease' | 'complete';
  /** Used in `'complete'` mode: when the completed key expires. */
  readonly retentionMs: number;
  /** Used by a group's fast-path keys (written completed at the group's end): the key's own tombstone window. @defaultValue `null` (the janitor's) */
  readonly tombstoneMs?: number | null;
  /** Id of the job making the claim, kept on the row for operators and the sweeper. @defaultValue `null` */
  readonly jobId?: string | null;
  /** Queue of that job, kept on the row; the sweeper asks it about the job. @defaultValue `null` */
  readonly queue?: string | null;
  /** Name of that job, kept on the row (a re-enqueued job gets it). @defaultValue `null` */
  readonly jobName?: string | null;
  /** JSON text of the payload to keep with the key (lets the sweeper re-enqueue). @defaultValue `null` (not kept) */
  readonly payloadJson?: string | null;
  /**
   * `false`: a `'lease'` claim commits with `synchronous_commit = off` (no wait for the WAL
   * flush). Ignored in `'complete'` mode, whose commit is the effect's. @defaultValue `true`
   */
  readonly synchronousCommit?: boolean;
  /**
   * A `'lease'` claim: the concurrency keys and limits its run holds slots of, recorded in
   * `key_concurrency_limits` by the claim's own statement (the key's records of other concurrency
   * keys dropped), so that the sweeper adds the job again under them should the key be lost. Set
   * when a slot was not taken for this key (a kept slot lent to its run), whose take would have
   * recorded it. @defaultValue unset (nothing recorded)
   */
  readonly concurrency?: readonly ConcurrencyRecord[];
}

/** A concurrency key and limit a key runs under, as `key_concurrency_limits` keeps it. */
export interface ConcurrencyRecord {
  /** The concurrency key, e.g. `tenant:acme` (1–255 characters). */
  readonly key: string;
  /** Its limit: how many of its jobs may run at once (a whole number, at least 1). */
  readonly limit: number;
}

/** One row of `claim_key` (and, with its index, of `claim_keys`). */
export interface ClaimRow {
  outcome: 'claimed' | 'taken-over' | 'existing';
  fence: string;
  attempts: number;
  locked_until: Date | null;
  status: 'processing' | 'completed' | 'failed';
  fingerprint: string;
  claimable: boolean;
  result: unknown;
  error: unknown;
  retry_after_ms: string;
}

/** A `claim_keys` row: the claim row of input number `idx` (1-based). */
export interface BatchClaimRow extends ClaimRow {
  readonly idx: number;
}

/**
 * What a heartbeat's extension found: the new lease expiry (a `Date`); `'completed'`: the key
 * was completed under this very claim (owner token and fence), i.e. its own job committed; or
 * `null`: the claim was taken over, released or failed, so the lease is lost.
 *
 * Not stable: may change in a minor release.
 *
 * @experimental
 */
export type LeaseExtension = Date | 'completed' | null;

/**
 * A step's place in its key's sequence.
 *
 * Not stable: may change in a minor release.
 *
 * @experimental
 */
export interface StepPlace {
  /** The step's name, unique within its key. */
  readonly name: string;
  /** 1-based position. */
  readonly position: number;
}

/**
 * One row of `job_steps`, as the library hands it out.
 *
 * Not stable: may change in a minor release.
 *
 * @experimental
 */
export interface StepRecord {
  /** The step's name (the first argument of `ctx.step`), unique within its key. */
  readonly name: string;
  /** 1-based position in the key's step sequence. */
  readonly position: number;
  /** The claim that last started or recorded the step. */
  readonly fence: number;
  /** How many times the step started (external steps; a database step records with 1). */
  readonly starts: number;
  /** The stored result; null until recorded. */
  readonly result: unknown;
  /** When the step last started (an external step; a run after a takeover starts it again) or was recorded (a database step). */
  readonly startedAt: Date;
  /** When the step was recorded; null for an external step that started and never recorded. */
  readonly recordedAt: Date | null;
}

/** A key's row as the settled-key probe sees it. */
export interface SettledKeyRow {
  readonly scope: string;
  readonly key: string;
  readonly status: 'processing' | 'completed' | 'failed';
  readonly fingerprint: string;
  readonly result: unknown;
  readonly error: unknown;
}

/** How the keys table of a schema is stored. */
export interface KeysTableLayout {
  /** False before the first migration created the table. */
  readonly exists: boolean;
  /**
   * Its hash partitions, by name in the schema, in partition order (remainder 0 first); empty
   * when the table is one plain table.
   */
  readonly partitions: readonly string[];
}

/** Filters of a key listing (`keys list`). */
export interface ListKeysFilter {
  readonly status?: KeyStatus;
  readonly scope?: string;
  /**
   * Only keys whose time is up: completed or failed past `expires_at` (waiting for the
   * janitor), or processing with an expired lease (waiting for a takeover or the sweeper).
   */
  readonly expired?: boolean;
  readonly limit: number;
}

/** A position between two keys in (scope, key) order: a page starts after it or ends before it. */
export interface KeyCursor {
  readonly scope: string;
  readonly key: string;
}

/** What a page of keys lists, and where. */
export interface KeyPageRequest {
  readonly status?: KeyStatus;
  readonly scope?: string;
  /** The page after this key (the next page); omitted with `before`: the first page. */
  readonly after?: KeyCursor;
  /** The page before this key (the previous page). */
  readonly before?: KeyCursor;
  readonly limit: number;
}

/** One page of keys in (scope, key) order, and whether more lie beyond it in the direction read. */
export interface KeyPage {
  readonly records: KeyRecord[];
  /** Reading forward: there is a next page; reading backward: there is a previous one. */
  readonly more: boolean;
}

/** The lists of the key inspector's overview. */
export type RecentKeysKind = 'expired-lease' | 'failed' | 'taken-over';

/** A snapshot of the keys table (and the outbox) for `stats` and the gauges. */
export interface KeyStats {
  /** Keys being worked on (under a lease, or released for a retry). */
  readonly processing: number;
  /** Keys completed, their results kept for replay until they expire. */
  readonly completed: number;
  /** Keys failed for good, their errors kept for replay until they expire. */
  readonly failed: number;
  /** Processing keys whose lease has run out (crashed owners, released keys not yet reclaimed). */
  readonly expiredLeases: number;
  /**
   * Processing keys whose lease ended more than the sweep horizon ago (`sweepAfterMs`): keys
   * that neither a retry nor a takeover picked up, which the sweeper examines. Nonzero for
   * long means their jobs are not running and the sweeper is not recovering them.
   */
  readonly pastSweepHorizon: number;
  /** Completed or failed keys past `expires_at` (and released HTTP request keys past theirs), waiting for the janitor. */
  readonly expiredKeys: number;
  /** Live tombstones: keys deleted after their retention whose duplicates are still refused. */
  readonly tombstones: number;
  /** The processing key created longest ago, if any. */
  readonly oldestProcessing: {
    /** The key's scope. */
    readonly scope: string;
    /** The key. */
    readonly key: string;
    /** When it was first claimed. */
    readonly createdAt: Date;
    /** How long ago that was, by the database clock. */
    readonly ageMs: number;
  } | null;
  /** Outbox rows not yet relayed to BullMQ. */
  readonly outboxUnsent: number;
  /** Age of the oldest unsent outbox row, or null. */
  readonly oldestUnsentAgeMs: number | null;
}

/** Options of the key statistics. */
export interface KeyStatsOptions {
  /** Lease end this long ago puts a processing key past the sweep horizon. @defaultValue `900_000` (the sweeper's default) */
  readonly sweepAfterMs?: number;
}

/** One operator action on a key (a row of `key_audit`). */
export interface KeyAuditEntry {
  readonly id: number;
  readonly scope: string;
  readonly key: string;
  /** What was done, e.g. `release`. */
  readonly action: string;
  /** Who did it: an admin token's name, or `cli:<user>`. */
  readonly actor: string;
  readonly reason: string;
  /** What the action found and changed, e.g. `{previous_status, fence}`. */
  readonly detail: unknown;
  readonly at: Date;
}

/** A key released by an operator: its new row and the status it had before. */
export interface OperatorRelease {
  readonly record: KeyRecord;
  readonly previousStatus: KeyStatus;
}

/** Who released a key and why (stored on the key and in `key_audit`). */
export interface OperatorReleaseInput {
  readonly scope: string;
  readonly key: string;
  readonly reason: string;
  /** The operator: the key inspector's admin token name, or `cli:<user>` for the CLI. */
  readonly actor: string;
}

/**
 * What is left of a finished key after its retention (a tombstone): no payload, no result; a
 * duplicate of it is answered "completed (or failed), result expired" and never runs again.
 */
export interface TombstoneRecord {
  readonly scope: string;
  readonly key: string;
  /** How the key finished. */
  readonly outcome: 'completed' | 'failed';
  /** When the key finished (database clock). */
  readonly finishedAt: Date;
  /** When the tombstone expires and the key is free again (database clock). */
  readonly expiresAt: Date;
  /** SHA-256 (hex) of the key's fingerprint: a duplicate with another fingerprint is `KEY_REUSED`. */
  readonly fingerprintHash: string;
}

/** The pending successor a finished coalescing run hands on. */
export interface CoalesceSuccessor {
  /** The successor's generation: its idempotency key is `<key>#<generation>`. */
  readonly generation: number;
  /** The newest payload that arrived while the run was in flight. */
  readonly payload: unknown;
}

/**
 * What a coalescing job's arrival came to: run generation `generation` with `payload`, folded into
 * the run in flight, or (the job that ran the key's last generation, delivered again) nothing
 * left to run.
 */
export type CoalesceAnswer =
  | {
      /** Run now, as generation `generation`. */
      readonly action: 'run';
      /** The generation to run: its idempotency key is `<key>#<generation>`. */
      readonly generation: number;
      /** The payload to run with. */
      readonly payload: unknown;
    }
  | {
      /** Folded into the run in flight: its pending successor carries this payload now. */
      readonly action: 'coalesced';
    }
  | {
      /**
       * This job ran generation `generation`, which has ended (its key completed or failed, or
       * deleted since), and no successor is pending: nothing runs (its key replays the result
       * while it is kept).
       */
      readonly action: 'finished';
      /** The generation this job ran last. */
      readonly generation: number;
    };

/** One key the janitor deleted. */
export interface DeletedKey {
  readonly scope: string;
  readonly key: string;
  /** True for a completed or failed key; false for a released one whose expiry passed (see `sql/delete-expired-keys.ts`). */
  readonly finished: boolean;
}

/** A `processing` key whose lease ended long ago: a candidate for the sweeper. */
export interface LostKeyCandidate {
  readonly scope: string;
  readonly key: string;
  readonly fence: number;
  /** The owner token the key was left under (null once released); the abandon is conditioned on it. */
  readonly owner: string | null;
  readonly lockedUntil: Date;
  /** `locked_until` as Postgres text, exact to the microsecond (a Date keeps milliseconds only); for the cursor. */
  readonly lockedUntilExact: string;
  readonly jobId: string | null;
  readonly queue: string | null;
  readonly jobName: string | null;
  /** True when a payload was stored with the key (even a JSON `null` payload). */
  readonly hasPayload: boolean;
  readonly payload: unknown;
  /** The concurrency key and limit the key took a slot under, if its job named one; each of them (sorted by key), if several. */
  readonly concurrency?: { readonly key: string; readonly limit: number } | ReadonlyArray<{ readonly key: string; readonly limit: number }>;
  /**
   * When the key is a run of a coalescing key (`<key>#<generation>`) handed to the job that
   * claimed it: the coalescing key and the run's payload. That job, added again under its own id,
   * runs the same generation again, and then its pending successor.
   */
  readonly coalescing?: { readonly key: string; readonly payload: unknown };
}

/** Where the previous page ended (keyset pagination). */
export interface LostKeyCursor {
  /** {@link LostKeyCandidate.lockedUntilExact} of the last key read. */
  readonly lockedUntil: string;
  readonly scope: string;
  readonly key: string;
}

/** Which key the sweeper gives up on, and the state it saw it in. */
export interface AbandonKeyInput {
  readonly scope: string;
  readonly key: string;
  /** The fence the sweeper saw; a claim since then changes it and the key is left alone. */
  readonly fence: number;
  /** The owner token the sweeper saw (null: released); a release or claim since then changes it. */
  readonly owner: string | null;
  readonly sweepAfterMs: number;
  readonly retentionMs: number;
  /** Why, for the stored error's message. */
  readonly reason: string;
}

/** One job waiting in the outbox for the relay to add it to BullMQ. */
export interface OutboxRow {
  readonly id: string;
  readonly queue: string;
  readonly jobName: string;
  readonly jobId: string;
  readonly data: unknown;
  readonly opts: Record<string, unknown>;
  /** When the producer wrote the row (the database clock, milliseconds since the epoch): when its job was sent. */
  readonly createdAtMs: number;
}

/** What the producer writes into the outbox. */
export type OutboxEntry = Omit<OutboxRow, 'id' | 'createdAtMs'>;


/** How a schedule's ticks are given: a cron expression, or a fixed interval in milliseconds. */
export type ScheduleKind = 'cron' | 'interval';

/** After downtime: enqueue only the latest missed tick, or every missed tick up to `max_missed`. */
export type MissedTicksPolicy = 'latest' | 'all';

/** A schedule as `schedules/upsert` writes it (validated by ops/schedule-spec.ts first). */
export interface ScheduleInput {
  readonly name: string;
  readonly kind: ScheduleKind;
  /** The cron expression, or the interval in milliseconds as decimal text. */
  readonly spec: string;
  readonly timezone: string;
  readonly queue: string;
  readonly jobName: string;
  readonly payloadJson: string;
  readonly missed: MissedTicksPolicy;
  readonly maxMissed: number;
}

/** One row of `schedules`, with the database's `now()` when it was read. */
export interface ScheduleRow {
  readonly name: string;
  readonly kind: ScheduleKind;
  readonly spec: string;
  readonly timezone: string;
  readonly queue: string;
  readonly job_name: string;
  readonly payload: unknown;
  readonly missed: MissedTicksPolicy;
  readonly max_missed: number;
  /** Every tick at or before it has been enqueued. */
  readonly cursor: Date;
  /** The latest tick enqueued; null before the first. */
  readonly last_tick: Date | null;
  readonly created_at: Date;
  readonly updated_at: Date;
  readonly db_now: Date;
}

/** One arrival of a coalescing job, as the store's `coalesce_arrive` function takes it. */
export interface CoalesceArrival {
  /** The key's scope. */
  readonly scope: string;
  /** The coalescing key (its generations are `<key>#<generation>`). */
  readonly key: string;
  /** The arriving job's (message's) id: a redelivery of the running job is told by it. */
  readonly jobId: string;
  /** The job's payload, as JSON. */
  readonly payloadJson: string;
  /** How long a generation handed out without a key row counts as running (then abandoned). */
  readonly staleMs: number;
  /**
   * When the producer sent the job (ms since the epoch: BullMQ's job timestamp, JetStream's
   * stored time), when the broker says: an arrival sent before a payload the key already took
   * is superseded by it. Undefined, or later than the database's clock: the job counts as sent
   * at its first arrival, by the database's clock (remembered for every later delivery).
   */
  readonly sentAtMs?: number;
}
