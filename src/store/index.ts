/**
 * `idempotent-jobs/store`: the seams between the claim protocol and its store, for a store of
 * your own (`new IdempotencyKeys(options, store)`) or to tune the Postgres one. Not stable: may
 * change in a minor release.
 *
 * @experimental
 * @packageDocumentation
 * @module idempotent-jobs/store
 */
export type { KeyStore, GroupStatements, StepStore, WatchedState } from './key-store.js';
export type { ClaimInput, CompletedKeyRow, LeaseExtension, StepPlace, StepRecord } from './records.js';
export type { HeldRecord, HeldRecordState } from './one-trip-commit.js';
export type { PostgresKeyStoreOptions } from './postgres-key-store.js';
export type { SlotAnswer, SlotRequest } from './sql/concurrency-slots.js';
export type { SlotsInTransactionAnswer, SlotsInTransactionRequest } from './sql/concurrency-slots-in-transaction.js';
export type { HeldSlot } from './sql/concurrency-slot-wakes.js';
export { PostgresKeyStore } from './postgres-key-store.js';
