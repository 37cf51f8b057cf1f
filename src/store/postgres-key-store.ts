import type { CompiledQuery, Kysely } from 'kysely';
import { ResultNotStorableError, ValidationError } from '../errors.js';
import { freshCompletingClaim, lockWaitTimedOut, tombstoneOutcome, type Claim, type ClaimOutcome } from './claim-outcome.js';
import type { GroupStatements, KeyStore, StepStore, WatchedState } from './key-store.js';
import { isLockTimeout, isUnstorableJson } from './pg-errors.js';
import { ClaimBatcher } from './claim-batcher.js';
import { findSettledKeys } from './sql/find-settled-keys.js';
import { StatementBatcher } from './statement-batcher.js';
import { SlotBatcher } from './slot-batcher.js';
import { WakeBatcher } from './wake-batcher.js';
import { claimKey } from './sql/claim.js';
import { claimNewKey } from './sql/claim-new-key.js';
import { tombstoneOf } from './sql/tombstones.js';
import { coalesceArrive, coalesceNext } from './sql/coalescing.js';
import type { CoalesceAnswer, CoalesceArrival, CoalesceSuccessor } from './records.js';
import type { SlotAnswer, SlotRequest } from './sql/concurrency-slots.js';
import { renewConcurrencySlots, type HeldSlot } from './sql/concurrency-slot-wakes.js';
import { forgetConcurrencyWaiter, takeConcurrencySlotsInTransaction, wakeConcurrencyWaiters, type SlotsInTransactionAnswer, type SlotsInTransactionRequest } from './sql/concurrency-slots-in-transaction.js';
import { completeAndCommit, completeKey, completionStatement, storeFastPathResult, storeResultAndCommit } from './sql/complete-and-commit.js';
import { extendLease } from './sql/extend.js';
import { failKey } from './sql/fail.js';
import { getKey } from './sql/get-key.js';
import { insertCompletedKeysStatement, rowsThatHadKeys } from './sql/insert-completed-keys.js';
import { WATCHED_SETTINGS, checkGroupStateStatement, checkPreparedStatementsStatement, codeCanLeaveState, customSettingNames, keepGroupStateStatement } from './sql/group-settings.js';
import { loadSteps } from './sql/load-steps.js';
import { recordStep, recordStepAndCommit, recordStepIn, recordStepStatement } from './sql/record-step.js';
import { releaseKey } from './sql/release.js';
import { startStep } from './sql/start-step.js';
import type { ClaimInput, KeyRecord, SettledKeyRow, LeaseExtension } from './records.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/**
 * Options of {@link PostgresKeyStore}.
 *
 * Not stable: may change in a minor release.
 *
 * @experimental
 */
export interface PostgresKeyStoreOptions {
  /**
   * Batch concurrent leased claims made on the store's own pool into one statement and one
   * commit (see `claim-batcher.ts`). A claim that finds no other running is sent alone at once.
   * @defaultValue `true`
   */
  readonly batchClaims?: boolean;
  /**
   * Offer {@link KeyStore.findSettled}: the fast path first reads whether a key is already
   * settled (one statement for all concurrent reads), so a duplicate replays in one round trip
   * instead of three (BEGIN, claim, ROLLBACK). The read is adaptive: while fewer than one probe
   * in five finds a settled key (as at the start), only every 16th job probes, so all-new loads
   * barely pay for it; once duplicates show up, every job probes.
   * @defaultValue `true`
   */
  readonly probeSettledKeys?: boolean;
  /**
   * How long a read of what group commit watches on the database (the custom settings, and
   * whether stored code could leave state: `sql/group-settings.ts`) serves before the next read
   * starts, in the background: code a migration adds while workers run is known from then on.
   * @defaultValue `60_000`
   */
  readonly watchedStateMaxAgeMs?: number;
}

