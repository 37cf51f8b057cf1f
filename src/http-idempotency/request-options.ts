import { ValidationError } from '../errors.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { MAX_RETENTION_CEILING_MS, retentionProblem } from '../protocol/key-retention.js';
import type { KeySettledListener } from '../store/key-settled-listener.js';
import type { KeyRetention } from '../store/records.js';
import { refuseUnknownOptions } from '../config/unknown-options.js';
import { largestStorableBodyBytes, STORED_HEADERS_ALLOWANCE_BYTES, storedResponseBytesBound } from './stored-response.js';

/** Options of {@link IdempotentRequests}. */
export interface IdempotentRequestsOptions {
  /** The claim protocol: its database holds the request keys, and the handlers' transactions run on it. */
  readonly keys: IdempotencyKeys;
  /**
   * Names this service's requests apart from other users of the keys table: a request's key lives
   * in scope `request:<namespace>:<client>`. 1–64 of `A–Z a–z 0–9 _ . -`.
   * @defaultValue `'default'`
   */
  readonly namespace?: string;
  /**
   * The methods whose requests are made idempotent; others run their handler without a key
   * (the draft's non-idempotent methods by default).
   * @defaultValue `['POST', 'PATCH']`
   */
  readonly methods?: readonly string[];
  /**
   * A request of a covered method without `Idempotency-Key` is refused (400
   * `missing-idempotency-key`); `false` runs its handler without a key instead.
   * @defaultValue `true`
   */
  readonly keyRequired?: boolean;
  /**
   * The lease of a request handled by a function handler (its key is claimed before the handler
   * runs); a heartbeat extends it every third of it. After a crash, retries are answered 409
   * until it ends, then one of them runs the handler again.
   * @defaultValue `15_000`
   */
  readonly leaseMs?: number;
  /**
   * Largest response body stored and replayed, in bytes; a larger one is answered 500 and not
   * stored. Stored, a response must fit the keys' `maxResultBytes` (as JSON, its body base64 at
   * worst, with up to 8 KiB of headers): a value whose responses might not is refused here.
   * @defaultValue `262_144` (256 KiB), or the most that the keys' `maxResultBytes` stores when that is less
   */
  readonly maxResponseBytes?: number;
  /**
   * How long a request's key and stored response are kept, and its tombstone after that (as a
   * job's retention); a key released by a 5xx or a thrown handler is kept `resultMs` from its
   * release. Each part must be within the keys' bounds (`maxJobRetentionMs`, `maxJobTombstoneMs`),
   * which are raised there; a part above its bound is refused here, not cut to it.
   * @defaultValue unset (the keys' `retentionMs`, the janitor's `tombstoneMs`)
   */
  readonly retention?: KeyRetention;
  /** Cap of `Prefer: wait=N` on a retry that meets its request in flight; 0 turns waiting off. @defaultValue `10` */
  readonly maxWaitSeconds?: number;
  /** Wakes such waits when the key settles (LISTEN/NOTIFY); without one they poll the key. @defaultValue unset (polling) */
  readonly listener?: KeySettledListener;
  /** Told of what the middleware decides and of errors it meets (pino-compatible). @defaultValue unset (silent) */
  readonly logger?: RequestLogger;
}

/** The log calls {@link IdempotentRequests} makes (pino's shape). */
export interface RequestLogger {
  /** A request refused or answered without running its handler. */
  info(object: object, message: string): void;
  /** A dependency fault, or a handler that broke the contract. */
  warn(object: object, message: string): void;
  /** Something unexpected: the request was answered 500. */
  error(object: object, message: string): void;
}

