/**
 * The library's error hierarchy: one base class with a stable `code`, so callers (and other
 * languages reading stored errors) can branch on the code rather than on message text.
 *
 * SQLSTATEs are mapped to these in `src/store/` only.
 */

/** Stable machine-readable codes carried by every {@link IdempotencyError}. */
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
  | 'INVALID_STEP'
  | 'STEP_MISMATCH'
  | 'STEPS_UNSUPPORTED';

/** Base class of every error this library throws on purpose. */
export class IdempotencyError extends Error {
  /** Stable code; safe to persist and to compare. */
  readonly code: IdempotencyErrorCode;

  constructor(code: IdempotencyErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.name = new.target.name;
  }
}

/** A key, scope, option or job field failed validation; `field` names which. */
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

/** The key was used before with a different payload (its fingerprint differs). Never executed. */
export class KeyReusedError extends IdempotencyError {
  constructor(
    readonly scope: string,
    readonly key: string,
  ) {
    super(
      'KEY_REUSED',
      `Idempotency key "${key}" in scope "${scope}" was already used with a different payload; ` +
        'the request was refused and nothing ran. Use a new key for a different request.',
    );
  }
}

/** The key failed permanently earlier; its stored error is replayed. */
export class KeyFailedError extends IdempotencyError {
  constructor(
    readonly scope: string,
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
 * this worker may not complete it. Thrown inside the effect transaction, which rolls back.
 */
export class LeaseLostError extends IdempotencyError {
  constructor(
    readonly scope: string,
    readonly key: string,
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

/** The effect's result cannot be stored as JSON (not serialisable, too large, or has NUL bytes). */
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
 * The claim statement kept racing concurrent writers and could not settle on an outcome.
 * Retryable; in practice it needs several concurrent writers per retry loop.
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
 */
export class StoreUnavailableError extends IdempotencyError {
  constructor(
    readonly scope: string,
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
 * call that position (it completed, or called the name elsewhere).
 */
export class StepMismatchError extends IdempotencyError {
  constructor(
    readonly scope: string,
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
 */
export class StepsUnsupportedError extends IdempotencyError {
  constructor(scope: string, key: string, reason: string) {
    super('STEPS_UNSUPPORTED', `ctx.step was called for idempotency key "${key}" in scope "${scope}", but ${reason}`);
  }
}

/** Process configuration (usually environment variables) is missing or wrong. */
export class ConfigError extends IdempotencyError {
  constructor(message: string) {
    super('CONFIG_INVALID', message);
  }
}

function describeCause(cause: unknown): string {
  return cause instanceof Error ? cause.message || cause.name : String(cause);
}

function describeStoredError(error: unknown): string {
  if (error && typeof error === 'object' && 'message' in error) return String((error as { message: unknown }).message);
  return JSON.stringify(error);
}
