/**
 * The library's error hierarchy: one base class with a stable `code`, so callers (and other
 * languages reading stored errors) can branch on the code rather than on message text.
 *
 * SQLSTATEs are mapped to these in `src/store/` only.
 */

/**
 * Stable machine-readable codes carried by every {@link IdempotencyError}, and the class that
 * carries each:
 *
 * - `INVALID_KEY`, `INVALID_SCOPE`, `INVALID_JOB_DATA`, `INVALID_OPTIONS`, `INVALID_STEP`:
 *   {@link ValidationError}
 * - `KEY_REUSED`: {@link KeyReusedError}
 * - `KEY_FAILED`: {@link KeyFailedError}
 * - `LEASE_LOST`: {@link LeaseLostError}
 * - `RESULT_NOT_STORABLE`: {@link ResultNotStorableError}
 * - `CLAIM_CONTENDED`: {@link ClaimContendedError}
 * - `CONFIG_INVALID`: {@link ConfigError}, {@link ReadOnlyStoreError}
 * - `STORE_UNAVAILABLE`: {@link StoreUnavailableError}
 * - `STORE_FAULT_PERSISTED`: {@link PersistentStoreFaultError}
 * - `STEP_MISMATCH`: {@link StepMismatchError}
 * - `STEPS_UNSUPPORTED`: {@link StepsUnsupportedError}
 * - `TRANSACTION_CONTROL`: {@link TransactionControlError}
 * - `DATA_LAYER_ELSEWHERE`: {@link DataLayerElsewhereError}
 * - `TRANSACTION_ABORTED`: {@link AbortedEffectTransactionError}
 */
export type IdempotencyErrorCode =
  | 'INVALID_KEY'
  | 'INVALID_SCOPE'
  | 'INVALID_JOB_DATA'
  | 'INVALID_OPTIONS'
  | 'KEY_REUSED'
  | 'KEY_FAILED'
  | 'LEASE_LOST'
  | 'RESULT_NOT_STORABLE'
  | 'CLAIM_CONTENDED'
  | 'CONFIG_INVALID'
  | 'STORE_UNAVAILABLE'
  | 'STORE_FAULT_PERSISTED'
  | 'INVALID_STEP'
  | 'STEP_MISMATCH'
  | 'STEPS_UNSUPPORTED'
  | 'TRANSACTION_CONTROL'
  | 'DATA_LAYER_ELSEWHERE'
  | 'TRANSACTION_ABORTED'
  | 'SERVICE_UNREACHABLE';

/**
 * Base class of every error this library throws on purpose. Branch on `code` (stable, also
 * in stored errors that other languages read), not on the message, which says what happened
 * and what to do next in prose. `name` is the subclass's name; `cause`, when set, is the
 * underlying error (a driver's, say).
 *
 * @example
 * ```ts
 * import { IdempotencyError } from 'idempotent-jobs';
 *
 * try {
 *   await producer.enqueue({ name: 'charge', key: 'order-42', data: { cents: 1999 } });
 * } catch (error) {
 *   if (error instanceof IdempotencyError && error.code === 'KEY_REUSED') {
 *     // the same key was sent before with another payload: a client bug, answer 422
 *   } else {
 *     throw error;
 *   }
 * }
 * ```
 */
export class IdempotencyError extends Error {
  /** Stable code; safe to persist and to compare. */
  readonly code: IdempotencyErrorCode;

  constructor(code: IdempotencyErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.name = new.target.name;
  }
}

/**
 * A key, scope, option or job field failed validation; `field` names which. Thrown before
 * anything is written for the key.
 *
 * `code`: `'INVALID_KEY'` or `'INVALID_SCOPE'` (empty, longer than `MAX_KEY_LENGTH` (255), NUL or
 * a lone surrogate), `'INVALID_JOB_DATA'` (a job or message that does not follow the wire
 * contract, or a payload Postgres cannot store), `'INVALID_OPTIONS'` (an option out of range
 * or missing), `'INVALID_STEP'` (a step name or definition `ctx.step` cannot use).
 */
export class ValidationError extends IdempotencyError {
  /** The input field that was wrong, e.g. `'key'`, `'scope'`, `'job.data.payload'`. */
  readonly field: string;

  constructor(
    code: 'INVALID_KEY' | 'INVALID_SCOPE' | 'INVALID_JOB_DATA' | 'INVALID_OPTIONS' | 'INVALID_STEP',
    field: string,
    message: string,
  ) {
    super(code, message);
    this.field = field;
  }
}

