import { createHash } from 'node:crypto';
import { ValidationError } from '../errors.js';
import { MAX_PAYLOAD_DEPTH, describeJsonProblem, findJsonProblem, printable } from '../json-limits.js';
import { retentionProblem } from '../protocol/key-retention.js';
import { DEFAULT_SCOPE, assertValidKeyPart } from '../protocol/validate.js';
import type { KeyRetention } from '../store/records.js';

/**
 * The wire contract, for producers in any language:
 *
 * ```json
 * { "idempotencyKey": "order-42", "scope": "payments", "payload": { "amount": 100 } }
 * ```
 *
 * `idempotencyKey`: required, 1–255 characters. `scope`: optional, defaults to `"default"`.
 * `payload`: required, any JSON (null included) nested at most 64 levels deep, without lone
 * UTF-16 surrogates (in strings or object keys; nor in the key, scope or job name); it is
 * what the handler receives. The key's fingerprint covers the job name and the payload, so
 * the same key with another payload (or another job name) is refused as reused.
 *
 * `traceparent` / `tracestate`: optional W3C Trace Context, outside the fingerprint; the
 * worker's spans join that trace (a malformed value is ignored, never a reason to refuse).
 *
 * `concurrencyKey` / `concurrencyLimit`: optional, together, outside the fingerprint: at most
 * `concurrencyLimit` (1–10,000) jobs naming the same `concurrencyKey` (1–255 characters, e.g.
 * `tenant:acme`) run at once across all workers; the others are deferred without using an attempt.
 *
 * `coalesce`: optional, outside the fingerprint: `true` makes the key coalescing (one running job
 * plus one pending successor with the newest payload) instead of idempotent; its key has at most
 * 235 characters, and each job needs an id of its own.
 *
 * `retention`: optional, outside the fingerprint: `{ "resultMs": …, "tombstoneMs": … }`, both
 * optional whole milliseconds: how long this key's result is kept (1 ms – 100 years) and how long
 * its tombstone lasts once the janitor deleted it (0 – 100 years; 0: none), each from when the
 * key finished. The worker holds them to its `maxJobRetentionMs` / `maxJobTombstoneMs`.
 */
export interface WireJobData<P = unknown> {
  /** The idempotency key: 1–255 characters. */
  readonly idempotencyKey: string;
  /** Namespace of the key. @defaultValue `"default"` (`DEFAULT_SCOPE`) */
  readonly scope?: string;
  /** What the handler receives as `ctx.data`; any JSON, fingerprinted with the job name. */
  readonly payload: P;
  /** W3C `traceparent` of the producer's span; the worker's spans join its trace. @defaultValue unset (a new trace) */
  readonly traceparent?: string;
  /** W3C `tracestate` that goes with `traceparent`. @defaultValue unset */
  readonly tracestate?: string;
  /** The group whose jobs are limited, e.g. `tenant:acme`; needs `concurrencyLimit`. @defaultValue unset (no limit) */
  readonly concurrencyKey?: string;
  /** How many jobs of `concurrencyKey` may run at once (1–10,000). @defaultValue unset (no limit) */
  readonly concurrencyLimit?: number;
  /**
   * Coalescing mode instead of idempotency: one running job plus at most one pending successor
   * per key, the newest payload winning; the same key with another payload is the next run, not
   * `KEY_REUSED`. Each job needs a job id of its own.
   * @defaultValue `false`
   */
  readonly coalesce?: boolean;
  /**
   * This key's own retention: how long its result is kept, and its tombstone once deleted; held
   * to the worker's bounds (`maxJobRetentionMs`, `maxJobTombstoneMs`).
   * @defaultValue unset (the worker's `retentionMs`, the janitor's `tombstoneMs`)
   */
  readonly retention?: KeyRetention;
}

/** A per-key concurrency limit: at most `limit` jobs naming `key` run at once. */
export interface ConcurrencyLimit {
  /** The concurrency key (the group), e.g. `tenant:acme`. */
  readonly key: string;
  /** How many of its jobs may run at once. */
  readonly limit: number;
}

/** Longest key of a coalescing job: room for `#<generation>` within a key's 255 characters. */
export const MAX_COALESCING_KEY_LENGTH = 235;

/** Most jobs of one concurrency key that may be allowed to run at once. */
export const MAX_CONCURRENCY_LIMIT = 10_000;

