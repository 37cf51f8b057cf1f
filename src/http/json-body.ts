import { isUtf8 } from 'node:buffer';
import type { FastifyInstance } from 'fastify';
import { MAX_PAYLOAD_DEPTH, describeJsonProblem, findJsonProblem, lossyIntegerLiterals } from '../json-limits.js';
import { findJsonSyntaxError } from './json-syntax.js';
import { HttpProblem } from './problems.js';

/**
 * Replaces Fastify's `application/json` parser with one that refuses, as 400
 * `invalid-request` saying what and where, every body this system cannot store as a job
 * payload:
 *
 * - bytes that are not UTF-8 (Fastify's parser decodes them to U+FFFD, so the job would carry
 *   text the client never sent);
 * - values nested deeper than {@link MAX_PAYLOAD_DEPTH}, non-finite numbers (`1e400` parses as
 *   Infinity), integer literals beyond ±(2^53 − 1) (they would be rounded), lone surrogates
 *   and NUL characters (Postgres `jsonb` cannot store them).
 *
 * - text that is not JSON: where it stops being JSON (line, column) and what the route expects,
 *   instead of Fastify's bare "Body is not valid JSON".
 *
 * Parsing itself stays Fastify's (secure-json-parse, which refuses `__proto__` and
 * `constructor.prototype` keys). Fastify's body limit applies too (413 above it).
 */
export function installJsonBodyParser(app: FastifyInstance): void {
  const parseJson = app.getDefaultJsonParser('error', 'error');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (request, body, done) => {
    const bytes = body as Buffer;
    if (!isUtf8(bytes)) {
      done(new HttpProblem('invalid-request', 'The body is not valid UTF-8; send the JSON encoded as UTF-8.'), undefined);
      return;
    }
    const text = bytes.toString('utf8');
    parseJson(request, text, (error, value) => {
      if (error) {
        done(notJson(text, request.url, error), undefined);
        return;
      }
      const found = findJsonProblem(value, { maxDepth: MAX_PAYLOAD_DEPTH, allowNul: false, lossyNumbers: lossyIntegerLiterals(text) });
      if (found) {
        done(new HttpProblem('invalid-request', `The payload ${describeJsonProblem(found)}. Nothing was enqueued; correct the body and send it again.`), undefined);
        return;
      }
      done(null, value);
    });
  });
}

/** The 400 for a body that is not JSON: what was found where, and what the route takes. */
function notJson(text: string, url: string, error: Error): Error {
  const syntax = findJsonSyntaxError(text);
  // Refused by Fastify for another reason (a forbidden __proto__ key): its message says which.
  if (!syntax) return error;
  const expected = url.startsWith('/v1/')
    ? 'The body is the job\'s payload: one JSON value, e.g. {"orderId": 42, "cents": 1999}, sent with Content-Type: application/json; the key goes in the Idempotency-Key header.'
    : 'Send one JSON value with Content-Type: application/json; /openapi.json gives each route\'s body.';
  return new HttpProblem(
    'invalid-request',
    `The body is not valid JSON: ${syntax.found} at line ${syntax.line}, column ${syntax.column} (byte ${syntax.offset}). Nothing was enqueued. ${expected}`,
  );
}