/**
 * The key was used before with a different payload (its fingerprint differs). Never executed:
 * a client sent two different requests under one key. `code`: `'KEY_REUSED'`.
 */
export class KeyReusedError extends IdempotencyError {
  constructor(
    /** The key's scope. */
    readonly scope: string,
    /** The reused key. */
    readonly key: string,
  ) {
    super(
      'KEY_REUSED',
      `Idempotency key "${key}" in scope "${scope}" was already used with a different payload; ` +
        'the request was refused and nothing ran. Use a new key for a different request.',
    );
  }
}

/**
 * The key failed permanently earlier; its stored error is replayed and nothing runs. An
 * operator can release the key (`idempotent-jobs keys release`) to allow a new attempt.
 * `code`: `'KEY_FAILED'`.
 */
export class KeyFailedError extends IdempotencyError {
  constructor(
    /** The key's scope. */
    readonly scope: string,
    /** The failed key. */
    readonly key: string,
    /** The error stored when the key failed. */
    readonly storedError: unknown,
  ) {
    super(
      'KEY_FAILED',
      `Idempotency key "${key}" in scope "${scope}" failed permanently before: ${describeStoredError(storedError)}. ` +
        'Release it with `idempotent-jobs keys release` to allow a new attempt.',
    );
  }
}

/**
 * The worker's claim on the key was taken over (or released/completed by someone else), so
 * this worker may not complete it. Thrown inside the effect transaction, which rolls back:
 * the new owner finishes the key. `code`: `'LEASE_LOST'`.
 */
export class LeaseLostError extends IdempotencyError {
  constructor(
    /** The key's scope. */
    readonly scope: string,
    /** The key whose lease was lost. */
    readonly key: string,
    /** The fence of the claim that lost it (the new owner's is higher). */
    readonly fence: number,
  ) {
    super(
      'LEASE_LOST',
      `Lease on idempotency key "${key}" in scope "${scope}" (fence ${fence}) was lost: another worker ` +
        'took the key over, so this worker\'s effect was rolled back. Nothing to do; the new owner finishes it. ' +
        'If this happens often, raise leaseMs above the longest handler run.',
    );
  }
}

/**
 * The effect's result cannot be stored as JSON (not serialisable, larger than `maxResultBytes`,
 * or has NUL bytes). The effect was rolled back, and the key fails for good by default (the
 * same effect would produce it again). `code`: `'RESULT_NOT_STORABLE'`.
 */
export class ResultNotStorableError extends IdempotencyError {
  constructor(scope: string, key: string, reason: string, options?: { cause?: unknown }) {
    super(
      'RESULT_NOT_STORABLE',
      `Result for idempotency key "${key}" in scope "${scope}" cannot be stored: ${reason}. ` +
        'The effect was rolled back. Return a smaller, JSON-serialisable value.',
      options,
    );
  }
}

/**
 * The claim statement kept racing concurrent writers and could not arrive at an outcome.
 * Retryable; in practice it needs several concurrent writers per retry loop. Workers treat it
 * as "in progress" and defer the job. `code`: `'CLAIM_CONTENDED'`.
 */
export class ClaimContendedError extends IdempotencyError {
  constructor(scope: string, key: string, attempts: number) {
    super(
      'CLAIM_CONTENDED',
      `Claim of idempotency key "${key}" in scope "${scope}" raced concurrent writers ${attempts} times; retry later.`,
    );
  }
}

/**
 * Postgres failed one of the key's own statements for a reason that says nothing about the
 * job: the connection was refused, reset or terminated (a restart, a failover), the server was
 * out of connections or resources, a serialization failure or deadlock, a lock or statement
 * timeout. The same call may succeed later; `cause` is the driver's error. The worker defers
 * the job without using an attempt and stores nothing as the key's outcome.
 * `code`: `'STORE_UNAVAILABLE'`.
 */
export class StoreUnavailableError extends IdempotencyError {
  constructor(
    /** The key's scope. */
    readonly scope: string,
    /** The key whose statement failed. */
    readonly key: string,
    /** What the store was doing, e.g. `'claim'`, `'commit'`. */
    readonly operation: string,
    options: { cause: unknown },
  ) {
    super(
      'STORE_UNAVAILABLE',
      `Postgres was unavailable during the ${operation} of idempotency key "${key}" in scope "${scope}" ` +
        `(${describeCause(options.cause)}); nothing was recorded as the key's outcome. Try again later: ` +
        'the worker defers such a job without using an attempt.',
      options,
    );
  }
}