/** What a job is, for the claim: its key, scope, payload, and what its fingerprint covers. */
export interface JobIdentity<P = unknown> {
  /** The key's scope. */
  readonly scope: string;
  /** The idempotency key. */
  readonly key: string;
  /** What the handler receives as `ctx.data`. */
  readonly payload: P;
  /** The value fingerprinted; same key + different identity = key reused. */
  readonly fingerprintOf: unknown;
  /** At most `limit` jobs of this concurrency key run at once. @defaultValue unset (no limit) */
  readonly concurrency?: ConcurrencyLimit;
  /** Coalescing mode (see {@link WireJobData.coalesce}). @defaultValue `false` */
  readonly coalesce?: boolean;
  /** The key's own retention (see {@link WireJobData.retention}), well formed, not yet held to the worker's bounds. @defaultValue unset */
  readonly retention?: KeyRetention;
}

/** The parts of a BullMQ job that identify it. */
export interface JobLike {
  /** The job's id. */
  readonly id?: string;
  /** The job's name (covered by the fingerprint under the wire contract). */
  readonly name: string;
  /** The job's data: {@link WireJobData} under the wire contract. */
  readonly data: unknown;
}

/**
 * Reads a job under the default wire contract; throws a {@link ValidationError}
 * (`INVALID_JOB_DATA`, `INVALID_KEY`, `INVALID_SCOPE`) saying what is wrong, with the scope and
 * key once they are known. Everything it returns can be fingerprinted: data a foreign
 * producer wrote (deep nesting, lone surrogates) is refused here, before the recursive
 * canonicaliser or Postgres sees it.
 */
export function identityFromWireContract(job: JobLike): JobIdentity {
  const data = job.data;
  if (data === null || typeof data !== 'object' || Array.isArray(data)) {
    throw malformed('job.data', `job.data must be an object, got ${describe(data)}`);
  }
  const record = data as Record<string, unknown>;
  if (!('idempotencyKey' in record)) throw malformed('job.data.idempotencyKey', '"idempotencyKey" is missing');
  const scope = record.scope === undefined ? DEFAULT_SCOPE : record.scope;
  const named = `scope "${printable(String(scope))}", key "${printable(String(record.idempotencyKey))}"`;
  // All three are stored as text: Postgres refuses a NUL, and writes a lone surrogate as
  // U+FFFD, so two different keys would become one. Checked before the key's own rules (which
  // refuse the same) so that the error names the job's scope and key as the wire contract's do.
  const texts = [['job.data.idempotencyKey', 'key', record.idempotencyKey], ['job.data.scope', 'scope', scope], ['job.name', 'job name', job.name]] as const;
  for (const [field, what, text] of texts) {
    const found = typeof text === 'string' ? findJsonProblem(text, { maxDepth: 0, allowNul: false }) : undefined;
    if (found) throw malformed(field, `the ${what} ${found.problem} (${named})`);
  }
  assertValidKeyPart('key', record.idempotencyKey);
  assertValidKeyPart('scope', scope);
  if (!('payload' in record) || record.payload === undefined) {
    throw malformed('job.data.payload', `"payload" is missing (${named})`);
  }
  assertWirePayload(record.payload, named);
  const concurrency = concurrencyOf(record, named);
  if (record.coalesce !== undefined && typeof record.coalesce !== 'boolean') throw malformed('job.data.coalesce', `"coalesce" must be true or false (${named})`);
  // Each run of a coalescing key is the idempotency key `<key>#<generation>`, which must fit the 255 characters of a key.
  if (record.coalesce === true && record.idempotencyKey.length > MAX_COALESCING_KEY_LENGTH) {
    throw malformed('job.data.idempotencyKey', `a coalescing job's key may have at most ${MAX_COALESCING_KEY_LENGTH} characters (${named})`);
  }
  const retention = retentionOf(record.retention, named);
  return {
    scope,
    key: record.idempotencyKey,
    payload: record.payload,
    fingerprintOf: { name: job.name, payload: record.payload },
    ...(concurrency ? { concurrency } : {}),
    ...(record.coalesce === true ? { coalesce: true } : {}),
    ...(retention ? { retention } : {}),
  };
}

