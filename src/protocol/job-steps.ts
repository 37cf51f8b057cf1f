import { createHash } from 'node:crypto';
import type { Transaction } from 'kysely';
import { LeaseLostError, StepMismatchError, StoreUnavailableError, ValidationError, findStoreUnavailable } from '../errors.js';
import type { Claim } from '../store/claim-outcome.js';
import type { HeldRecord } from '../store/one-trip-commit.js';
import type { IdempotencyKeys } from './idempotency-keys.js';
import { assertValidStepName, type FailedStep } from './validate.js';
import { traceStep } from '../telemetry/claim-tracing.js';
import type { StepRecord, StepPlace } from '../store/records.js';
import type { DataLayer } from '../store/data-layer.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** What a step's function receives. */
export interface StepContext {
  /** The step's name, as the handler called it. */
  readonly name: string;
  /** 1-based position of the step in its key's sequence. */
  readonly position: number;
  /**
   * An idempotency key for this step, the same on every run of the key (derived from scope,
   * key and step name, see {@link stepKeyFor}): pass it downstream, so that a provider that
   * deduplicates by key turns a repeat after a takeover into a no-op.
   */
  readonly stepKey: string;
  /** The claim's fence. */
  readonly fence: number;
  /** The job's signal: fires when the lease is lost or the worker is shutting down. */
  readonly signal: AbortSignal;
}

/** What an external step's function receives: a {@link StepContext} and how often the step started. */
export interface ExternalStepContext extends StepContext {
  /** How many times this step has started, this time included: more than 1 after a takeover. */
  readonly starts: number;
}

/** An external step: a call to another system, run at most once per lease, its result recorded after it. */
export type ExternalStep<T> = (step: ExternalStepContext) => Promise<T>;

/**
 * A database step: `transaction(tx)` runs in a transaction whose last statement records the
 * step, so the step's writes and its record commit together, or neither does. Without
 * `dataLayer`, `tx` is a Kysely transaction on the keys' database; with one (from
 * `idempotent-jobs/pg`, `/postgres-js`, `/drizzle`, `/prisma`, `/typeorm`), `tx` is that data
 * layer's own transaction object.
 */
export interface DatabaseStep<T, Tx = Transaction<any>> {
  /** The data layer whose transaction the step runs in, on the keys' database. @defaultValue none: a Kysely transaction */
  readonly dataLayer?: DataLayer<Tx>;
  /**
   * The step's writes, on `tx`; what it returns is the step's result, recorded in the same
   * transaction (so the writes and the record commit together, or neither does).
   */
  readonly transaction: (tx: Tx, step: StepContext) => Promise<T>;
}

/** A database step in a data layer of your own: a {@link DatabaseStep} with its `dataLayer`. */
export type DataLayerStep<Tx, T> = DatabaseStep<T, Tx> & {
  /** The data layer whose transaction the step runs in, on the keys' database. */
  readonly dataLayer: DataLayer<Tx>;
};

/** What `ctx.step` runs: an external step (a function) or a database step. */
export type StepBody<T> = ExternalStep<T> | DatabaseStep<T, any>;

/**
 * The idempotency key of one step, stable across runs and takeovers: `ijs_` and the first 32
 * hex digits of SHA-256 over the JSON array `["<scope>","<key>","<step name>"]`.
 */
export function stepKeyFor(scope: string, key: string, name: string): string {
  return `ijs_${createHash('sha256').update(JSON.stringify([scope, key, name])).digest('hex').slice(0, 32)}`;
}

/** How a step call ended: see {@link StepReport.outcome}. */
type StepOutcome = StepReport['outcome'];

/** What {@link JobSteps} reports for each call of a step with a valid name. */
export interface StepReport {
  /** The step's name. */
  readonly name: string;
  /** 1-based position of the step in its key's sequence. */
  readonly position: number;
  /**
   * How one call of a step ended: `ran` (ran under this claim and was recorded), `replayed`
   * (returned the result an earlier run recorded, without running), `lease-lost` (this claim
   * lost the key: the record was refused, a database step's effect rolled back with it) or
   * `failed` (the step threw, or the call was refused by the determinism guard).
   */
  readonly outcome: 'ran' | 'replayed' | 'lease-lost' | 'failed';
  /** Time the call took, replays included (they read the step records once per run). */
  readonly durationMs: number;
}

/**
 * The size of a step's stored result in bytes: the UTF-8 length of its JSON, as the result
 * size limit (`maxResultBytes`) measures it. Null while the step is not recorded.
 */
