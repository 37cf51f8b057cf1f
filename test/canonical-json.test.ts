/**
 * The library's RFC 8785 serialiser spells every JSON value exactly as the `canonicalize`
 * package (which it replaced, so that the library loads under CommonJS transforms) did:
 * fingerprints stored before the change still match the same requests after it.
 */
import canonicalize from 'canonicalize';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { canonicalJson } from '../src/canonical-json.js';
import { propertyRuns } from './support/property-runs.js';

describe('canonicalJson', () => {
  it('spells the RFC 8785 example (section 3.2.2) as the RFC does', () => {
    const value = {
      // The RFC's own literal, which JavaScript reads as 333333333.3333333.
      // eslint-disable-next-line no-loss-of-precision
      numbers: [333333333.33333329, 1e30, 4.5, 2e-3, 0.000000000000000000000000001],
      string: '\u20ac$\u000F\u000aA\'\u0042\u0022\u005c\\"/',
      literals: [null, true, false],
    };
    expect(canonicalJson(value)).toBe(
      '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}',
    );
  });

  it('sorts keys by UTF-16 code units, not by code points or locale', () => {
    expect(canonicalJson({ '\u{1F600}': 1, '\uFB33': 2, b: 3, B: 4 })).toBe('{"B":4,"b":3,"\u{1F600}":1,"\uFB33":2}');
  });

  it('follows JSON.stringify for toJSON, undefined, functions and symbols', () => {
    const at = new Date(Date.UTC(2026, 0, 2));
    expect(canonicalJson({ at, gone: undefined, fn: () => 1, sym: Symbol('s'), list: [undefined, () => 1, Symbol('t')] })).toBe(
      '{"at":"2026-01-02T00:00:00.000Z","list":[null,null,null]}',
    );
    expect(canonicalJson(undefined)).toBeUndefined();
  });

  it('agrees with the canonicalize package on every JSON value', () => {
    const json = fc.jsonValue({ maxDepth: 6 });
    fc.assert(
      fc.property(json, (value) => {
        expect(canonicalJson(value)).toBe(canonicalize(value));
      }),
      propertyRuns('canonicalJson agrees with canonicalize', 2000),
    );
  });
});