/** {@link IdempotentRequestsOptions} with defaults applied. */
export interface ResolvedIdempotentRequestsOptions {
  /** See {@link IdempotentRequestsOptions.keys}. */
  readonly keys: IdempotencyKeys;
  /** See {@link IdempotentRequestsOptions.namespace}. */
  readonly namespace: string;
  /** See {@link IdempotentRequestsOptions.methods}, upper-cased. */
  readonly methods: ReadonlySet<string>;
  /** See {@link IdempotentRequestsOptions.keyRequired}. */
  readonly keyRequired: boolean;
  /** See {@link IdempotentRequestsOptions.leaseMs}. */
  readonly leaseMs: number;
  /** See {@link IdempotentRequestsOptions.maxResponseBytes}. */
  readonly maxResponseBytes: number;
  /** The keys' `maxResultBytes`: the most a response takes once stored (as JSON). */
  readonly maxStoredResponseBytes: number;
  /** See {@link IdempotentRequestsOptions.retention}. */
  readonly retention: KeyRetention | undefined;
  /** See {@link IdempotentRequestsOptions.maxWaitSeconds}. */
  readonly maxWaitSeconds: number;
  /** See {@link IdempotentRequestsOptions.listener}. */
  readonly listener: KeySettledListener | undefined;
  /** See {@link IdempotentRequestsOptions.logger}. */
  readonly logger: RequestLogger;
}

const OPTION_NAMES = new Set(['keys', 'namespace', 'methods', 'keyRequired', 'leaseMs', 'maxResponseBytes', 'retention', 'maxWaitSeconds', 'listener', 'logger']);
const NAMESPACE_PATTERN = /^[A-Za-z0-9_.-]{1,64}$/;
const METHOD_PATTERN = /^[A-Za-z]{1,32}$/;
const SILENT: RequestLogger = { info() {}, warn() {}, error() {} };

/** Validates and defaults; throws a {@link ValidationError} (`INVALID_OPTIONS`) naming the option. */
export function resolveIdempotentRequestsOptions(options: IdempotentRequestsOptions): ResolvedIdempotentRequestsOptions {
  if (options === null || typeof options !== 'object') refuse('options', 'pass an options object with at least `keys`');
  assertKnownOptionNames('new IdempotentRequests(options)', options, OPTION_NAMES);
  const { keys } = options;
  if (!keys || typeof keys !== 'object' || typeof (keys as { claim?: unknown }).claim !== 'function' || typeof (keys as { options?: unknown }).options !== 'object') {
    refuse('keys', 'is required: pass an IdempotencyKeys instance');
  }
  const namespace = options.namespace ?? 'default';
  if (typeof namespace !== 'string' || !NAMESPACE_PATTERN.test(namespace)) refuse('namespace', 'must be 1–64 of A–Z a–z 0–9 _ . -');
  const methods = options.methods ?? ['POST', 'PATCH'];
  if (!Array.isArray(methods) || methods.some((method) => typeof method !== 'string' || !METHOD_PATTERN.test(method))) {
    refuse('methods', 'must be a list of HTTP method names, e.g. ["POST", "PATCH"]');
  }
  const keyRequired = options.keyRequired ?? true;
  if (typeof keyRequired !== 'boolean') refuse('keyRequired', 'must be true or false');
  const leaseMs = wholeNumber('leaseMs', options.leaseMs ?? 15_000, 1_000, 3_600_000);
  const { maxResultBytes, maxJobRetentionMs, maxJobTombstoneMs } = keys.options;
  const maxResponseBytes = storableResponseBytes(options.maxResponseBytes, maxResultBytes);
  const maxWaitSeconds = wholeNumber('maxWaitSeconds', options.maxWaitSeconds ?? 10, 0, 3_600);
  if (options.retention !== undefined) {
    const problem = retentionProblem(options.retention);
    if (problem) refuse(`retention${problem[0]}`, problem[1]);
    refuseAboveBound('resultMs', options.retention.resultMs, maxJobRetentionMs, 'maxJobRetentionMs');
    refuseAboveBound('tombstoneMs', options.retention.tombstoneMs, maxJobTombstoneMs, 'maxJobTombstoneMs');
  }
  const { logger, listener } = options;
  if (logger !== undefined && (typeof logger !== 'object' || logger === null || ['info', 'warn', 'error'].some((level) => typeof (logger as unknown as Record<string, unknown>)[level] !== 'function'))) {
    refuse('logger', 'must have info, warn and error methods (a pino logger does)');
  }
  if (listener !== undefined && (typeof listener !== 'object' || listener === null || typeof (listener as { waitForSettled?: unknown }).waitForSettled !== 'function')) {
    refuse('listener', 'must be a KeySettledListener');
  }
  return Object.freeze({
    keys,
    namespace,
    methods: new Set(methods.map((method) => method.toUpperCase())),
    keyRequired,
    leaseMs,
    maxResponseBytes,
    maxStoredResponseBytes: maxResultBytes,
    retention: options.retention,
    maxWaitSeconds,
    listener,
    logger: logger ?? SILENT,
  });
}