export function stepResultBytes(step: StepRecord): number | null {
  return step.recordedAt === null ? null : Buffer.byteLength(JSON.stringify(step.result) ?? 'null', 'utf8');
}

/** A step record as operators see it (CLI, HTTP): times in ISO 8601, the result's size instead of the result. */
export interface StepSummary {
  /** The step's name. */
  readonly name: string;
  /** 1-based position in the key's step sequence. */
  readonly position: number;
  /** How many times the step started (external steps; a database step records with 1). */
  readonly starts: number;
  /** The claim that last started or recorded the step. */
  readonly fence: number;
  /** When the step last started, or was recorded (ISO 8601). */
  readonly startedAt: string;
  /** Null while the step has started and not been recorded. */
  readonly recordedAt: string | null;
  /** UTF-8 bytes of the stored result (as the result size limit counts them), or null until recorded. */
  readonly resultBytes: number | null;
}

/** See {@link StepSummary}. */
export function summarizeStep(step: StepRecord): StepSummary {
  return {
    name: step.name,
    position: step.position,
    starts: step.starts,
    fence: step.fence,
    startedAt: step.startedAt.toISOString(),
    recordedAt: step.recordedAt?.toISOString() ?? null,
    resultBytes: stepResultBytes(step),
  };
}

/** The recorded steps of a key, by position and by name. */
interface RecordedSteps {
  readonly byPosition: ReadonlyMap<number, StepRecord>;
  readonly byName: ReadonlyMap<string, StepRecord>;
}

const NO_STEPS: RecordedSteps = { byPosition: new Map(), byName: new Map() };

/** Options of {@link JobSteps}. */
export interface JobStepsOptions {
  /**
   * Hold an external step's record back until the run's next round trip, which carries it:
   * the next step's start, a database step's transaction, or the completion's when the run ends
   * with {@link JobSteps.complete}. An external step then costs one round trip (its start, with
   * the record of the step before) instead of two. A record no round trip picked up by
   * `flushSoon` goes alone. A run that holds records must end with {@link JobSteps.complete},
   * or {@link JobSteps.flush} before its key is released or failed.
   * @defaultValue `false` (each record is sent as the step returns)
   */
  readonly holdRecords?: boolean;
  /**
   * When a held record that no round trip picked up goes alone: a handler doing slow work
   * between two steps does not leave its record pending for long.
   * @defaultValue `setImmediate` (after the handler's synchronous continuation)
   */
  readonly flushSoon?: (flush: () => void) => void;
}

/** An external step's record, held back for the run's next round trip. */
interface HeldStep {
  readonly step: StepPlace;
  readonly record: HeldRecord;
  /** When the step's call began (`performance.now()`): its report, sent once the record commits, measures up to then. */
  readonly startedAt: number;
  /** Resolves when the round trip carrying it ended, with its error if it failed (never rejects); undefined until one takes it. */
  carried?: Promise<unknown>;
}

/**
 * The steps of one run of a key under one claim (`ctx.step`): replays what earlier runs
 * recorded, runs the rest, and guards the sequence. The worker makes one per job; without
 * BullMQ, make one per claim and call {@link JobSteps.assertComplete} before completing.
 *
 * - The key's steps are read once, when the handler first calls a step (one statement), and
 *   not at all on the key's first claim (fence 1: nobody can have recorded a step).
 * - A step recorded at this position under this name returns its stored result without
 *   running; otherwise it runs under this claim and is recorded, fenced.
 * - Determinism guard: names are unique within a run, and a call must match what is recorded
 *   (or started) at its position. A mismatch throws {@link StepMismatchError} and breaks the
 *   run: every later step, and the completion, throw it too, so a handler that catches it
 *   cannot go on to skip or repeat a step.
 *
 * - With `holdRecords` (the worker's choice), an external step's record is held back and
 *   carried by the run's next round trip, which commits it before anything after it runs:
 *   one round trip per external step. End such a run with {@link JobSteps.complete}, which
 *   carries the last record ahead of the completion, or {@link JobSteps.flush} it before the
 *   key is released or failed.
 *
 * Steps run in the order they are called; positions are handed out at the call, before any
 * wait, so steps started together keep their call order.
 *
 * @example
 * ```ts
 * import { JobSteps, isHeld } from 'idempotent-jobs';
 *
 * const order = { orderId: 'order-42', cents: 1999 };
 * const claim = await keys.claim('shop', order.orderId, keys.fingerprint(order));
 * if (isHeld(claim)) {
 *   const steps = new JobSteps(keys, claim, new AbortController().signal);
 *   // A database step: its writes and its record commit together, exactly once.
 *   const hold = await steps.run('reserve', {
 *     transaction: async (tx) => {
 *       await tx.insertInto('reservations').values({ order_id: order.orderId }).execute();
 *       return { reserved: true };
 *     },
 *   });
 *   // An external step: at most once per lease; the provider deduplicates a repeat by `stepKey`.
 *   const charge = await steps.run('charge', (step) => payments.charge({ ...order, idempotencyKey: step.stepKey }));
 *   await steps.assertComplete();
 *   await keys.runEffect(claim, async () => ({ hold, charge }));
 * }
 * ```
 */
