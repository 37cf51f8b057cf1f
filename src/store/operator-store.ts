import type { Kysely } from 'kysely';
import type {
  AbandonKeyInput,
  DeletedKey,
  KeyAuditEntry,
  KeyPage,
  KeyPageRequest,
  KeyRecord,
  KeysTableLayout,
  KeyStats,
  KeyStatsOptions,
  ListKeysFilter,
  LostKeyCandidate,
  LostKeyCursor,
  OperatorRelease,
  OperatorReleaseInput,
  RecentKeysKind,
  StepRecord,
  TombstoneRecord,
} from './records.js';
import { abandonKey } from './sql/abandon-key.js';
import { deleteExpiredKeys } from './sql/delete-expired-keys.js';
import { deleteSentOutboxRows } from './sql/delete-sent-outbox-rows.js';
import { findLostKeyCandidates } from './sql/find-lost-keys.js';
import { getKey } from './sql/get-key.js';
import { keyAuditOf, recentKeyAudit } from './sql/key-audit.js';
import { keysOfJobs, type KeyPairs } from './sql/keys-of-jobs.js';
import { keyStats } from './sql/key-stats.js';
import { keysTableLayout } from './sql/keys-table-layout.js';
import { listKeys } from './sql/list-keys.js';
import { loadSteps } from './sql/load-steps.js';
import { operatorReleaseKey } from './sql/operator-release.js';
import { pageKeys } from './sql/page-keys.js';
import { pingDatabase } from './sql/ping.js';
import { serverRole, type ServerRole } from './sql/server-role.js';
import { presentKeys, type PresentKey } from './sql/present-keys.js';

export { presentKeyId, type PresentKey } from './sql/present-keys.js';

export type { ServerRole } from './sql/server-role.js';
import { purgeKeys } from './sql/purge-keys.js';
import { anyLiveTombstone, countTombstones, deleteExpiredTombstones, getTombstone } from './sql/tombstones.js';
import { deleteStaleConcurrencyLimits } from './sql/concurrency-slots.js';
import { deleteStaleConcurrencySlots } from './sql/concurrency-slot-wakes.js';
import { deleteIdleCoalescingKeys, deleteOldCoalescingArrivals } from './sql/coalescing-janitor.js';
import { databaseNow, recentKeys } from './sql/recent-keys.js';

/** Which lost keys {@link OperatorStore.findLostKeys} lists. */
export interface LostKeysQuery {
  /** A key counts as lost when its lease ended at least this long ago. */
  readonly sweepAfterMs: number;
  /** At most this many keys. */
  readonly limit: number;
  /** Start after this key (keyset pagination); from the oldest lease when unset. */
  readonly after?: LostKeyCursor;
  /** Only keys of these queues; `'*'`: every key, those with no queue recorded included. @defaultValue `'*'` */
  readonly queues?: readonly string[] | '*';
}

/**
 * Every operator read and write on the keys, their steps, the audit and the outbox's sent rows:
 * what the `keys` and `stats` commands, the key inspector, the job views, the janitor, the
 * sweeper and the health checks ask of Postgres. The hot path speaks to the store through
 * `KeyStore`; everything else through this door, and neither imports a statement file.
 * Each method is one statement of `store/sql/`, whose file says why it is written that way.
 */
