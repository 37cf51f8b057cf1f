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
 * `concurrencyLimits`: optional, instead of the pair, outside the fingerprint: a list of 1–4
 * `{ "key": …, "limit": … }` with distinct keys (e.g. a tenant's limit and one "in all"); the
 * job runs only while it holds a slot of every key it names.
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
   * Several limits at once, instead of `concurrencyKey` / `concurrencyLimit`: 1–4 entries with
   * distinct keys, e.g. `[{ key: 'tenant:acme', limit: 2 }, { key: 'all-syncs', limit: 10 }]`;
   * the job runs only while it holds a slot of every one.
   * @defaultValue unset (no limit)
   */
  readonly concurrencyLimits?: readonly ConcurrencyLimit[];
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

/** Most concurrency keys one job may name (each one more statement per run, and one more slot to wait for). */
export const MAX_CONCURRENCY_KEYS = 4;

/** The limits a job's concurrency names, sorted by key: the order every job takes its slots in, so none deadlock. */
export function concurrencyLimitsOf(concurrency: ConcurrencyLimit | readonly ConcurrencyLimit[] | undefined): readonly ConcurrencyLimit[] {
  if (concurrency === undefined) return [];
  const limits = Array.isArray(concurrency) ? [...(concurrency as readonly ConcurrencyLimit[])] : [concurrency as ConcurrencyLimit];
  return limits.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
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
  /**
   * At most `limit` jobs of this concurrency key run at once; a list: the job runs only while it
   * holds a slot of each key, taken in key order. @defaultValue unset (no limit)
   */
  readonly concurrency?: ConcurrencyLimit | readonly ConcurrencyLimit[];
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

/** The job's concurrency limit (or limits), if it names any; refuses half of a pair, a bad value, or both forms at once. */
function concurrencyOf(record: Record<string, unknown>, named: string): ConcurrencyLimit | readonly ConcurrencyLimit[] | undefined {
  const { concurrencyKey: key, concurrencyLimit: limit, concurrencyLimits: list } = record;
  if (list !== undefined) {
    if (key !== undefined || limit !== undefined) {
      throw malformed('job.data.concurrencyLimits', `give either "concurrencyLimits" or "concurrencyKey" with "concurrencyLimit", not both (${named})`);
    }
    return concurrencyListOf(list, named);
  }
  if (key === undefined && limit === undefined) return undefined;
  return concurrencyEntryOf(key, limit, 'job.data.concurrencyKey', 'job.data.concurrencyLimit', named);
}

/** A list of concurrency limits: 1–{@link MAX_CONCURRENCY_KEYS} well-formed entries with distinct keys. */
function concurrencyListOf(list: unknown, named: string): readonly ConcurrencyLimit[] {
  if (!Array.isArray(list) || list.length < 1 || list.length > MAX_CONCURRENCY_KEYS) {
    throw malformed('job.data.concurrencyLimits', `"concurrencyLimits" must be a list of 1 to ${MAX_CONCURRENCY_KEYS} { key, limit } entries (${named})`);
  }
  const limits = list.map((entry: unknown, n) => {
    if (entry === null || typeof entry !== 'object' || Array.isArray(entry)) {
      throw malformed(`job.data.concurrencyLimits/${n}`, `each entry of "concurrencyLimits" must be an object { key, limit } (${named})`);
    }
    const { key, limit } = entry as Record<string, unknown>;
    return concurrencyEntryOf(key, limit, `job.data.concurrencyLimits/${n}/key`, `job.data.concurrencyLimits/${n}/limit`, named);
  });
  const seen = new Set<string>();
  for (const [n, { key }] of limits.entries()) {
    if (seen.has(key)) throw malformed(`job.data.concurrencyLimits/${n}/key`, `"concurrencyLimits" names the key "${printable(key)}" twice (${named})`);
    seen.add(key);
  }
  return limits;
}

/** One concurrency key and its limit, `keyField` and `limitField` naming where they were read. */
function concurrencyEntryOf(key: unknown, limit: unknown, keyField: string, limitField: string, named: string): ConcurrencyLimit {
  const [keyName, limitName] = [keyField, limitField].map((field) => field.replace(/^job\.data\./, ''));
  if (typeof key !== 'string' || key.length < 1 || key.length > 255 || findJsonProblem(key, { maxDepth: 0, allowNul: false })) {
    throw malformed(keyField, `"${keyName}" must be a string of 1–255 characters without NUL or lone surrogates when "${limitName}" is given (${named})`);
  }
  if (typeof limit !== 'number' || !Number.isInteger(limit) || limit < 1 || limit > MAX_CONCURRENCY_LIMIT) {
    throw malformed(limitField, `"${limitName}" must be a whole number from 1 to ${MAX_CONCURRENCY_LIMIT} when "${keyName}" is given (${named})`);
  }
  return { key, limit };
}

/** What a job carries besides its key, scope and payload (see {@link toWireJobData}). */
export interface WireJobExtras {
  /** See {@link WireJobData.concurrencyKey} and {@link WireJobData.concurrencyLimits}: one limit, or 1–4 with distinct keys. @defaultValue unset */
  readonly concurrency?: ConcurrencyLimit | readonly ConcurrencyLimit[];
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
    // One limit keeps the pair of fields, which workers of every version read.
    const [only, ...more] = Array.isArray(concurrency) ? (concurrency as readonly ConcurrencyLimit[]) : [concurrency as ConcurrencyLimit];
    data =
      only && more.length === 0
        ? { ...data, concurrencyKey: only.key, concurrencyLimit: only.limit }
        : { ...data, concurrencyLimits: (concurrency as readonly ConcurrencyLimit[]).map(({ key: group, limit }) => ({ key: group, limit })) };
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
    `Malformed job data: ${problem}. Expected { idempotencyKey: string, scope?: string, payload: JSON, concurrencyKey?, concurrencyLimit?, concurrencyLimits?: [{ key, limit }], retention?: { resultMs?, tombstoneMs? } } ` +
      '(see "The wire contract" in docs/guide.md).',
  );
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value;
}
