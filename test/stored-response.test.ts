/**
 * The encoding of an idempotent endpoint's response for storage and sending: what every
 * framework answers, stores and replays.
 */
import { expect, it } from 'vitest';
import { decodeResponse, encodeResponse } from '../src/http-idempotency/stored-response.js';

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