/**
 * A key's transient store faults went on for longer than the consumer's `storeRetryWindowMs`,
 * and this one was counted as an attempt of the job, as a retryable error of the handler would
 * be; on the last attempt it is stored as the key's failure. A fault that lasts so long while
 * Postgres answers (the failure was recorded) is likely the job's own: a statement that breaks
 * its connection or exhausts the server every time. `cause` is the driver's error (not the
 * {@link StoreUnavailableError}, so that {@link findStoreUnavailable} does not take it for a
 * fault to defer again). `code`: `'STORE_FAULT_PERSISTED'`.
 */
export class PersistentStoreFaultError extends IdempotencyError {
  /** The key's scope. */
  readonly scope: string;
  /** The key whose statements kept failing. */
  readonly key: string;

  constructor(fault: StoreUnavailableError, windowMs: number) {
    super(
      'STORE_FAULT_PERSISTED',
      `Postgres kept failing the ${fault.operation} of idempotency key "${fault.key}" in scope "${fault.scope}" ` +
        `(${describeCause(fault.cause)}) for more than ${windowMs} ms of deferrals (storeRetryWindowMs); ` +
        'this fault was counted as an attempt of the job. If Postgres is otherwise healthy, the job itself causes it.',
      { cause: fault.cause },
    );
    this.scope = fault.scope;
    this.key = fault.key;
  }
}

/**
 * The {@link StoreUnavailableError} that `error` is or wraps (through `cause`, as a handler that
 * wraps what `ctx.transaction` threw would), or undefined.
 */
export function findStoreUnavailable(error: unknown): StoreUnavailableError | undefined {
  let current = error;
  for (let depth = 0; depth < 8 && current instanceof Error; depth++) {
    if (current instanceof StoreUnavailableError) return current;
    current = current.cause;
  }
  return undefined;
}

/**
 * A handler's steps do not match the steps recorded for its key by earlier runs (a step named
 * differently at a position, a recorded step not called), or it called one step name twice in
 * a run. Running on would skip a step that took effect or run one a second time, so the job
 * fails for good whatever `errorDisposition` says. `calledName` is null when the run did not
 * call that position (it completed, or called the name elsewhere). `code`: `'STEP_MISMATCH'`.
 */
export class StepMismatchError extends IdempotencyError {
  constructor(
    /** The key's scope. */
    readonly scope: string,
    /** The key whose steps do not match. */
    readonly key: string,
    /** 1-based position in the key's step sequence. */
    readonly position: number,
    /** The step recorded at `position` (null: none recorded there). */
    readonly recordedName: string | null,
    /** The step this run called at `position` (null: none). */
    readonly calledName: string | null,
    detail: string,
  ) {
    super(
      'STEP_MISMATCH',
      `Steps of idempotency key "${key}" in scope "${scope}" do not match: at position ${position} ${detail}. ` +
        'A handler must call its steps in the same order with the same names on every run; ' +
        'the job fails without running further steps. Deploy a handler that keeps the order, or use a new key.',
    );
  }
}

/**
 * `ctx.step` was called where steps cannot be recorded apart from the completion: on the
 * fast path (the whole handler is one transaction), or over a store without step records.
 * `code`: `'STEPS_UNSUPPORTED'`.
 */
export class StepsUnsupportedError extends IdempotencyError {
  constructor(scope: string, key: string, reason: string) {
    super('STEPS_UNSUPPORTED', `ctx.step was called for idempotency key "${key}" in scope "${scope}", but ${reason}`);
  }
}

/**
 * Process configuration (usually environment variables) is missing or wrong; the message names
 * each wrong variable and why. `code`: `'CONFIG_INVALID'`.
 */
export class ConfigError extends IdempotencyError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('CONFIG_INVALID', message, options);
  }
}

/**
 * A process was pointed at a Postgres server that takes no writes: a standby (a streaming
 * replica, a managed service's reader endpoint), or a primary whose
 * `default_transaction_read_only` is on. Refused at start, before anything is claimed: every
 * claim there would fail with 25006 and be deferred for ever. A read-only setting is refused at
 * once; a standby when it is still one at the start's deadline (`STARTUP_WAIT_MS`), since during
 * a failover a URL may reach the demoted primary for a few seconds. (At run time, after a failover
 * demoted the server behind the URL, the same answer is a transient fault instead: the job is
 * deferred and the pool reconnects.) A {@link ConfigError}, so `code` is `'CONFIG_INVALID'` and
 * the process exits with code 2.
 */