export interface OperatorStore {
  /** Schema holding the tables. */
  readonly schema: string;
  /** The same operations on another connection to the same database (the maintenance lock's, say). */
  on(executor: Kysely<any>): OperatorStore;
  /** One cheap round trip that proves a pooled connection works (the health check). */
  ping(): Promise<void>;
  /** Whether the server takes writes (a standby or a read-only setting does not) and how it acknowledges them. */
  serverRole(): Promise<ServerRole>;
  /** Which of these keys have a row, and their state (named by `presentKeyId`). */
  presentKeys(keys: ReadonlyArray<{ readonly scope: string; readonly key: string }>): Promise<Map<string, PresentKey>>;
  /** The database clock. */
  now(): Promise<Date>;
  /** Whether the keys table exists, and its partitions. */
  tableLayout(): Promise<KeysTableLayout>;
  /** One key, or undefined. */
  getKey(scope: string, key: string): Promise<KeyRecord | undefined>;
  /** Keys most recently changed first, filtered. */
  listKeys(filter: ListKeysFilter): Promise<KeyRecord[]>;
  /** One page of keys in (scope, key) order. */
  pageKeys(request: KeyPageRequest): Promise<KeyPage>;
  /** The key inspector's overview lists: the latest keys of one kind. */
  recentKeys(kind: RecentKeysKind, limit: number): Promise<KeyRecord[]>;
  /** A key's step records in position order. */
  loadSteps(scope: string, key: string): Promise<StepRecord[]>;
  /** Many keys' rows, steps and live tombstones, and the database clock, in one snapshot (a dashboard's page of jobs). */
  keysOfJobs(keys: KeyPairs): ReturnType<typeof keysOfJobs>;
  /** Counts by status, the oldest processing key and the outbox's backlog, in one snapshot. */
  keyStats(options?: KeyStatsOptions): Promise<KeyStats>;
  /** A key's operator actions, newest first. */
  keyAudit(scope: string, key: string, limit: number): Promise<KeyAuditEntry[]>;
  /** The latest operator actions on any key, newest first. */
  recentAudit(limit: number): Promise<KeyAuditEntry[]>;
  /** Makes a processing or failed key claimable again, with its audit row; undefined when no such key. */
  releaseKey(input: OperatorReleaseInput): Promise<OperatorRelease | undefined>;
  /** Deletes one batch of keys finished longer ago than `olderThanMs`; how many. `table`: the keys table or one of its partitions. */
  purgeKeys(olderThanMs: number, limit: number, table?: string): Promise<number>;
  /**
   * Deletes one batch of keys whose retention ran out (finished ones, and released ones given an
   * expiry). `table`: the keys table or one of its partitions. `tombstoneMs` > 0: each finished
   * one leaves a tombstone until that long after it finished.
   */
  deleteExpiredKeys(limit: number, table?: string, tombstoneMs?: number): Promise<DeletedKey[]>;
  /** Deletes one batch of tombstones whose window ran out; how many. */
  deleteExpiredTombstones(limit: number): Promise<number>;
  /** Deletes up to `limit` records of the concurrency key a key ran under, older than `olderThanMs`, whose key is not processing; how many (see `sql/concurrency-slots.ts`). */
  deleteStaleConcurrencyLimits(olderThanMs: number, limit: number): Promise<number>;
  /** Deletes up to `limit` slot rows of concurrency keys that hold nothing, their time up more than `olderThanMs` ago; how many. */
  deleteStaleConcurrencySlots(olderThanMs: number, limit: number): Promise<number>;
  /** Deletes up to `limit` coalescing rows idle for longer than `idleMs`, with no run in flight and no successor pending; how many (see `sql/coalescing-janitor.ts`). */
  deleteIdleCoalescingKeys(idleMs: number, limit: number): Promise<number>;
  /** Deletes up to `limit` remembered coalescing arrivals older than `olderThanMs`; how many (see `sql/coalescing-janitor.ts`). */
  deleteOldCoalescingArrivals(olderThanMs: number, limit: number): Promise<number>;
  /** The live tombstone of a key deleted after its retention, if any. */
  getTombstone(scope: string, key: string): Promise<TombstoneRecord | undefined>;
  /** How many live tombstones there are. */
  countTombstones(): Promise<number>;
  /** Whether any live tombstone exists (one index probe). */
  hasLiveTombstones(): Promise<boolean>;
  /** Deletes one batch of outbox rows sent longer ago than `olderThanMs`; how many. */
  deleteSentOutboxRows(olderThanMs: number, limit: number): Promise<number>;
  /** Processing keys whose lease ended long ago, oldest lease first: the sweeper's candidates. */
  findLostKeys(query: LostKeysQuery): Promise<LostKeyCandidate[]>;
  /** Fails a lost key for good, if it is still as the sweeper saw it; false otherwise. */
  abandonKey(input: AbandonKeyInput): Promise<boolean>;
}

/** The {@link OperatorStore} of a Postgres schema that `migrate` set up. */
export class PostgresOperatorStore implements OperatorStore {
  readonly #db: Kysely<any>;

  constructor(
    db: Kysely<any>,
    /** Schema holding the tables. */
    readonly schema: string,
  ) {
    this.#db = db;
  }

  on(executor: Kysely<any>): OperatorStore {
    return new PostgresOperatorStore(executor, this.schema);
  }