/**
 * Refuses option names the options object does not have (a typo would otherwise be ignored
 * silently and its default used).
 */
export function assertKnownOptionNames(what: string, options: object, known: ReadonlySet<string>): void {
  refuseUnknownOptions(options, [...known], what);
}

const DEFAULT_MAX_RESPONSE_BYTES = 262_144;

/**
 * `maxResponseBytes` checked against what the keys store (`maxResultBytes`): a response's body
 * is measured before it is stored, but the key refuses the stored form (JSON: the body as text
 * or base64, and the headers), and that refusal would come after the handler ran. So a value
 * whose responses might not fit is refused here; left unset, the default is lowered to fit.
 */
function storableResponseBytes(asked: unknown, maxResultBytes: number): number {
  const largest = Math.min(largestStorableBodyBytes(maxResultBytes), 64 * 1_048_576);
  if (asked === undefined) {
    if (largest < 1) {
      refuse('keys', `stores results of at most maxResultBytes = ${maxResultBytes} bytes, too few for any response with its headers: raise maxResultBytes of the IdempotencyKeys to at least ${storedResponseBytesBound(1)}`);
    }
    return Math.min(DEFAULT_MAX_RESPONSE_BYTES, largest);
  }
  const maxResponseBytes = wholeNumber('maxResponseBytes', asked, 1, 64 * 1_048_576);
  if (maxResponseBytes > largest) {
    refuse(
      'maxResponseBytes',
      `a response with a body of ${maxResponseBytes} bytes takes up to ${storedResponseBytesBound(maxResponseBytes)} bytes once stored (its body base64-encoded, ` +
        `with up to ${STORED_HEADERS_ALLOWANCE_BYTES} bytes of headers), more than its key stores: maxResultBytes of the IdempotencyKeys is ${maxResultBytes}, ` +
        `so it would fail after its handler ran. Set maxResponseBytes to at most ${largest}, or raise maxResultBytes to at least ${storedResponseBytesBound(maxResponseBytes)}`,
    );
  }
  return maxResponseBytes;
}

/** Refuses a retention part the keys would cut to their bound: the endpoint would keep its responses for less than it says. */
function refuseAboveBound(part: 'resultMs' | 'tombstoneMs', askedMs: number | undefined, boundMs: number, boundOption: string): void {
  if (askedMs === undefined || askedMs <= boundMs) return;
  refuse(
    `retention.${part}`,
    `${askedMs} ms is more than the keys' ${boundOption} (${boundMs} ms), which would cut it to that. ` +
      `Raise ${boundOption} of the IdempotencyKeys to at least ${askedMs} (it goes up to ${MAX_RETENTION_CEILING_MS} ms, 100 years), or ask for less`,
  );
}

function wholeNumber(name: string, value: unknown, min: number, max: number): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) refuse(name, `must be a whole number from ${min} to ${max}`);
  return value;
}

function refuse(name: string, why: string): never {
  throw new ValidationError('INVALID_OPTIONS', name, `Invalid option ${name}: ${why}.`);
}
