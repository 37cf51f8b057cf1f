/**
 * The encoding of an idempotent endpoint's response for storage and sending: what every
 * framework answers, stores and replays.
 */
import { randomBytes } from 'node:crypto';
import { expect, it } from 'vitest';
import {
  STORED_HEADERS_ALLOWANCE_BYTES,
  decodeResponse,
  encodeResponse,
  largestStorableBodyBytes,
  storedResponseBytesBound,
} from '../src/http-idempotency/stored-response.js';

/** Bodies of every kind, and those that grow most once stored: bytes that are not UTF-8 (base64), text JSON escapes (quotes, control characters), non-ASCII text. */
const bodies = (n: number): unknown[] => [
  randomBytes(n),
  '\u0001'.repeat(n),
  '"'.repeat(n),
  '\n'.repeat(n),
  'é'.repeat(Math.floor(n / 2)),
  'x'.repeat(n),
  ...(n >= 14 ? [{ padding: 'x'.repeat(n - 14) }] : []),
];
const storedBytes = (stored: unknown) => Buffer.byteLength(JSON.stringify(stored));

it.each([204, 205, 304])('a body given with %i is dropped: stored, answered and replayed without one', (status) => {
  const { stored, answer } = encodeResponse({ status, headers: { etag: '"v1"' }, body: { ignored: true } }, 1024);
  expect(stored.body).toBeNull();
  expect(stored.headers).toEqual([['etag', '"v1"']]);
  expect(answer.body).toBeUndefined();
  expect(decodeResponse(stored).body).toBeUndefined();
  // The Fetch API's Response, which the NestJS interceptor builds, takes it.
  expect(() => new Response(answer.body ?? null, { status })).not.toThrow();
});

it('a body given with 200 is kept', () => {
  const { stored } = encodeResponse({ status: 200, body: { kept: true } }, 1024);
  expect(stored.body).toEqual({ text: '{"kept":true}' });
});

it('a body is stored as text when that is no longer than base64: text that JSON escapes heavily goes as base64, and is answered the same', () => {
  expect(encodeResponse({ status: 200, body: 'plain text, "quoted"\n' }, 1024).stored.body).toEqual({ text: 'plain text, "quoted"\n' });
  for (const body of ['\u0001'.repeat(300), '"'.repeat(300)]) {
    const { stored, answer } = encodeResponse({ status: 200, body }, 1024);
    expect(stored.body).toHaveProperty('base64');
    expect(answer.body!.toString('utf8')).toBe(body);
    expect(decodeResponse(stored).body!.toString('utf8')).toBe(body);
  }
});

it('refuses a response past maxStoredBytes as its key measures it, the JSON text, to the byte', () => {
  for (const body of bodies(500)) {
    const response = { status: 201, headers: { location: '/orders/é1', 'x-tab': 'a\tb' }, body };
    const exact = storedBytes(encodeResponse(response, 1024).stored);
    expect(() => encodeResponse(response, 1024, exact)).not.toThrow();
    expect(() => encodeResponse(response, 1024, exact - 1)).toThrow(/maxResultBytes/);
  }
});

it('a body up to maxBodyBytes, with headers within the allowance, takes at most storedResponseBytesBound once stored; largestStorableBodyBytes is the most that fits', () => {
  const headers = { 'x-padding': 'é'.repeat(Math.floor(STORED_HEADERS_ALLOWANCE_BYTES / 2) - 200) };
  for (const n of [1, 2, 3, 100, 4_096]) {
    for (const body of bodies(n)) {
      const { stored } = encodeResponse({ status: 200, headers, body }, n);
      expect(storedBytes(stored)).toBeLessThanOrEqual(storedResponseBytesBound(n));
    }
  }
  for (const maxStoredBytes of [storedResponseBytesBound(1), 65_536, 1_048_576, 1_048_579]) {
    const largest = largestStorableBodyBytes(maxStoredBytes);
    expect(storedResponseBytesBound(largest)).toBeLessThanOrEqual(maxStoredBytes);
    expect(storedResponseBytesBound(largest + 1)).toBeGreaterThan(maxStoredBytes);
  }
  expect(largestStorableBodyBytes(storedResponseBytesBound(1) - 1)).toBe(0);
});
