/**
 * A reference model of the keys table, small enough to be obviously right: what each operation
 * of the claim protocol answers and leaves behind, for the model-based property tests
 * (`fc.commands`, see ./key-model-commands.ts) to compare Postgres with, operation by
 * operation. It states the invariants of docs/architecture.md#invariants as code: claim and
 * lease, fencing, release, failure, the fast path, steps, retention, the janitor and tombstones.
 *
 * Time is the model's own: milliseconds of the test's monotonic clock plus every `advance`, the
 * same amount the real side moves the database's timestamps back by (`shiftTimestamps`). A
 * lease, a retention and a tombstone window end when the database's `now()` reaches them, end
 * included, as the SQL has it.
 */

/** What a run asked to keep of its key (`ClaimOptions.retention`). */
export interface ModelRetention {
  readonly resultMs?: number;
  readonly tombstoneMs?: number;
}

/** A step of a key, as `job_steps` holds it. */
export interface ModelStep {
  readonly position: number;
  fence: number;
  starts: number;
  recorded: boolean;
  result: unknown;
}

/** A key's row. `owner` is the number of the claim holding it (each claim's token is its own). */
export interface ModelKey {
  readonly fingerprint: string;
  status: 'processing' | 'completed' | 'failed';
  owner: number | null;
  fence: number;
  attempts: number;
  /** When the lease ends (`processing` only). */
  lockedUntil: number | null;
  result: unknown;
  /** The stored error's message (a release's, or the failure's). */
  errorMessage: string | null;
  finishedAt: number | null;
  expiresAt: number | null;
  /** The key's own tombstone window (`tombstone_ms`), written by the completion or failure. */
  tombstoneMs: number | null;
  readonly steps: Map<string, ModelStep>;
}

/** What is left of a deleted key. */
export interface ModelTombstone {
  readonly fingerprint: string;
  readonly failed: boolean;
  readonly finishedAt: number;
  readonly expiresAt: number;
}

/** A claim the model handed out (a held claim), by its number. */
export interface ModelHandle {
  readonly claimNo: number;
  readonly key: string;
  readonly fence: number;
  readonly retention?: ModelRetention;
}

/** What a claim answers, as the model says. */
export type ModelClaimAnswer =
  | { readonly kind: 'claimed' | 'taken-over'; readonly fence: number; readonly attempts: number }
  | { readonly kind: 'completed'; readonly result: unknown; readonly expired: boolean }
  | { readonly kind: 'failed'; readonly errorMessage: string | null; readonly expired: boolean }
  | { readonly kind: 'in-progress'; readonly retryAfterMs: number }
  | { readonly kind: 'key-reused' };

/** The configuration the real side runs with. */
export interface ModelConfig {
  readonly leaseMs: number;
  /** The instance's `retentionMs`. */
  readonly retentionMs: number;
  readonly maxJobRetentionMs: number;
  readonly maxJobTombstoneMs: number;
}

/** The model: keys, tombstones, committed effects, and the claims handed out. */
export class KeyModel {
  readonly keys = new Map<string, ModelKey>();
  readonly tombstones = new Map<string, ModelTombstone>();
  /** Committed effects per key and what committed them (`effect`, or `step:<name>`). */
  readonly effects = new Map<string, string[]>();
  readonly handles: ModelHandle[] = [];
  readonly config: ModelConfig;
  #shift = 0;
  readonly #start: number;
  #claims = 0;

  constructor(config: ModelConfig, start = performance.now()) {
    this.config = config;
    this.#start = start;
  }

  /** The model's now: the test's monotonic time plus every advance. */
  now(): number {
    return performance.now() - this.#start + this.#shift;
  }

  advance(ms: number): void {
    this.#shift += ms;
  }