/** The job's own retention, if it names one; refuses a malformed one (see {@link retentionProblem}). */
function retentionOf(value: unknown, named: string): KeyRetention | undefined {
  if (value === undefined) return undefined;
  const problem = retentionProblem(value);
  if (problem) throw malformed(`job.data.retention${problem[0]}`, `"retention" ${problem[1]} (${named})`);
  const { resultMs, tombstoneMs } = value as KeyRetention;
  return { ...(resultMs === undefined ? {} : { resultMs }), ...(tombstoneMs === undefined ? {} : { tombstoneMs }) };
}

/** The job's concurrency limit, if it names one; refuses half of one or a bad value. */
function concurrencyOf(record: Record<string, unknown>, named: string): ConcurrencyLimit | undefined {
  const { concurrencyKey: key, concurrencyLimit: limit } = record;
  if (key === undefined && limit === undefined) return undefined;
  if (typeof key !== 'string' || key.length < 1 || key.length > 255 || findJsonProblem(key, { maxDepth: 0, allowNul: false })) {
    throw malformed('job.data.concurrencyKey', `"concurrencyKey" must be a string of 1–255 characters without NUL or lone surrogates when "concurrencyLimit" is given (${named})`);
  }
  if (typeof limit !== 'number' || !Number.isInteger(limit) || limit < 1 || limit > MAX_CONCURRENCY_LIMIT) {
    throw malformed('job.data.concurrencyLimit', `"concurrencyLimit" must be a whole number from 1 to ${MAX_CONCURRENCY_LIMIT} when "concurrencyKey" is given (${named})`);
  }
  return { key, limit };
}

/** What a job carries besides its key, scope and payload (see {@link toWireJobData}). */
export interface WireJobExtras {
  /** See {@link WireJobData.concurrencyKey}. @defaultValue unset */
  readonly concurrency?: ConcurrencyLimit;
  /** See {@link WireJobData.retention}. @defaultValue unset */
  readonly retention?: KeyRetention;
}

/**
 * Builds the wire-contract job data. Throws a {@link ValidationError} (`INVALID_JOB_DATA`) for
 * a payload, concurrency limit or retention the workers would refuse (see
 * {@link identityFromWireContract}), so a producer hears of it at once instead of finding a
 * failed job later. `extras` may also be a {@link ConcurrencyLimit} alone.
 */
export function toWireJobData<P>(scope: string, key: string, payload: P, extras: WireJobExtras | ConcurrencyLimit = {}): WireJobData<P> {
  const named = `scope "${printable(scope)}", key "${printable(key)}"`;
  assertWirePayload(payload, named);
  // A concurrency limit alone is the form this function took before it took the extras.
  if ('limit' in extras) extras = { concurrency: extras };
  const { concurrency } = extras;
  const retention = retentionOf(extras.retention, named);
  let data: WireJobData<P> = { idempotencyKey: key, scope, payload };
  if (concurrency) {
    data = { ...data, concurrencyKey: concurrency.key, concurrencyLimit: concurrency.limit };
    concurrencyOf(data as unknown as Record<string, unknown>, named);
  }
  return retention ? { ...data, retention } : data;
}

/**
 * The BullMQ job id for a key: deterministic, so BullMQ itself ignores a duplicate add while
 * the job exists. BullMQ ids may not contain `:` and keys may, so the id is a hash: `ij_` and
 * 32 hex digits of SHA-256 over the scope and key (128 bits; collisions are not a concern).
 */
export function jobIdFor(scope: string, key: string): string {
  return `ij_${createHash('sha256').update(JSON.stringify([scope, key])).digest('hex').slice(0, 32)}`;
}

/** Refuses a payload nested too deep or holding what cannot be fingerprinted (NUL is fine: it is not stored). */
function assertWirePayload(payload: unknown, named: string): void {
  const found = findJsonProblem(payload, { maxDepth: MAX_PAYLOAD_DEPTH, allowNul: true });
  if (found) throw malformed(`job.data.payload${found.pointer}`, `"payload" ${describeJsonProblem(found)} (${named})`);
}

function malformed(field: string, problem: string): ValidationError {
  return new ValidationError(
    'INVALID_JOB_DATA',
    field,
    `Malformed job data: ${problem}. Expected { idempotencyKey: string, scope?: string, payload: JSON, retention?: { resultMs?, tombstoneMs? } } ` +
      '(see "The wire contract" in docs/guide.md).',
  );
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value;
}