/**
 * The {@link KeyStore} over Postgres that `IdempotencyKeys` uses unless given another:
 * each operation is one statement (a claim, a fenced completion, a release…), and it offers
 * every optional part (group commit, steps, the fast path's one-round-trip reads). Build one
 * yourself only to change its {@link PostgresKeyStoreOptions}; its schema must be the keys'.
 *
 * Not stable: may change in a minor release.
 *
 * @example
 * ```ts
 * import { IdempotencyKeys } from 'idempotent-jobs';
 * import { PostgresKeyStore } from 'idempotent-jobs/store';
 *
 * // Every claim its own statement (no batching of concurrent claims), e.g. to measure one claim's latency.
 * const store = new PostgresKeyStore(db, 'idempotent_jobs', { batchClaims: false });
 * const keys = new IdempotencyKeys({ db, schema: 'idempotent_jobs' }, store);
 * ```
 * @experimental
 */
export class PostgresKeyStore implements KeyStore {
  readonly #db: Kysely<any>;
  readonly #batcher: ClaimBatcher | undefined;
  readonly schema: string;

  /** What a group watches (see `sql/group-settings.ts`), and when it was read. */
  #watched: { readonly state: Promise<WatchedState>; readonly readAt: number } | undefined;
  /** Slot rows taken and freed by runs at once share statements and commits. */
  readonly #slots: SlotBatcher;
  /** The wakes of concurrency waiters asked for at once (a group's jobs, ending together), sent as one statement. */
  readonly #wakes = new WakeBatcher((groups, counts, wakeAgainAfterMs) => wakeConcurrencyWaiters(this.#db, this.schema, groups, counts, wakeAgainAfterMs));
  readonly #watchedStateMaxAgeMs: number;
  /** The state statements of each list of watched names (one list per read): built once, not for every group. */
  readonly #stateStatementsOf = new WeakMap<readonly string[], { keep: CompiledQuery; check: CompiledQuery; checkAll: CompiledQuery; checkPreparedStatements: CompiledQuery }>();

  readonly groupStatements: GroupStatements = {
    completion: (claim, resultJson, retentionMs) => completionStatement(this.schema, claim, resultJson, retentionMs),
    completedKeys: {
      insert: (rows, lockTimeoutMs) => insertCompletedKeysStatement(this.schema, rows, lockTimeoutMs),
      keysWithRows: (error, rows) => rowsThatHadKeys(error, rows),
    },
    state: {
      watched: () => this.#watchedState(),
      keep: (names) => this.#stateStatements(names).keep,
      check: (names, options) => (options.preparedStatements ? this.#stateStatements(names).checkAll : this.#stateStatements(names).check),
      checkPreparedStatements: (names) => this.#stateStatements(names).checkPreparedStatements,
    },
  };


  #stateStatements(names: readonly string[]) {
    let statements = this.#stateStatementsOf.get(names);
    if (statements === undefined) {
      statements = {
        keep: keepGroupStateStatement(names),
        check: checkGroupStateStatement(this.schema, names, { preparedStatements: false }),
        checkAll: checkGroupStateStatement(this.schema, names, { preparedStatements: true }),
        checkPreparedStatements: checkPreparedStatementsStatement(this.schema, names),
      };
      this.#stateStatementsOf.set(names, statements);
    }
    return statements;
  }