  /** A leased claim (`IdempotencyKeys.claim`); a held one is recorded as a handle. */
  claim(key: string, fingerprint: string, retention?: ModelRetention): ModelClaimAnswer {
    const now = this.now();
    const row = this.keys.get(key);
    if (!row) {
      const refused = this.#tombstoneAnswer(key, fingerprint, now);
      if (refused) return refused;
      this.keys.set(key, this.#newRow(fingerprint, 'processing', now));
      return this.#hold(key, 'claimed', retention);
    }
    const settled = this.#settledAnswer(row, fingerprint);
    if (settled) return settled;
    if (row.owner !== null && row.lockedUntil! > now) return { kind: 'in-progress', retryAfterMs: Math.max(1, Math.ceil(row.lockedUntil! - now)) };
    row.fence++;
    row.attempts++;
    row.lockedUntil = now + this.config.leaseMs;
    return this.#hold(key, 'taken-over', retention);
  }

  /**
   * The fast path (`IdempotencyKeys.executeOnce`): claims as completed and runs, or answers as a
   * claim would. The claim it ran under becomes a handle too (it holds nothing: its key is settled).
   */
  executeOnce(key: string, fingerprint: string, result: unknown, retention?: ModelRetention): ModelClaimAnswer | { readonly kind: 'executed'; readonly fence: number } {
    const now = this.now();
    const row = this.keys.get(key);
    if (row) {
      const settled = this.#settledAnswer(row, fingerprint);
      if (settled) return settled;
      if (row.owner !== null && row.lockedUntil! > now) return { kind: 'in-progress', retryAfterMs: Math.max(1, Math.ceil(row.lockedUntil! - now)) };
      row.fence++;
      row.attempts++;
    } else {
      const refused = this.#tombstoneAnswer(key, fingerprint, now);
      if (refused) return refused;
      this.keys.set(key, this.#newRow(fingerprint, 'completed', now));
    }
    const settledRow = this.keys.get(key)!;
    const claimNo = ++this.#claims;
    settledRow.owner = claimNo;
    this.handles.push({ claimNo, key, fence: settledRow.fence, ...(retention && { retention }) });
    this.#finish(settledRow, 'completed', now, retention);
    settledRow.result = result ?? null;
    this.#effect(key, 'effect');
    return { kind: 'executed', fence: settledRow.fence };
  }

  /** True when `handle` is the key's current claim. */
  holds(handle: ModelHandle): boolean {
    const row = this.keys.get(handle.key);
    return row !== undefined && row.status === 'processing' && row.owner === handle.claimNo && row.fence === handle.fence;
  }

  /** A heartbeat: the lease extended, the claim's own completion, or lost. */
  extend(handle: ModelHandle): 'extended' | 'completed' | 'lost' {
    const row = this.keys.get(handle.key);
    if (this.holds(handle)) {
      row!.lockedUntil = this.now() + this.config.leaseMs;
      return 'extended';
    }
    return row?.status === 'completed' && row.owner === handle.claimNo && row.fence === handle.fence ? 'completed' : 'lost';
  }

  /** The effect and the fenced completion (`runEffect`): committed, or the lease lost. */
  complete(handle: ModelHandle, result: unknown): 'completed' | 'lease-lost' {
    if (!this.holds(handle)) return 'lease-lost';
    const row = this.keys.get(handle.key)!;
    this.#finish(row, 'completed', this.now(), handle.retention);
    row.result = result;
    this.#effect(handle.key, 'effect');
    return 'completed';
  }

  release(handle: ModelHandle, errorMessage: string): boolean {
    if (!this.holds(handle)) return false;
    const row = this.keys.get(handle.key)!;
    row.owner = null;
    row.lockedUntil = this.now();
    row.errorMessage = errorMessage;
    return true;
  }

  fail(handle: ModelHandle, errorMessage: string): boolean {
    if (!this.holds(handle)) return false;
    const row = this.keys.get(handle.key)!;
    this.#finish(row, 'failed', this.now(), handle.retention);
    row.errorMessage = errorMessage;
    return true;
  }

  /** An external step's start: its start count, or the lease lost (not the current claim, or recorded already). */
  startStep(handle: ModelHandle, name: string, position: number): number | 'lease-lost' {
    if (!this.holds(handle)) return 'lease-lost';
    const steps = this.keys.get(handle.key)!.steps;
    const step = steps.get(name);
    if (step?.recorded) return 'lease-lost';
    if (!step) {
      steps.set(name, { position, fence: handle.fence, starts: 1, recorded: false, result: null });
      return 1;
    }
    step.fence = handle.fence;
    return ++step.starts;
  }

  /** A step's record (an external step's, or a database step's with its writes): recorded, or the lease lost. */
  recordStep(handle: ModelHandle, name: string, position: number, result: unknown, database: boolean): 'recorded' | 'lease-lost' {
    if (!this.holds(handle)) return 'lease-lost';
    const steps = this.keys.get(handle.key)!.steps;
    const step = steps.get(name);
    if (step?.recorded) return 'lease-lost';
    steps.set(name, { position, fence: handle.fence, starts: step?.starts ?? 1, recorded: true, result });
    if (database) this.#effect(handle.key, `step:${name}`);
    return 'recorded';
  }

  /** A janitor run with tombstone window `tombstoneMs`: what it deletes. */
  janitor(tombstoneMs: number): { keysDeleted: number; tombstonesDeleted: number } {
    const now = this.now();
    let keysDeleted = 0;
    for (const [key, row] of this.keys) {
      if (row.status === 'processing' || row.expiresAt! > now) continue;
      this.keys.delete(key);
      keysDeleted++;
      const windowMs = row.tombstoneMs ?? tombstoneMs;
      if (windowMs > 0 && row.finishedAt! + windowMs > now) {
        this.tombstones.set(key, { fingerprint: row.fingerprint, failed: row.status === 'failed', finishedAt: row.finishedAt!, expiresAt: row.finishedAt! + windowMs });
      }
    }
    let tombstonesDeleted = 0;
    for (const [key, tombstone] of this.tombstones) {
      if (tombstone.expiresAt > now) continue;
      this.tombstones.delete(key);
      tombstonesDeleted++;
    }
    return { keysDeleted, tombstonesDeleted };
  }

  /** A job's retention held to the bounds, as the claim holds it. */
  bounded(retention: ModelRetention | undefined): ModelRetention | undefined {
    if (!retention) return undefined;
    const { resultMs, tombstoneMs } = retention;
    return {
      ...(resultMs !== undefined && { resultMs: Math.min(resultMs, this.config.maxJobRetentionMs) }),
      ...(tombstoneMs !== undefined && { tombstoneMs: Math.min(tombstoneMs, this.config.maxJobTombstoneMs) }),
    };
  }

  #hold(key: string, kind: 'claimed' | 'taken-over', retention: ModelRetention | undefined): ModelClaimAnswer {
    const row = this.keys.get(key)!;
    const claimNo = ++this.#claims;
    row.owner = claimNo;
    const bounded = this.bounded(retention);
    this.handles.push({ claimNo, key, fence: row.fence, ...(bounded && { retention: bounded }) });
    return { kind, fence: row.fence, attempts: row.attempts };
  }

  #newRow(fingerprint: string, status: 'processing' | 'completed', now: number): ModelKey {
    return {
      fingerprint,
      status,
      owner: null,
      fence: 1,
      attempts: 1,
      lockedUntil: status === 'processing' ? now + this.config.leaseMs : null,
      result: null,
      errorMessage: null,
      finishedAt: null,
      expiresAt: null,
      tombstoneMs: null,
      steps: new Map(),
    };
  }