export class JobSteps {
  readonly #keys: IdempotencyKeys;
  readonly #claim: Claim;
  readonly #signal: AbortSignal;
  readonly #onStep: ((report: StepReport) => void) | undefined;
  /** Name → position, of the steps this run called. */
  readonly #called = new Map<string, number>();
  readonly #failures: Array<{ readonly error: unknown; readonly step: FailedStep }> = [];
  readonly #holdRecords: boolean;
  readonly #flushSoon: (flush: () => void) => void;
  #recorded: Promise<RecordedSteps> | undefined;
  #next = 1;
  #broken: StepMismatchError | undefined;
  #held: HeldStep | undefined;
  /** What became of a held record that did not commit (refused, or lost to a fault): every later call throws it. */
  #halted: { readonly error: unknown } | undefined;

  /** `onStep`, when given, hears how each call of a step with a valid name ended (the worker's step events). */
  constructor(keys: IdempotencyKeys, claim: Claim, signal: AbortSignal, onStep?: (report: StepReport) => void, options: JobStepsOptions = {}) {
    refuseUnknownOptions(options, optionNames<JobStepsOptions>()(['holdRecords', 'flushSoon']), 'new JobSteps(..., options)');
    this.#keys = keys;
    this.#claim = claim;
    this.#signal = signal;
    this.#onStep = onStep;
    this.#holdRecords = options.holdRecords ?? false;
    this.#flushSoon = options.flushSoon ?? ((flush) => void setImmediate(flush));
  }

