import { AbortedEffectTransactionError, LeaseLostError, StepsUnsupportedError, StoreUnavailableError } from '../errors.js';
import { isHeld, type Claim } from '../store/claim-outcome.js';
import type { DataLayer } from '../store/data-layer.js';
import { runInDataLayer } from '../store/foreign-transaction.js';
import { sendHeldRecord, type HeldRecord } from '../store/one-trip-commit.js';
import type { StepStore } from '../store/key-store.js';
import type { StepPlace } from '../store/records.js';
import { isInFailedTransaction } from '../store/pg-errors.js';
import { windowMayBeLate } from '../store/retention-window.js';
import { traceEffectTransaction, traceExecuteOnce } from '../telemetry/claim-tracing.js';
import type { CommitEffectOptions, ExecuteOnceOptions, ExecuteOnceOutcome } from './effect-options.js';
import { claimInput, claimRetention } from './fast-path.js';
import { resultRetentionMs, withRetention } from './key-retention.js';
import { mayHaveCommitted, resultOfInterruptedCommit, stepOfInterruptedCommit } from './interrupted-commit.js';
import type { ProtocolParts } from './protocol-parts.js';
import { effectFault, storeCall } from './store-calls.js';
import { serializeResult } from './validate.js';

/** An effect written in a data layer of the user's own: it runs on that data layer's transaction. */
export type DataLayerEffect<Tx, T> = (tx: Tx) => Promise<T>;

/**
 * The effect boundary and the fast path in a data layer of the user's own (Prisma, Drizzle,
 * TypeORM, node-postgres, postgres.js): the data layer opens and commits the transaction, the
 * effect runs on the data layer's transaction object, and the store's statements (the fenced
 * completion; on the fast path the claim and the result) run inside that same transaction
 * through the data layer's raw-SQL call (see `store/foreign-transaction.ts`). The semantics are
 * those of `EffectBoundary` and `FastPath`: a lost lease throws {@link LeaseLostError} from
 * inside the transaction, so the data layer rolls the effect back; a transient fault (of the
 * effect's statements or of the store's) is a {@link StoreUnavailableError}; a COMMIT cut off in
 * flight is settled by reading the key.
 *
 * Database steps in a data layer (`ctx.step(name, { dataLayer, transaction })`) run the same
 * way, with the step's fenced record as the transaction's last statement.
 *
 * Never in a group: each data layer's transaction is on a connection of its own pool, which no
 * other job's effect can share.
 */
export class DataLayerBoundary {
  readonly #parts: ProtocolParts;

  constructor(parts: ProtocolParts) {
    this.#parts = parts;
  }

  /** See `IdempotencyKeys.commitEffectIn`. */
  async commit<Tx, T>(claim: Claim, layer: DataLayer<Tx>, effect: DataLayerEffect<Tx, T>, options: CommitEffectOptions = {}): Promise<T> {
    const { store, options: settings } = this.#parts;
    const { beforeCommit, heldRecord } = options;
    await this.#sendAhead(claim, heldRecord);
    const run = new RunOfEffect(layer, claim);
    return traceEffectTransaction(claim, false, async () => {
      try {
        return await runInDataLayer(settings.db, settings.schema, layer, async (bridge, tx) => {
          const result = await run.effect(() => effect(tx));
          const json = serializeResult(claim.scope, claim.key, result, settings.maxResultBytes);
          await beforeCommit?.();
          // The completion is the transaction's last statement, and the proof that it was not
          // aborted: in an aborted transaction it fails (25P02), so the data layer never commits
          // a job whose completion did not run.
          if (!(await run.store(() => store.complete(bridge, claim, json, resultRetentionMs(claim, settings.retentionMs))))) run.leaseLost();
          return result;
        });
      } catch (error) {
        const thrown = run.settle(error);
        if (thrown !== undefined) throw thrown;
        return (await resultOfInterruptedCommit(store, claim, layer.driverError(error))) as T;
      }
    });
  }

