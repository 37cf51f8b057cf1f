/**
 * idempotent-jobs: exactly-once effects for BullMQ jobs. Keys are claimed in Postgres under a
 * fenced lease; the effect and the key's completion commit in one transaction.
 *
 * @packageDocumentation
 */
export * from './errors.js';
export type { Fingerprinter } from './fingerprint.js';
export { sha256Fingerprint } from './fingerprint.js';
export type { IdempotencyOptions, ResolvedIdempotencyOptions } from './config/idempotency-options.js';
export { resolveIdempotencyOptions } from './config/idempotency-options.js';
export type { Claim, ClaimOutcome, HeldClaim } from './store/claim-outcome.js';
export { isHeld } from './store/claim-outcome.js';
export type { KeyRecord, KeyStatus } from './store/key-record.js';
export type { KeyStore, ClaimInput } from './store/key-store.js';
export { PostgresKeyStore } from './store/postgres-key-store.js';
export type { MigrateOptions } from './store/migrate.js';
export { migrate } from './store/migrate.js';
export type {
  ClaimOptions,
  Effect,
  EffectFailureAction,
  ExecuteOnceOutcome,
  RunEffectOptions,
} from './protocol/idempotency-keys.js';
export { IdempotencyKeys } from './protocol/idempotency-keys.js';
export type { StoredError } from './protocol/validate.js';
export { DEFAULT_SCOPE, MAX_KEY_LENGTH, toStoredError } from './protocol/validate.js';
export type { PostgresDbOptions } from './store/create-postgres-db.js';
export { createPostgresDb } from './store/create-postgres-db.js';
