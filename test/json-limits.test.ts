/**
 * The JSON limits every boundary applies (protocol/json-limits.ts), the fingerprint's guard,
 * and how the HTTP API classifies errors: client mistakes 4xx, an unreachable Postgres or
 * Redis (real ioredis errors) 503 with Retry-After, anything else 500.
 */
import { createServer } from 'node:net';
import fc from 'fast-check';
import { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { ValidationError } from '../src/index.js';
import { HttpProblem, toHttpProblem } from '../src/http/problems.js';
import { sha256Fingerprint } from '../src/fingerprint.js';
import { isRedisUnavailable, isTransientDependencyError } from '../src/http/dependency-errors.js';
import { MAX_PAYLOAD_DEPTH, describeJsonProblem, findJsonProblem, lossyIntegerLiterals, printable } from '../src/json-limits.js';

const stored = { maxDepth: MAX_PAYLOAD_DEPTH, allowNul: false };
const handedOn = { maxDepth: MAX_PAYLOAD_DEPTH, allowNul: true };

function deepArray(depth: number): unknown {
  let value: unknown = 0;
  for (let level = 0; level < depth; level++) value = [value];
  return value;
}

describe('findJsonProblem', () => {
  it('accepts any JSON value without lone surrogates, NUL allowed or not as asked', () => {
    fc.assert(
      fc.property(fc.jsonValue({ stringUnit: 'binary', maxDepth: 6 }), (value) => {
        expect(findJsonProblem(value, handedOn)).toBeUndefined();
        const hasNul = JSON.stringify(value).includes('\\u0000');
        expect(findJsonProblem(value, stored) === undefined).toBe(!hasNul);
      }),
      { numRuns: 100 },
    );
  });

  it('says what and where: depth, non-finite numbers, BigInt, lone surrogates in values and keys, NUL', () => {
    expect(findJsonProblem(deepArray(64), stored)).toBeUndefined();
    expect(findJsonProblem(deepArray(65), stored)).toEqual({ pointer: '/0'.repeat(64), problem: 'is nested deeper than 64 levels of arrays and objects' });
    expect(findJsonProblem({ a: [1, Infinity] }, stored)?.pointer).toBe('/a/1');
    expect(findJsonProblem({ a: NaN }, stored)?.problem).toMatch(/number JSON cannot hold \(NaN/);
    expect(findJsonProblem({ n: 10n }, stored)?.problem).toMatch(/BigInt/);
    expect(findJsonProblem({ s: ['ok', 'x\udc00'] }, stored)).toMatchObject({ pointer: '/s/1', problem: expect.stringMatching(/lone UTF-16 surrogate/) });
    expect(findJsonProblem({ 'a/b~c': { '\ud800': 1 } }, stored)).toMatchObject({ pointer: '/a~1b~0c/\\ud800', problem: expect.stringMatching(/^has a key that holds a lone/) });
    expect(findJsonProblem({ a: 'x\u0000' }, stored)?.problem).toMatch(/NUL/);
    expect(findJsonProblem({ a: 'x\u0000' }, handedOn)).toBeUndefined();
    // A pair is one character; only halves are refused.
    expect(findJsonProblem('\ud83d\ude00', stored)).toBeUndefined();
    expect(describeJsonProblem({ pointer: '', problem: 'is bad' })).toBe('is bad at the top level');
  });

  it('walks without recursion: a million levels and a cycle are refused, not a stack overflow', () => {
    expect(findJsonProblem(deepArray(1_000_000), stored)?.problem).toMatch(/nested deeper than 64/);
    const cycle: unknown[] = [];
    cycle.push({ again: cycle });
    expect(findJsonProblem(cycle, stored)?.problem).toMatch(/nested deeper than 64/);
  });

  it('checks what serialisers see: toJSON results', () => {
    expect(findJsonProblem({ at: new Date(0) }, stored)).toBeUndefined();
    expect(findJsonProblem({ odd: { toJSON: () => 'x\ud800' } }, stored)?.pointer).toBe('/odd');
  });
});

describe('lossyIntegerLiterals', () => {
  it('lists integer literals JSON.parse rounds, not floats, not safe integers, not digits in strings', () => {
    const text = '{"s":"12345678901234567890","e":"\\"98765432109876543210","a":12345678901234567890,"f":1.2345678901234567890,"x":1e400,"ok":9007199254740991,"neg":-9007199254740993}';
    expect([...lossyIntegerLiterals(text)]).toEqual([Number('12345678901234567890'), -(2 ** 53)]);
    expect(lossyIntegerLiterals('[1,2,3]').size).toBe(0);
  });

  it('finds every big integer literal wherever it is', () => {
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 3 }), fc.bigInt({ min: 2n ** 53n, max: 10n ** 30n }), (value, big) => {
        const text = JSON.stringify([value, { big: 0 }]).replace('"big":0', `"big":${big}`);
        expect(lossyIntegerLiterals(text).has(Number(big))).toBe(true);
      }),
      { numRuns: 200 },
    );
  });
});

