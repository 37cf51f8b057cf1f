import { createHash } from 'node:crypto';
import { ValidationError } from '../errors.js';
import { MAX_PAYLOAD_DEPTH, describeJsonProblem, findJsonProblem, printable } from '../protocol/json-limits.js';
import { DEFAULT_SCOPE, assertValidKeyPart } from '../protocol/validate.js';

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
 */
export interface WireJobData<P = unknown> {
  /** The idempotency key: 1–255 characters. */
  readonly idempotencyKey: string;
  /** Namespace of the key. @defaultValue `"default"` ({@link DEFAULT_SCOPE}) */
  readonly scope?: string;
  /** What the handler receives as `ctx.data`; any JSON, fingerprinted with the job name. */
  readonly payload: P;
  /** W3C `traceparent` of the producer's span; the worker's spans join its trace. @defaultValue unset (a new trace) */
  readonly traceparent?: string;
  /** W3C `tracestate` that goes with `traceparent`. @defaultValue unset */
  readonly tracestate?: string;
}

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
  return {
    scope,
    key: record.idempotencyKey,
    payload: record.payload,
    fingerprintOf: { name: job.name, payload: record.payload },
  };
}

/**
 * Builds the wire-contract job data. Throws a {@link ValidationError} (`INVALID_JOB_DATA`) for
 * a payload the workers would refuse (see {@link identityFromWireContract}), so a producer
 * hears of it at once instead of finding a failed job later.
 */
export function toWireJobData<P>(scope: string, key: string, payload: P): WireJobData<P> {
  assertWirePayload(payload, `scope "${printable(scope)}", key "${printable(key)}"`);
  return { idempotencyKey: key, scope, payload };
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
    `Malformed job data: ${problem}. Expected { idempotencyKey: string, scope?: string, payload: JSON } ` +
      '(see "The wire contract" in docs/guide.md).',
  );
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value;
}
