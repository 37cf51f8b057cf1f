import type { Kysely } from 'kysely';
import { ResultNotStorableError } from '../errors.js';
import type { Claim, ClaimOutcome } from './claim-outcome.js';
import type { ClaimInput, KeyStore } from './key-store.js';
import type { KeyRecord } from './key-record.js';
import { isUnstorableJson } from './pg-errors.js';
import { ClaimBatcher } from './claim-batcher.js';
import { claimKey } from './sql/claim.js';
import { completeKey, storeFastPathResult } from './sql/complete.js';
import { completeAndCommit, storeResultAndCommit } from './sql/complete-and-commit.js';
import { extendLease } from './sql/extend.js';
import { failKey } from './sql/fail.js';
import { getKey } from './sql/get-key.js';
import { releaseKey } from './sql/release.js';

/** Options of {@link PostgresKeyStore}. */
export interface PostgresKeyStoreOptions {
  /**
   * Batch concurrent leased claims made on the store's own pool into one statement and one
   * commit (see `claim-batcher.ts`). A claim that finds no other running is sent alone at once.
   * @defaultValue `true`
   */
  readonly batchClaims?: boolean;
}

/** {@link KeyStore} over Postgres: each method is one statement in `sql/`. */
export class PostgresKeyStore implements KeyStore {
  readonly #db: Kysely<any>;
  readonly #batcher: ClaimBatcher | undefined;
  readonly schema: string;

  constructor(db: Kysely<any>, schema: string, options: PostgresKeyStoreOptions = {}) {
    this.#db = db;
    this.schema = schema;
    this.#batcher = (options.batchClaims ?? true) ? new ClaimBatcher(db, schema) : undefined;
  }

  claim(executor: Kysely<any>, input: ClaimInput): Promise<ClaimOutcome> {
    const statementInput = { ...input, schema: this.schema };
    // Only autocommit leased claims batch: a fast-path claim belongs to its caller's transaction.
    if (this.#batcher && executor === this.#db && input.mode === 'lease') return this.#batcher.claim(statementInput);
    return claimKey(executor, statementInput);
  }

  async complete(tx: Kysely<any>, claim: Claim, resultJson: string, retentionMs: number): Promise<boolean> {
    try {
      return await completeKey(tx, this.schema, claim, resultJson, retentionMs);
    } catch (error) {
      throw this.#mapResultError(error, claim);
    }
  }

  async storeFastPathResult(tx: Kysely<any>, claim: Claim, resultJson: string): Promise<void> {
    try {
      await storeFastPathResult(tx, this.schema, claim, resultJson);
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

  async storeFastPathResultAndCommit(tx: Kysely<any>, claim: Claim, resultJson: string): Promise<void> {
    try {
      await storeResultAndCommit(tx, this.schema, claim, resultJson);
    } catch (error) {
      throw this.#mapResultError(error, claim);
    }
  }

  extend(claim: Claim, leaseMs: number): Promise<Date | null> {
    return extendLease(this.#db, this.schema, claim, leaseMs);
  }

  release(claim: Claim, errorJson: string | null): Promise<boolean> {
    return releaseKey(this.#db, this.schema, claim, errorJson);
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
