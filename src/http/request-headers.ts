import { createHash, timingSafeEqual } from 'node:crypto';
import { ANONYMOUS_TENANT } from './http-options.js';
import { ValidationError } from '../errors.js';
import { retentionProblem } from '../protocol/key-retention.js';
import { assertValidKeyPart } from '../protocol/validate.js';
import type { KeyRetention } from '../store/records.js';
import { HttpProblem } from './problems.js';

/**
 * Reads the `Idempotency-Key` header (pass `headersDistinct`, so that a repeated header is
 * seen as such rather than joined with commas). draft-ietf-httpapi-idempotency-key-header-07 makes it a
 * Structured Field string (`"…"`); Stripe and most clients send it bare. Both are accepted:
 * a quoted value is unquoted (`\"` and `\\` unescaped), anything else is taken as it is.
 * Throws a 400 {@link HttpProblem} when it is missing, empty, longer than 255 characters or
 * otherwise unusable.
 */
export function readIdempotencyKey(header: string | readonly string[] | undefined): string {
  if (header === undefined || (Array.isArray(header) && header.length === 0)) {
    throw new HttpProblem(
      'missing-idempotency-key',
      'This request needs an Idempotency-Key header: a unique value per logical request (e.g. a UUID), reused on every retry of it.',
    );
  }
  if (typeof header !== 'string' && header.length > 1) {
    throw new HttpProblem('invalid-idempotency-key', 'Send exactly one Idempotency-Key header.');
  }
  let key = typeof header === 'string' ? header : header[0]!;
  if (key.length >= 2 && key.startsWith('"') && key.endsWith('"')) {
    const inner = key.slice(1, -1);
    if (/(^|[^\\])"/.test(inner) || /\\[^"\\]/.test(inner) || inner.endsWith('\\')) {
      throw new HttpProblem('invalid-idempotency-key', 'The Idempotency-Key is a malformed quoted string (only \\" and \\\\ may be escaped).');
    }
    key = inner.replace(/\\(["\\])/g, '$1');
  }
  return readPathKey(key);
}

/** Checks a key taken from a URL path (GET), or from the header once unquoted. */
export function readPathKey(key: string): string {
  try {
    assertValidKeyPart('key', key);
  } catch (error) {
    if (error instanceof ValidationError) throw new HttpProblem('invalid-idempotency-key', error.message);
    throw error;
  }
  return key;
}

/**
 * The `wait` preference of RFC 7240 (`Prefer: wait=10`, possibly among others and over
 * several headers), in seconds; undefined when absent or malformed (a preference the server
 * does not understand is ignored, per RFC 7240 §2).
 */
export function readPreferWait(header: string | string[] | undefined): number | undefined {
  if (header === undefined) return undefined;
  const values = Array.isArray(header) ? header : [header];
  for (const value of values) {
    for (const preference of value.split(',')) {
      const [head] = preference.split(';');
      const match = /^\s*wait\s*=\s*"?(\d{1,9})"?\s*$/i.exec(head ?? '');
      if (match) return Number(match[1]);
    }
  }
  return undefined;
}

/**
 * Bearer tokens → tenants. Lookups compare SHA-256 digests in constant time, so response
 * timing tells nothing about how much of a token was right.
 */
export class BearerAuthenticator {
  readonly #tokens: ReadonlyArray<{ digest: Buffer; tenant: string }>;

  constructor(tokens: ReadonlyMap<string, string>) {
    this.#tokens = [...tokens].map(([token, tenant]) => ({ digest: digest(token), tenant }));
  }

  /** False when no tokens are configured: every request is the anonymous tenant (loopback only). */
  get enabled(): boolean {
    return this.#tokens.length > 0;
  }

  /** The tenant of an `Authorization` header; throws a 401 {@link HttpProblem} otherwise. */
  tenantOf(authorization: string | undefined): string {
    if (!this.enabled) return ANONYMOUS_TENANT;
    const challenge = 'Bearer realm="idempotent-jobs"';
    const match = authorization === undefined ? null : /^Bearer +([\x21-\x7e]+) *$/i.exec(authorization);
    if (!match) {
      throw new HttpProblem('unauthorized', 'Send Authorization: Bearer <token> with a token configured for your tenant.', {
        'www-authenticate': challenge,
      });
    }
    const presented = digest(match[1]!);
    let tenant: string | undefined;
    for (const entry of this.#tokens) if (timingSafeEqual(entry.digest, presented)) tenant = entry.tenant;
    if (tenant === undefined) {
      throw new HttpProblem('unauthorized', 'The bearer token is not known. Check it, or ask for one.', {
        'www-authenticate': `${challenge}, error="invalid_token"`,
      });
    }
    return tenant;
  }
}

function digest(token: string): Buffer {
  return createHash('sha256').update(token).digest();
}

/**
 * Reads a job's own retention from the POST's query (`resultMs`, `tombstoneMs`: the wire
 * contract's `retention`), each a whole number of milliseconds; undefined when neither is given.
 * Throws a 400 {@link HttpProblem} (`invalid-request`) naming what is wrong: not a number, a
 * fraction, negative, beyond 100 years, or given twice. Values above the workers' bounds are
 * theirs to hold to them.
 */
export function readRetentionQuery(query: { readonly resultMs?: unknown; readonly tombstoneMs?: unknown }): KeyRetention | undefined {
  const retention: Record<string, unknown> = {};
  for (const part of ['resultMs', 'tombstoneMs'] as const) {
    const value = query[part];
    if (value === undefined) continue;
    if (Array.isArray(value)) throw new HttpProblem('invalid-request', `Give the query parameter ${part} at most once.`);
    // Digits only: Number() would also take "1e3", " 5" or "0x10".
    retention[part] = typeof value === 'string' && /^\d{1,16}$/.test(value) ? Number(value) : value;
  }
  if (Object.keys(retention).length === 0) return undefined;
  const problem = retentionProblem(retention);
  if (problem) throw new HttpProblem('invalid-request', `The query parameter ${problem[1]}. Nothing was enqueued.`);
  return retention as KeyRetention;
}