  #finish(row: ModelKey, status: 'completed' | 'failed', now: number, retention: ModelRetention | undefined): void {
    const bounded = this.bounded(retention);
    row.status = status;
    row.lockedUntil = null;
    row.finishedAt = now;
    row.expiresAt = now + (bounded?.resultMs ?? this.config.retentionMs);
    row.tombstoneMs = bounded?.tombstoneMs ?? null;
  }

  #settledAnswer(row: ModelKey, fingerprint: string): ModelClaimAnswer | undefined {
    if (row.fingerprint !== fingerprint) return { kind: 'key-reused' };
    if (row.status === 'completed') return { kind: 'completed', result: row.result, expired: false };
    if (row.status === 'failed') return { kind: 'failed', errorMessage: row.errorMessage, expired: false };
    return undefined;
  }

  #tombstoneAnswer(key: string, fingerprint: string, now: number): ModelClaimAnswer | undefined {
    const tombstone = this.tombstones.get(key);
    if (!tombstone || tombstone.expiresAt <= now) return undefined;
    if (tombstone.fingerprint !== fingerprint) return { kind: 'key-reused' };
    return tombstone.failed ? { kind: 'failed', errorMessage: null, expired: true } : { kind: 'completed', result: null, expired: true };
  }

  #effect(key: string, what: string): void {
    this.effects.set(key, [...(this.effects.get(key) ?? []), what]);
  }
}
