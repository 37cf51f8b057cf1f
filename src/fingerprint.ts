import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';

/** Computes the fingerprint of what identifies a request: equal requests, equal fingerprints. */
export type Fingerprinter = (identity: unknown) => string;

/**
 * SHA-256 (hex) of the RFC 8785 canonical JSON of `identity`: object keys sorted, numbers and
 * strings in one spelling, so `{a:1,b:2}` and `{b:2,a:1}` fingerprint alike, in any language
 * that implements RFC 8785.
 */
export const sha256Fingerprint: Fingerprinter = (identity) => {
  const canonical = canonicalize(identity === undefined ? null : identity);
  return createHash('sha256')
    .update(canonical ?? 'null')
    .digest('hex');
};