  /**
   * Runs (or replays) the step `name`: an external step when `body` is a function, a database
   * step when it is `{ transaction }` (`{ dataLayer, transaction }`: in that data layer). Returns its result as stored (its JSON form), on the
   * first run as on replays.
   */
  run<T>(name: string, body: ExternalStep<T>): Promise<T>;
  run<T, Tx = Transaction<any>>(name: string, body: DatabaseStep<T, Tx>): Promise<T>;
  run<T>(name: string, body: StepBody<T>): Promise<T>;
  async run<T>(name: string, body: StepBody<T>): Promise<T> {
    const { scope, key } = this.#claim;
    assertValidStepName(scope, key, name);
    assertValidStepBody(scope, key, name, body);
    const startedAt = performance.now();
    if (this.#broken) throw this.#report(name, this.#next, startedAt, this.#broken);
    const position = this.#next++;
    let ran: [T, StepOutcome | 'held'];
    try {
      ran = (await traceStep(this.#claim, name, position, () => this.#run(name, position, body, startedAt))) as [T, StepOutcome | 'held'];
    } catch (error) {
      throw this.#report(name, position, startedAt, error);
    }
    // A held record is reported once a round trip has carried it (see #noteCarried).
    if (ran[1] !== 'held') this.#onStep?.({ name, position, outcome: ran[1], durationMs: performance.now() - startedAt });
    return ran[0];
  }

  async #run<T>(name: string, position: number, body: StepBody<T>, startedAt: number): Promise<[T, StepOutcome | 'held']> {
    const { scope, key } = this.#claim;
    const earlier = this.#called.get(name);
    if (earlier !== undefined) {
      throw this.#break(position, null, name, `this run called "${name}" a second time (first at position ${earlier}); step names must be unique within a run`);
    }
    this.#called.set(name, position);
    const recorded = await this.#load();
    if (this.#broken) throw this.#broken;
    const atPosition = recorded.byPosition.get(position);
    if (atPosition && atPosition.name !== name) {
      throw this.#break(position, atPosition.name, name, `the step ${describeRecord(atPosition)} is "${atPosition.name}", but this run called "${name}"`);
    }
    if (!atPosition) {
      const elsewhere = recorded.byName.get(name);
      if (elsewhere) {
        throw this.#break(position, null, name, `this run called "${name}", which is ${describeRecord(elsewhere)} at position ${elsewhere.position}`);
      }
    }
    if (atPosition?.recordedAt) return [atPosition.result as T, 'replayed'];

    if (this.#signal.aborted) throw this.#signal.reason;
    const step = { name, position };
    const context: StepContext = { name, position, stepKey: stepKeyFor(scope, key, name), fence: this.#claim.fence, signal: this.#signal };
    try {
      if (typeof body === 'function') {
        // The previous step's held record rides with this start: recorded before this step runs.
        const starts = await this.#withHeld((record) => this.#keys.startStep(this.#claim, step, record));
        const result = await body({ ...context, starts });
        return await this.#record(step, result as T, startedAt);
      }
      const result = await this.#withHeld((record) =>
        body.dataLayer !== undefined
          ? this.#keys.runDatabaseStepIn(this.#claim, step, body.dataLayer, (tx) => body.transaction(tx, context), record)
          : this.#keys.runDatabaseStep(this.#claim, step, (tx) => body.transaction(tx, context), record),
      );
      return [result as T, 'ran'];
    } catch (error) {
      // The step's own failure (or its unstorable result), not the key's: named when stored.
      if (!(error instanceof LeaseLostError) && !findStoreUnavailable(error)) this.#failures.push({ error, step });
      throw error;
    }
  }

  /**
   * An external step's result: held back for the next round trip (`holdRecords`), or recorded
   * now. Either way checked now, and returned as it will be stored.
   */
  async #record<T>(step: StepPlace, result: T, startedAt: number): Promise<[T, StepOutcome | 'held']> {
    if (this.#holdRecords) {
      // Steps called together: a record still waiting goes first, alone, so only one is held.
      if (this.#held) await this.flush();
      if (this.#halted) throw this.#halted.error;
      const held = this.#keys.holdStepRecord(this.#claim, step, result);
      if (held) {
        this.#held = { step, record: held.record, startedAt };
        this.#flushSoon(() => void this.flush());
        return [held.value as T, 'held'];
      }
    }
    return [(await this.#keys.recordStep(this.#claim, step, result)) as T, 'ran'];
  }

  /**
   * Runs `trip` with the held record (if one waits) to carry, and notes what became of the record.
   * Throws, before `trip` runs, what became of an earlier held record that did not commit.
   */
  async #withHeld<T>(trip: (record: HeldRecord | undefined) => Promise<T>): Promise<T> {
    // A record already on its way (alone, or with a step called alongside) is waited for.
    while (this.#held?.carried) {
      const held = this.#held;
      this.#noteCarried(held, await held.carried);
    }
    if (this.#halted) throw this.#halted.error;
    const held = this.#held;
    if (!held) return trip(undefined);
    const running = trip(held.record);
    held.carried = running.then(
      () => undefined,
      (error: unknown) => error,
    );
    this.#noteCarried(held, await held.carried);
    return running;
  }

  /** Looks at what the round trip that carried `held` did with it (`error`: how that round trip failed). */
  #noteCarried(held: HeldStep, error: unknown): void {
    if (this.#held !== held) return;
    const { step, record } = held;
    const durationMs = performance.now() - held.startedAt;
    if (record.state === 'pending') {
      // Its round trip ended before sending it (a transaction whose body threw first): still held.
      held.carried = undefined;
      return;
    }
    this.#held = undefined;
    if (record.state === 'committed') {
      this.#onStep?.({ ...step, outcome: 'ran', durationMs });
    } else if (record.state === 'refused') {
      this.#halted ??= { error: new LeaseLostError(this.#claim.scope, this.#claim.key, this.#claim.fence) };
      this.#onStep?.({ ...step, outcome: 'lease-lost', durationMs });
    } else if (record.state === 'failed') {
      // Postgres refused the record itself, for another reason: certainly not recorded. The run
      // stops with that error; the step is not recorded, so the next run starts it again.
      this.#halted ??= { error: record.error };
    } else {
      // Perhaps recorded, perhaps not: sending it again could not tell "recorded already" from
      // "lease lost". The run stops here; the next run reads what is recorded.
      this.#halted ??= { error: new StoreUnavailableError(this.#claim.scope, this.#claim.key, `record of step "${step.name}"`, { cause: error }) };
    }
  }

  /**
   * Sends a held record now, alone, if one waits (`holdRecords`), and waits for one on its way.
   * Never throws: a record refused (the claim lost the key) or lost to a store fault is kept,
   * and every later call of the run throws it. Call it before releasing or failing a key whose
   * handler threw, so that the steps it finished stay recorded.
   */
  async flush(): Promise<void> {
    try {
      await this.#withHeld(async (record) => {
        if (record) await this.#keys.sendStepRecord(this.#claim, record);
      });
    } catch {
      // Kept in #halted (see #noteCarried).
    }
  }

  /**
   * Ends the run: checks it called every recorded step (as {@link JobSteps.assertComplete}
   * does), then runs `completion` (the key's completion transaction, e.g.
   * `(record) => keys.commitEffect(claim, effect, { heldRecord: record })`) with the held record,
   * if any, to commit ahead of it in its first round trip.
   */
  async complete<T>(completion: (record: HeldRecord | undefined) => Promise<T>): Promise<T> {
    await this.#assertCalledAll();
    return this.#withHeld(completion);
  }

  /**
   * Checks, before the key completes, that this run called every step recorded for the key:
   * one left out means the run took another path than the one that recorded it. Throws
   * {@link StepMismatchError} (also when the run broke earlier). A held record is sent first
   * (alone); {@link JobSteps.complete} carries it with the completion instead.
   */
  async assertComplete(): Promise<void> {
    await this.flush();
    if (this.#halted) throw this.#halted.error;
    await this.#assertCalledAll();
  }

  async #assertCalledAll(): Promise<void> {
    if (this.#broken) throw this.#broken;
    const recorded = this.#recorded ? await this.#recorded : NO_STEPS;
    for (const record of recorded.byPosition.values()) {
      if (!this.#called.has(record.name)) {
        throw this.#break(
          record.position,
          record.name,
          null,
          `the step ${describeRecord(record)} is "${record.name}", but this run completed without calling it`,
        );
      }
    }
  }

  /** The step that threw `error` (or an error it wraps, through `cause`), if one did. */
  failedStep(error: unknown): FailedStep | undefined {
    let current = error;
    for (let depth = 0; depth < 8; depth++) {
      const failure = this.#failures.find((f) => f.error === current);
      if (failure) return failure.step;
      if (!(current instanceof Error)) return undefined;
      current = current.cause;
    }
    return undefined;
  }

  /** Reports a call of step `name` (started at `startedAt`) that threw `error`, and returns the error. */
  #report(name: string, position: number, startedAt: number, error: unknown): unknown {
    this.#onStep?.({ name, position, outcome: error instanceof LeaseLostError ? 'lease-lost' : 'failed', durationMs: performance.now() - startedAt });
    return error;
  }

  #load(): Promise<RecordedSteps> {
    // A key's first claim (fence 1) has no earlier owner who could have recorded a step, and a
    // key deleted and created anew lost its steps with it (foreign key): nothing to read.
    this.#recorded ??= this.#claim.fence === 1 ? Promise.resolve(NO_STEPS) : this.#keys.loadSteps(this.#claim).then(indexSteps);
    return this.#recorded;
  }

  #break(position: number, recordedName: string | null, calledName: string | null, detail: string): StepMismatchError {
    this.#broken ??= new StepMismatchError(this.#claim.scope, this.#claim.key, position, recordedName, calledName, detail);
    return this.#broken;
  }
}

/** Throws `INVALID_STEP` for a step body of none of the three shapes `ctx.step` takes. */
function assertValidStepBody(scope: string, key: string, name: string, body: unknown): void {
  if (typeof body === 'function') return;
  const shape = (body ?? {}) as Partial<DatabaseStep<unknown, unknown>>;
  if (typeof shape.transaction === 'function' && (shape.dataLayer === undefined || typeof shape.dataLayer.transaction === 'function')) return;
  throw new ValidationError(
    'INVALID_STEP',
    'step',
    `Step "${name}" of idempotency key "${key}" in scope "${scope}" is neither a function (an external step), { transaction: (tx) => … } (a database step) ` +
      'nor { dataLayer, transaction: (tx) => … } with a data layer from an adapter (a database step in your data layer).',
  );
}

function indexSteps(steps: readonly StepRecord[]): RecordedSteps {
  return { byPosition: new Map(steps.map((s) => [s.position, s])), byName: new Map(steps.map((s) => [s.name, s])) };
}

function describeRecord(record: StepRecord): string {
  return record.recordedAt ? `recorded (fence ${record.fence})` : `started but not recorded (fence ${record.fence})`;
}
