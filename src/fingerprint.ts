import { hash } from 'node:crypto';
import { canonicalJson } from './canonical-json.js';
import { ValidationError } from './errors.js';
import { MAX_FINGERPRINT_DEPTH, describeJsonProblem, findJsonProblem } from './json-limits.js';

/** Computes the fingerprint of what identifies a request: equal requests, equal fingerprints. */
export type Fingerprinter = (identity: unknown) => string;

/**
 * SHA-256 (hex) of the RFC 8785 canonical JSON of `identity`: object keys sorted, numbers and
 * strings in one spelling, so `{a:1,b:2}` and `{b:2,a:1}` fingerprint alike, in any language
 * that implements RFC 8785.
 *
 * RFC 8785 has no spelling for a non-finite number or a lone surrogate, and the canonicaliser
 * recurses, so such values and ones nested deeper than 128 levels are
 * refused first with a {@link ValidationError} saying what and where (the boundaries refuse
 * them earlier with the job's scope and key; this is the guard for every other caller).
 */
export const sha256Fingerprint: Fingerprinter = (identity) => {
  const found = findJsonProblem(identity, { maxDepth: MAX_FINGERPRINT_DEPTH, allowNul: true });
  if (found) {
    throw new ValidationError('INVALID_JOB_DATA', 'fingerprint', `Cannot fingerprint the request: its value ${describeJsonProblem(found)}.`);
  }
  const canonical = canonicalJson(identity === undefined ? null : identity);
  // One call, without a Hash object to make and finish (about 1.5 µs a job less on Node 20).
  return hash('sha256', canonical ?? 'null', 'hex');
};