  /** See `IdempotencyKeys.runDatabaseStepIn`. */
  async step<Tx>(claim: Claim, step: StepPlace, layer: DataLayer<Tx>, effect: DataLayerEffect<Tx, unknown>, heldRecord?: HeldRecord): Promise<unknown> {
    const { settings, steps } = this.#stepsOf(claim);
    await this.#sendAhead(claim, heldRecord);
    const run = new RunOfEffect(layer, claim);
    try {
      return await runInDataLayer(settings.db, settings.schema, layer, async (bridge, tx) => {
        const result = await run.effect(() => effect(tx));
        const json = serializeResult(claim.scope, claim.key, result, settings.maxResultBytes);
        // The record is the transaction's last statement: in an aborted transaction it fails
        // (25P02), so the data layer never commits writes whose step was not recorded.
        if (!(await run.store(() => steps.recordIn(bridge, claim, step, json)))) run.leaseLost();
        return JSON.parse(json) as unknown;
      });
    } catch (error) {
      const thrown = run.settle(error);
      if (thrown !== undefined) throw thrown;
      // The COMMIT may have been applied with its reply lost: the step's record tells.
      return (await stepOfInterruptedCommit(steps, claim, step, layer.driverError(error))).result;
    }
  }

  /** The store's step records, with the call that records inside a data layer's transaction. */
  #stepsOf(claim: Claim): { settings: ProtocolParts['options']; steps: StepStore & Required<Pick<StepStore, 'recordIn'>> } {
    const steps = this.#parts.store.steps;
    if (!steps?.recordIn) {
      throw new StepsUnsupportedError(claim.scope, claim.key, 'the key store cannot record a step inside a data layer\'s transaction (KeyStore.steps.recordIn).');
    }
    return { settings: this.#parts.options, steps: steps as StepStore & Required<Pick<StepStore, 'recordIn'>> };
  }