  ping(): Promise<void> {
    return pingDatabase(this.#db);
  }

  serverRole(): Promise<ServerRole> {
    return serverRole(this.#db);
  }

  presentKeys(keys: ReadonlyArray<{ readonly scope: string; readonly key: string }>): Promise<Map<string, PresentKey>> {
    return presentKeys(this.#db, this.schema, keys);
  }

  now(): Promise<Date> {
    return databaseNow(this.#db);
  }

  tableLayout(): Promise<KeysTableLayout> {
    return keysTableLayout(this.#db, this.schema);
  }

  getKey(scope: string, key: string): Promise<KeyRecord | undefined> {
    return getKey(this.#db, this.schema, scope, key);
  }

  listKeys(filter: ListKeysFilter): Promise<KeyRecord[]> {
    return listKeys(this.#db, this.schema, filter);
  }

  pageKeys(request: KeyPageRequest): Promise<KeyPage> {
    return pageKeys(this.#db, this.schema, request);
  }

  recentKeys(kind: RecentKeysKind, limit: number): Promise<KeyRecord[]> {
    return recentKeys(this.#db, this.schema, kind, limit);
  }

  loadSteps(scope: string, key: string): Promise<StepRecord[]> {
    return loadSteps(this.#db, this.schema, scope, key);
  }

  keysOfJobs(keys: KeyPairs): ReturnType<typeof keysOfJobs> {
    return keysOfJobs(this.#db, this.schema, keys);
  }

  keyStats(options?: KeyStatsOptions): Promise<KeyStats> {
    return keyStats(this.#db, this.schema, options);
  }

  keyAudit(scope: string, key: string, limit: number): Promise<KeyAuditEntry[]> {
    return keyAuditOf(this.#db, this.schema, scope, key, limit);
  }

  recentAudit(limit: number): Promise<KeyAuditEntry[]> {
    return recentKeyAudit(this.#db, this.schema, limit);
  }

  releaseKey(input: OperatorReleaseInput): Promise<OperatorRelease | undefined> {
    return operatorReleaseKey(this.#db, this.schema, input);
  }

  purgeKeys(olderThanMs: number, limit: number, table?: string): Promise<number> {
    return purgeKeys(this.#db, this.schema, olderThanMs, limit, table);
  }

  deleteExpiredKeys(limit: number, table?: string, tombstoneMs?: number): Promise<DeletedKey[]> {
    return deleteExpiredKeys(this.#db, this.schema, limit, table, tombstoneMs);
  }

  deleteExpiredTombstones(limit: number): Promise<number> {
    return deleteExpiredTombstones(this.#db, this.schema, limit);
  }

  deleteStaleConcurrencyLimits(olderThanMs: number, limit: number): Promise<number> {
    return deleteStaleConcurrencyLimits(this.#db, this.schema, olderThanMs, limit);
  }

  deleteStaleConcurrencySlots(olderThanMs: number, limit: number): Promise<number> {
    return deleteStaleConcurrencySlots(this.#db, this.schema, olderThanMs, limit);
  }

  deleteIdleCoalescingKeys(idleMs: number, limit: number): Promise<number> {
    return deleteIdleCoalescingKeys(this.#db, this.schema, idleMs, limit);
  }

  deleteOldCoalescingArrivals(olderThanMs: number, limit: number): Promise<number> {
    return deleteOldCoalescingArrivals(this.#db, this.schema, olderThanMs, limit);
  }

  getTombstone(scope: string, key: string): Promise<TombstoneRecord | undefined> {
    return getTombstone(this.#db, this.schema, scope, key);
  }

  countTombstones(): Promise<number> {
    return countTombstones(this.#db, this.schema);
  }

  hasLiveTombstones(): Promise<boolean> {
    return anyLiveTombstone(this.#db, this.schema);
  }

  deleteSentOutboxRows(olderThanMs: number, limit: number): Promise<number> {
    return deleteSentOutboxRows(this.#db, this.schema, olderThanMs, limit);
  }

  findLostKeys(query: LostKeysQuery): Promise<LostKeyCandidate[]> {
    return findLostKeyCandidates(this.#db, this.schema, query.sweepAfterMs, query.limit, query.after, query.queues);
  }

  abandonKey(input: AbandonKeyInput): Promise<boolean> {
    return abandonKey(this.#db, this.schema, input);
  }
}