describe('printable', () => {
  it('escapes control characters and lone surrogates, keeps pairs, and cuts long text', () => {
    expect(printable('a\u0000b\ud800c\ud83d\ude00\n')).toBe('a\\u0000b\\ud800c\ud83d\ude00\\u000a');
    expect(printable('k'.repeat(300))).toBe(`${'k'.repeat(100)}…`);
  });
});

describe('sha256Fingerprint', () => {
  it('refuses what RFC 8785 cannot spell with a ValidationError saying where, never a RangeError', () => {
    for (const value of [{ payload: deepArray(10_000) }, { payload: { a: Infinity } }, { payload: 'x\ud800' }]) {
      let thrown: unknown;
      try {
        sha256Fingerprint(value);
      } catch (error) {
        thrown = error;
      }
      expect(thrown).toBeInstanceOf(ValidationError);
      expect((thrown as ValidationError).code).toBe('INVALID_JOB_DATA');
      expect((thrown as Error).message).toMatch(/Cannot fingerprint the request: its value .* at \/payload/);
    }
  });

  it('is unchanged for valid values: key order does not matter', () => {
    expect(sha256Fingerprint({ a: 1, b: [2, 'x\u0000'] })).toBe(sha256Fingerprint({ b: [2, 'x\u0000'], a: 1 }));
  });
});

async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

describe('error classification of the HTTP API', () => {
  it('real ioredis errors against an unreachable Redis are "unavailable"', async () => {
    const port = await closedPort();
    const errors: unknown[] = [];
    const gaveUp = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 0, retryStrategy: () => 50 });
    gaveUp.on('error', () => {});
    errors.push(await gaveUp.get('x').catch((error: unknown) => error));
    gaveUp.disconnect();
    const closed = new Redis({ host: '127.0.0.1', port, retryStrategy: () => null, lazyConnect: true });
    closed.on('error', () => {});
    await closed.connect().catch(() => {});
    errors.push(await closed.get('x').catch((error: unknown) => error));
    closed.disconnect();
    for (const error of errors) {
      expect(error).toBeInstanceOf(Error);
      expect(isRedisUnavailable(error), String(error)).toBe(true);
      const problem = toHttpProblem(error, 'req-1');
      expect({ kind: problem.kind, status: problem.status, retryAfter: problem.headers['retry-after'] }).toEqual({ kind: 'temporarily-unavailable', status: 503, retryAfter: '2' });
    }
  });

  it('store errors: terminated, refused, wrapped or aggregated are transient; others are not', () => {
    const terminated = Object.assign(new Error('terminating connection due to administrator command'), { code: '57P01' });
    const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:1'), { code: 'ECONNREFUSED' });
    expect(isTransientDependencyError(terminated)).toBe(true);
    expect(isTransientDependencyError(refused)).toBe(true);
    expect(isTransientDependencyError(new Error('claim failed', { cause: terminated }))).toBe(true);
    expect(isTransientDependencyError(new AggregateError([refused], 'connect failed'))).toBe(true);
    expect(isTransientDependencyError(Object.assign(new Error('duplicate key'), { code: '23505' }))).toBe(false);
    expect(isTransientDependencyError(new Error('boom'))).toBe(false);
    const loop: Error & { cause?: unknown } = new Error('loop');
    loop.cause = loop;
    expect(isTransientDependencyError(loop)).toBe(false);
  });

  it('maps client mistakes to 4xx and the unexpected to a 500 that leaks nothing', () => {
    expect(toHttpProblem(new ValidationError('INVALID_JOB_DATA', 'payload', 'bad payload'), 'r').kind).toBe('invalid-request');
    const own = new HttpProblem('not-found', 'x');
    expect(toHttpProblem(own, 'r')).toBe(own);
    const unexpected = toHttpProblem(new TypeError('secret detail'), 'r-9');
    expect({ kind: unexpected.kind, detail: unexpected.message }).toEqual({ kind: 'internal-error', detail: expect.not.stringContaining('secret') });
  });
});