export class ReadOnlyStoreError extends ConfigError {
  /** The variable whose URL reached the server, e.g. `'DATABASE_URL'`. */
  readonly variable: string;
  /** Whether the server is a standby (`pg_is_in_recovery()`); otherwise a read-only setting refuses writes. */
  readonly inRecovery: boolean;

  constructor(where: { readonly variable: string; readonly url: string; readonly inRecovery: boolean }) {
    const what = where.inRecovery
      ? 'is a standby in recovery (pg_is_in_recovery() is true): a replica or a reader endpoint'
      : 'refuses writes (default_transaction_read_only is on for this database, role or server)';
    const fix = where.inRecovery
      ? `Point ${where.variable} at the primary (the cluster's writer endpoint, or HAProxy/PgBouncer routing to the leader), never at a replica.`
      : `Point ${where.variable} at a server that takes writes, or turn the setting off (ALTER DATABASE … SET default_transaction_read_only = off; check ALTER ROLE settings too).`;
    super(`The Postgres server of ${where.variable} (${where.url}) ${what}. Claims and effects are writes, so nothing can run there. ${fix}`);
    this.variable = where.variable;
    this.inRecovery = where.inRecovery;
  }
}

/**
 * An effect sent a statement that would end (or begin) its transaction: COMMIT, ROLLBACK (but
 * not ROLLBACK TO a savepoint), BEGIN, END, ABORT, PREPARE TRANSACTION. The transaction is the
 * library's: it commits the effect together with the key's completion, and an effect that
 * committed on its own would be kept while its key is not, so it would run again. Refused before
 * it is sent; the job fails for good (retrying cannot help). `code`: `'TRANSACTION_CONTROL'`.
 */
export class TransactionControlError extends IdempotencyError {
  /** The statement that was refused. */
  readonly statement: string;

  constructor(statement: string) {
    super(
      'TRANSACTION_CONTROL',
      `An effect sent "${statement.length > 80 ? `${statement.slice(0, 77)}...` : statement}", which would end its transaction. ` +
        'The transaction is the library\'s: it commits the effect together with the key. Remove the statement ' +
        '(a SAVEPOINT and ROLLBACK TO SAVEPOINT are fine), or run that work as a ctx.step of its own.',
    );
    this.statement = statement;
  }
}

/**
 * A data layer's transaction (Prisma, Drizzle, TypeORM, node-postgres, postgres.js) is not on
 * the database that holds the idempotency keys, or cannot see their table: the effect and the
 * key's completion could not commit in one transaction. Checked once per data layer, before its
 * first effect; nothing was written. Retrying cannot help until the configuration changes.
 * `code`: `'DATA_LAYER_ELSEWHERE'`.
 */
export class DataLayerElsewhereError extends IdempotencyError {
  /** The data layer's name (`'Prisma'`, `'node-postgres'`, …). */
  readonly dataLayer: string;

  constructor(dataLayer: string, reason: string) {
    super(
      'DATA_LAYER_ELSEWHERE',
      `The ${dataLayer} transaction cannot complete idempotency keys: ${reason}. The effect and the key's completion must ` +
        `commit in one transaction, so ${dataLayer} must connect to the database (and server) that holds the keys: point its ` +
        'connection string at the database of IdempotencyKeys\'s db, or run migrate() on the database your data lives in ' +
        'and give IdempotencyKeys a db for that database.',
    );
    this.dataLayer = dataLayer;
  }
}

/**
 * A data layer's transaction was aborted by a statement that failed inside it and whose error
 * the effect caught and did not rethrow: Postgres refuses every statement after it and rolls the
 * transaction back at COMMIT, so nothing of the effect was kept and the key was not completed.
 * Retried like any error of the effect. `code`: `'TRANSACTION_ABORTED'`.
 */
export class AbortedEffectTransactionError extends IdempotencyError {
  constructor(scope: string, key: string, options?: { cause?: unknown }) {
    super(
      'TRANSACTION_ABORTED',
      `The transaction of idempotency key "${key}" in scope "${scope}" was aborted by a statement that failed inside it ` +
        'and whose error was caught: nothing of it was kept and the key was not completed. Let the error propagate out of ' +
        'the transaction (or wrap the failing statement in a savepoint, a nested transaction of your data layer).',
      options,
    );
  }
}

function describeCause(cause: unknown): string {
  return cause instanceof Error ? cause.message || cause.name : String(cause);
}

function describeStoredError(error: unknown): string {
  if (error && typeof error === 'object' && 'message' in error) return String((error as { message: unknown }).message);
  return JSON.stringify(error);
}