  /**
   * A step record held back goes alone, before the data layer's transaction: that transaction
   * has no front the record could ride in. Refused, nothing else runs.
   */
  async #sendAhead(claim: Claim, heldRecord: HeldRecord | undefined): Promise<void> {
    if (!heldRecord) return;
    await storeCall(claim.scope, claim.key, 'record of a step', () => sendHeldRecord(this.#parts.options.db, heldRecord));
    if (heldRecord.state === 'refused') throw new LeaseLostError(claim.scope, claim.key, claim.fence);
    if (heldRecord.state === 'failed') throw heldRecord.error;
  }

  /** See `IdempotencyKeys.executeOnceIn`; the key parts are valid. */
  async execute<Tx, T>(
    scope: string,
    key: string,
    fingerprint: string,
    layer: DataLayer<Tx>,
    effect: (tx: Tx, claim: Claim) => Promise<T>,
    options: ExecuteOnceOptions,
  ): Promise<ExecuteOnceOutcome<T>> {
    const { store, options: settings } = this.#parts;
    const input = claimInput(this.#parts, { scope, key, fingerprint, mode: 'complete' }, options);
    const retention = claimRetention(this.#parts, options);
    return traceExecuteOnce(scope, key, options.queue, false, async (): Promise<ExecuteOnceOutcome<T>> => {
      // A settled key (a duplicate) replays from one read, without a transaction.
      const settled = await store.findSettled?.(scope, key, fingerprint);
      if (settled) return settled as ExecuteOnceOutcome<T>;
      let run: RunOfEffect | undefined;
      let notHeld: ExecuteOnceOutcome<T> | undefined;
      try {
        return await runInDataLayer(settings.db, settings.schema, layer, async (bridge, tx) => {
          const claimedAt = performance.now();
          const claimed = (await store.claimNewKey?.(bridge, input)) ?? (await store.claim(bridge, input));
          if (!isHeld(claimed)) {
            // Not this run's key: roll back (the transaction may be aborted by the claim's lock wait).
            notHeld = claimed as ExecuteOnceOutcome<T>;
            throw NOT_HELD;
          }
          const outcome = withRetention(claimed, retention);
          run = new RunOfEffect(layer, outcome);
          const result = await run.effect(() => effect(tx, outcome));
          // Stored even when undefined (as null): the last statement proves the transaction was not aborted.
          const json = serializeResult(scope, key, result ?? null, settings.maxResultBytes);
          // A transaction that ran long also moves the key's retention window to its commit.
          const windowLate = windowMayBeLate(performance.now() - claimedAt, input.retentionMs);
          await run.store(() => store.storeFastPathResult(bridge, outcome, json, windowLate));
          return { kind: 'executed', result, claim: outcome };
        });
      } catch (error) {
        if (notHeld) return notHeld;
        if (!run) {
          const cause = layer.driverError(error);
          if (mayHaveCommitted(cause)) throw new StoreUnavailableError(scope, key, 'claim', { cause });
          throw error;
        }
        const thrown = run.settle(error);
        if (thrown !== undefined) throw thrown;
        const held = run.claim;
        const result = (await resultOfInterruptedCommit(store, held, layer.driverError(error))) as T;
        return { kind: 'executed', result, claim: held };
      }
    });
  }
}

/** Thrown to make the data layer roll back a fast-path transaction whose claim did not hold the key. */
const NOT_HELD = new Error('the key is not this run\'s: rolled back');

/**
 * What became of one run of an effect in a data layer's transaction, told apart by what the run
 * itself saw: the data layer may rethrow another error than the one thrown inside (a failed
 * ROLLBACK's, a wrapper of its own), so the effect's error and a lost lease are kept here.
 */
class RunOfEffect {
  readonly #layer: DataLayer<unknown>;
  readonly claim: Claim;
  #effectError: { readonly error: unknown } | undefined;
  #leaseLost = false;

  constructor(layer: DataLayer<any>, claim: Claim) {
    this.#layer = layer;
    this.claim = claim;
  }

  /** Runs the effect; its error is its own (a transient fault of its connection a {@link StoreUnavailableError}). */
  async effect<T>(body: () => Promise<T>): Promise<T> {
    try {
      return await body();
    } catch (error) {
      const fault = effectFault(this.claim, this.#layer.driverError(error));
      // Not a fault: the error exactly as the effect threw it (the data layer's own class).
      const thrown = fault instanceof StoreUnavailableError ? fault : error;
      this.#effectError = { error: thrown };
      throw thrown;
    }
  }

  /** Runs a statement of the store's after the effect: a transaction the effect aborted is the effect's error. */
  async store<T>(body: () => Promise<T>): Promise<T> {
    try {
      return await body();
    } catch (error) {
      if (isInFailedTransaction(this.#layer.driverError(error))) {
        const thrown = new AbortedEffectTransactionError(this.claim.scope, this.claim.key, { cause: error });
        this.#effectError = { error: thrown };
        throw thrown;
      }
      throw error;
    }
  }

  /** The fenced completion matched no row: the key is someone else's; throws to roll back. */
  leaseLost(): never {
    this.#leaseLost = true;
    throw new LeaseLostError(this.claim.scope, this.claim.key, this.claim.fence);
  }

  /**
   * What to throw for the error the data layer's transaction ended with; undefined when the
   * error may have cut off an applied COMMIT (the key tells).
   */
  settle(error: unknown): unknown {
    if (this.#leaseLost) return new LeaseLostError(this.claim.scope, this.claim.key, this.claim.fence);
    if (this.#effectError) return this.#effectError.error;
    const cause = this.#layer.driverError(error);
    // A COMMIT that Postgres answered with ROLLBACK (the data layer said so): nothing was kept.
    if (isInFailedTransaction(cause)) return new AbortedEffectTransactionError(this.claim.scope, this.claim.key, { cause: error });
    return mayHaveCommitted(cause) ? undefined : error;
  }
}