  /**
   * What a group watches: read once, again after a failed read, and again in the background
   * once a read is `watchedStateMaxAgeMs` old (code created since, by a migration say, is then
   * known; until the new read answers, groups go by the last one).
   */
  #watchedState(): Promise<WatchedState> {
    const now = performance.now();
    const current = this.#watched;
    if (current && now - current.readAt < this.#watchedStateMaxAgeMs) return current.state;
    const state = Promise.all([customSettingNames(this.#db), codeCanLeaveState(this.#db)]).then(([custom, codeLeavesState]) => ({
      names: [...WATCHED_SETTINGS, ...custom],
      codeCanLeaveState: codeLeavesState,
    }));
    const read = { state, readAt: now };
    this.#watched = read;
    state.catch(() => {
      if (this.#watched === read) this.#watched = current;
    });
    // A read under way for the old one's age: the old answer serves until it ends.
    return current ? current.state : state;
  }

  readonly steps: StepStore = {
    load: (scope, key) => loadSteps(this.#db, this.schema, scope, key),
    start: (claim, step, heldRecord) => startStep(this.#db, this.schema, claim, step, heldRecord),
    recordStatement: (claim, step, resultJson) => recordStepStatement(this.schema, claim, step, resultJson),
    record: async (claim, step, resultJson) => {
      try {
        return await recordStep(this.#db, this.schema, claim, step, resultJson);
      } catch (error) {
        throw this.#mapResultError(error, claim);
      }
    },
    recordAndCommit: async (tx, claim, step, resultJson) => {
      try {
        return await recordStepAndCommit(tx, this.schema, claim, step, resultJson);
      } catch (error) {
        throw this.#mapResultError(error, claim);
      }
    },
    recordIn: async (tx, claim, step, resultJson) => {
      try {
        return await recordStepIn(tx, this.schema, claim, step, resultJson);
      } catch (error) {
        throw this.#mapResultError(error, claim);
      }
    },
  };

  /** See {@link KeyStore.findSettled}; present unless `probeSettledKeys` is false. */
  readonly findSettled?: (scope: string, key: string, fingerprint: string) => Promise<ClaimOutcome | undefined>;

  constructor(db: Kysely<any>, schema: string, options: PostgresKeyStoreOptions = {}) {
    refuseUnknownOptions(options, optionNames<PostgresKeyStoreOptions>()(['batchClaims', 'probeSettledKeys', 'watchedStateMaxAgeMs']), 'new PostgresKeyStore(db, schema, options)');
    this.#db = db;
    this.schema = schema;
    this.#batcher = (options.batchClaims ?? true) ? new ClaimBatcher(db, schema) : undefined;
    this.#slots = new SlotBatcher(db, schema);
    const maxAge = options.watchedStateMaxAgeMs ?? 60_000;
    if (!(Number.isFinite(maxAge) && maxAge >= 0)) throw new ValidationError('INVALID_OPTIONS', 'watchedStateMaxAgeMs', `new PostgresKeyStore(db, schema, options): watchedStateMaxAgeMs must be a number of milliseconds, 0 or more (got ${String(maxAge)}).`);
    this.#watchedStateMaxAgeMs = maxAge;
    if (options.probeSettledKeys ?? true) {
      const probe = new StatementBatcher(
        async (keys: Array<{ scope: string; key: string }>) => {
          const rows = await findSettledKeys(db, schema, keys);
          const byKey = new Map(rows.map((row) => [`${row.scope}\u0000${row.key}`, row]));
          return keys.map((k) => byKey.get(`${k.scope}\u0000${k.key}`));
        },
        { maxBatch: 64, maxInFlight: 2 },
      );
      const hits = new ProbeHitRate();
      this.findSettled = async (scope, key, fingerprint) => {
        if (!hits.worthProbing()) return undefined;
        const outcome = settledOutcome(await probe.submit({ scope, key }), scope, key, fingerprint);
        hits.record(outcome !== undefined);
        return outcome;
      };
    }
  }

  claim(executor: Kysely<any>, input: ClaimInput): Promise<ClaimOutcome> {
    const statementInput = { ...input, schema: this.schema };
    // Only autocommit leased claims batch: a fast-path claim belongs to its caller's transaction.
    if (this.#batcher && executor === this.#db && input.mode === 'lease') return this.#batcher.claim(statementInput);
    return claimKey(executor, statementInput);
  }

  coalesceArrive(input: CoalesceArrival): Promise<CoalesceAnswer> {
    return coalesceArrive(this.#db, this.schema, input);
  }

  coalesceNext(input: { scope: string; key: string; jobId: string; generation: number }): Promise<CoalesceSuccessor | undefined> {
    return coalesceNext(this.#db, this.schema, input);
  }

  acquireSlot(request: SlotRequest): Promise<SlotAnswer> {
    return this.#slots.acquire(request);
  }

  releaseSlot(group: string, slot: number, owner: string, wakeAgainAfterMs: number): Promise<boolean> {
    return this.#slots.release({ group, slot, owner }, wakeAgainAfterMs);
  }

  renewSlots(slots: readonly HeldSlot[], leaseMs: number): Promise<number> {
    return renewConcurrencySlots(this.#db, this.schema, slots, leaseMs);
  }

  takeSlotsInTransaction(tx: Kysely<any>, request: SlotsInTransactionRequest): Promise<SlotsInTransactionAnswer> {
    return takeConcurrencySlotsInTransaction(tx, this.schema, request);
  }

  forgetSlotWaiter(groups: readonly string[], scope: string, key: string): Promise<void> {
    return forgetConcurrencyWaiter(this.#db, this.schema, groups, scope, key);
  }

  wakeSlotWaiters(groups: readonly string[], wakeAgainAfterMs: number): Promise<number> {
    return this.#wakes.wake(groups, wakeAgainAfterMs);
  }

  /** See {@link KeyStore.claimNewKey}. */
  async claimNewKey(tx: Kysely<any>, input: ClaimInput): Promise<ClaimOutcome | undefined> {
    try {
      return (await claimNewKey(tx, this.schema, input)) ? freshCompletingClaim(input) : undefined;
    } catch (error) {
      if (isLockTimeout(error)) return lockWaitTimedOut(input);
      // The key's tombstone refused the insert; the caller rolls its (aborted) transaction back.
      const tombstone = tombstoneOf(error);
      if (tombstone) return tombstoneOutcome(input, tombstone);
      throw error;
    }
  }

  async complete(tx: Kysely<any>, claim: Claim, resultJson: string, retentionMs: number): Promise<boolean> {
    try {
      return await completeKey(tx, this.schema, claim, resultJson, retentionMs);
    } catch (error) {
      throw this.#mapResultError(error, claim);
    }
  }

  async storeFastPathResult(tx: Kysely<any>, claim: Claim, resultJson: string | null, windowLate = false): Promise<void> {
    try {
      await storeFastPathResult(tx, this.schema, claim, resultJson, windowLate);
    } catch (error) {
      throw this.#mapResultError(error, claim);
    }
  }

  async completeAndCommit(tx: Kysely<any>, claim: Claim, resultJson: string, retentionMs: number): Promise<boolean> {
    try {
      return await completeAndCommit(tx, this.schema, claim, resultJson, retentionMs);
    } catch (error) {
      throw this.#mapResultError(error, claim);
    }
  }

  async storeFastPathResultAndCommit(tx: Kysely<any>, claim: Claim, resultJson: string | null, windowLate = false): Promise<void> {
    try {
      await storeResultAndCommit(tx, this.schema, claim, resultJson, windowLate);
    } catch (error) {
      throw this.#mapResultError(error, claim);
    }
  }

  extend(claim: Claim, leaseMs: number, lockTimeoutMs: number): Promise<LeaseExtension> {
    return extendLease(this.#db, this.schema, claim, leaseMs, lockTimeoutMs);
  }

  release(claim: Claim, errorJson: string | null, expiresInMs: number | null = null): Promise<boolean> {
    return releaseKey(this.#db, this.schema, claim, errorJson, expiresInMs);
  }

  fail(claim: Claim, errorJson: string, retentionMs: number): Promise<boolean> {
    return failKey(this.#db, this.schema, claim, errorJson, retentionMs);
  }

  get(scope: string, key: string): Promise<KeyRecord | undefined> {
    return getKey(this.#db, this.schema, scope, key);
  }

  #mapResultError(error: unknown, claim: Claim): unknown {
    if (!isUnstorableJson(error)) return error;
    const reason = `Postgres refused it as jsonb (${(error as Error).message})`;
    return new ResultNotStorableError(claim.scope, claim.key, reason, { cause: error });
  }
}

/** What a claim would return for a settled row; undefined for no row or a key still processing. */
function settledOutcome(row: SettledKeyRow | undefined, scope: string, key: string, fingerprint: string): ClaimOutcome | undefined {
  if (!row) return undefined;
  if (row.fingerprint !== fingerprint) return { kind: 'key-reused', scope, key };
  if (row.status === 'completed') return { kind: 'completed', scope, key, result: row.result };
  if (row.status === 'failed') return { kind: 'failed', scope, key, error: row.error };
  return undefined;
}

/**
 * Whether the settled-key probe pays: a moving average of how often it found a settled key,
 * starting at zero. Below one in five (as at the start), only every 16th call probes, to notice
 * when duplicates arrive; one hit and every call probes, until about seven misses in a row.
 */
class ProbeHitRate {
  #rate = 0;
  #skipped = 0;

  worthProbing(): boolean {
    if (this.#rate >= 0.2) return true;
    this.#skipped = (this.#skipped + 1) % 16;
    return this.#skipped === 0;
  }

  record(hit: boolean): void {
    this.#rate = this.#rate * 0.8 + (hit ? 0.2 : 0);
  }
}
