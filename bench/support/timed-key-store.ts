/** A {@link KeyStore} decorator that records how long each claim statement takes, by outcome. */
import type { Kysely } from 'kysely';
import type { Claim, ClaimOutcome, KeyRecord } from '../../src/index.js';
import type { ClaimInput, KeyStore, LeaseExtension } from '../../src/store/index.js';

/** Claim latencies in milliseconds, by outcome kind. */
export type ClaimLatencies = Map<ClaimOutcome['kind'], number[]>;

/**
 * Wraps a store and times `claim`, and group commit's batched claim of new keys (each job it
 * claimed waited for that one statement, so each gets its duration as a `claimed` sample);
 * every other call is passed through untouched.
 */
export class TimedKeyStore implements KeyStore {
  readonly #inner: KeyStore;
  /** Latencies recorded since the last {@link TimedKeyStore.reset}. */
  latencies: ClaimLatencies = new Map();

  /** Present when the wrapped store has it and `oneTripCommit` is on. */
  readonly completeAndCommit?: KeyStore['completeAndCommit'];
  /** Present when the wrapped store has it and `oneTripCommit` is on. */
  readonly storeFastPathResultAndCommit?: KeyStore['storeFastPathResultAndCommit'];
  /** Present when the wrapped store has it. */
  readonly findSettled?: KeyStore['findSettled'];
  /** The wrapped store's, when it has them (group commit), with the batched claim timed. */
  readonly groupStatements?: KeyStore['groupStatements'];
  /** The wrapped store's step records, when it keeps them (multi-step jobs), untimed. */
  readonly steps?: KeyStore['steps'];

  /**
   * `oneTripCommit: false` hides the store's one-round-trip commit, so the protocol falls back
   * to a separate completion and COMMIT, two round trips (the ablation runs measure the
   * difference).
   */
  constructor(inner: KeyStore, options: { oneTripCommit?: boolean } = {}) {
    this.#inner = inner;
    if (inner.findSettled) this.findSettled = inner.findSettled.bind(inner);
    this.groupStatements = inner.groupStatements;
    if (inner.steps) this.steps = inner.steps;
    if (options.oneTripCommit ?? true) {
      if (inner.completeAndCommit) this.completeAndCommit = inner.completeAndCommit.bind(inner);
      if (inner.storeFastPathResultAndCommit) this.storeFastPathResultAndCommit = inner.storeFastPathResultAndCommit.bind(inner);
    }
  }

  get schema(): string {
    return this.#inner.schema;
  }

  /** Forgets recorded latencies. */
  reset(): void {
    this.latencies = new Map();
  }

  async claim(executor: Kysely<any>, input: ClaimInput): Promise<ClaimOutcome> {
    const startedAt = performance.now();
    const outcome = await this.#inner.claim(executor, input);
    this.#record(outcome.kind, performance.now() - startedAt);
    return outcome;
  }

  /**
   * The wrapped store's cheaper claim of a new key, timed when it answers; when it does not
   * (the key has a row), the `claim` that follows records its own time, not this statement's.
   */
  async claimNewKey(tx: Kysely<any>, input: ClaimInput): Promise<ClaimOutcome | undefined> {
    if (!this.#inner.claimNewKey) return undefined;
    const startedAt = performance.now();
    const outcome = await this.#inner.claimNewKey(tx, input);
    if (outcome) this.#record(outcome.kind, performance.now() - startedAt);
    return outcome;
  }

  #record(kind: ClaimOutcome['kind'], ms: number): void {
    const list = this.latencies.get(kind) ?? [];
    list.push(ms);
    this.latencies.set(kind, list);
  }

  complete(tx: Kysely<any>, claim: Claim, resultJson: string, retentionMs: number): Promise<boolean> {
    return this.#inner.complete(tx, claim, resultJson, retentionMs);
  }

  storeFastPathResult(tx: Kysely<any>, claim: Claim, resultJson: string): Promise<void> {
    return this.#inner.storeFastPathResult(tx, claim, resultJson);
  }

  extend(claim: Claim, leaseMs: number, lockTimeoutMs: number): Promise<LeaseExtension> {
    return this.#inner.extend(claim, leaseMs, lockTimeoutMs);
  }

  release(claim: Claim, errorJson: string | null): Promise<boolean> {
    return this.#inner.release(claim, errorJson);
  }

  fail(claim: Claim, errorJson: string, retentionMs: number): Promise<boolean> {
    return this.#inner.fail(claim, errorJson, retentionMs);
  }

  get(scope: string, key: string): Promise<KeyRecord | undefined> {
    return this.#inner.get(scope, key);
  }
}
