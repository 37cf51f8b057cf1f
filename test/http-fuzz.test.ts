// @module-tag redis
/**
 * The HTTP API under random requests (fast-check): methods, paths (percent-encoded garbage,
 * invalid UTF-8, long segments), headers (keys, tokens, content types, preferences) and
 * bodies (random JSON, deep nesting, huge numbers, surrogates, NUL, invalid UTF-8, random
 * bytes, oversized). No answer is a 5xx, every refusal is problem+json, and the server still
 * serves afterwards. Also raw bytes on a socket: never a 5xx, never a dead server.
 */
import { request as httpRequest, Agent } from 'node:http';
import { connect } from 'node:net';
import fc from 'fast-check';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, createHttpApi, type HttpApi } from '../src/index.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const TOKEN = 'tok_fuzz_0123456789abcdef';
const QUEUE = 'fuzz';
const BODY_LIMIT = 64 * 1024;
const REQUEST_TIMEOUT_MS = 10_000;

let env: TestEnv;
let api: HttpApi;
let baseUrl: string;
let port: number;
const agent = new Agent({ keepAlive: true, maxSockets: 4 });

beforeAll(async () => {
  env = await createTestEnv('http-fuzz');
  const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
  api = await createHttpApi({
    keys,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    queues: [QUEUE, 'other'],
    tokens: { [TOKEN]: 'acme' },
    bodyLimitBytes: BODY_LIMIT,
    relay: false,
    logger: pino({ level: 'silent' }),
  });
  baseUrl = await api.listen({ host: '127.0.0.1', port: 0 });
  port = Number(new URL(baseUrl).port);
});
afterAll(async () => {
  agent.destroy();
  await api?.close();
  await env?.teardown();
});

interface Answer {
  readonly status: number;
  readonly contentType: string | undefined;
  readonly body: string;
}

function send(method: string, path: string, headers: Record<string, string>, body: Buffer | undefined): Promise<Answer> {
  // Framed as a client frames it: Node's client sends a GET's, DELETE's or OPTIONS's body with
  // neither a length nor chunks, so the server reads the request as bodiless and the body's bytes
  // as the start of the next request on the connection (a HEAD's answer then came to a request
  // that began with them; found with fast-check seed -1237210518).
  const framed = body === undefined ? headers : { ...headers, 'content-length': String(body.length) };
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: '127.0.0.1', port, method, path, headers: framed, agent }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () => resolve({ status: res.statusCode!, contentType: res.headers['content-type'], body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.setTimeout(REQUEST_TIMEOUT_MS, () => req.destroy(new Error(`no answer within ${REQUEST_TIMEOUT_MS} ms`)));
    req.on('error', (error: NodeJS.ErrnoException) => {
      // The server may stop reading an oversized or unparsable body and close the connection
      // after answering; the answer is what counts, and it was already resolved.
      if (error.code === 'ECONNRESET' || error.code === 'EPIPE') resolve({ status: 0, contentType: undefined, body: '' });
      else reject(error);
    });
    req.end(body);
  });
}

/** Characters Node's client accepts in a header value: tab, printable ASCII, Latin-1. */
const headerValue = fc.string({
  unit: fc.oneof(fc.integer({ min: 0x20, max: 0x7e }), fc.constant(0x09), fc.integer({ min: 0x80, max: 0xff })).map((code) => String.fromCharCode(code)),
  maxLength: 300,
});
/** A path segment: printable ASCII without space, `?` and `#`, or percent-encoded random bytes (often invalid UTF-8). */
const segment = fc.oneof(
  fc.string({ unit: fc.integer({ min: 0x21, max: 0x7e }).filter((c) => c !== 0x3f && c !== 0x23).map((c) => String.fromCharCode(c)), maxLength: 40 }),
  fc.uint8Array({ maxLength: 12 }).map((bytes) => [...bytes].map((b) => `%${b.toString(16).padStart(2, '0')}`).join('')),
  fc.constantFrom('', '..', '%', '%zz', '%00', '%2F', '%ED%A0%80', 'x'.repeat(1100), QUEUE, 'jobs', 'v1', 'queues'),
);
const path = fc
  .tuple(
    fc.oneof(
      fc.constantFrom(`/v1/queues/${QUEUE}/jobs`, '/healthz', '/readyz', '/metrics', '/openapi.json', '/', '/v1', '/v1/queues'),
      segment.map((key) => `/v1/queues/${QUEUE}/jobs/${key}`),
      segment.map((queue) => `/v1/queues/${queue}/jobs`),
      fc.array(segment, { maxLength: 6 }).map((parts) => `/${parts.join('/')}`),
    ),
    fc.option(fc.oneof(segment.map((name) => `name=${name}`), segment), { nil: undefined }),
  )
  .map(([base, query]) => (query === undefined ? base : `${base}?${query}`));

const depthText = fc.integer({ min: 1, max: 20_000 }).chain((depth) =>
  fc.constantFrom('[', '{"a":').map((open) => `${open.repeat(depth)}1${(open === '[' ? ']' : '}').repeat(depth)}`),
);
const numberText = fc.oneof(
  fc.constantFrom('1e400', '-1e999', '1e308', '12345678901234567890', '-9007199254740993', '9007199254740991', '0.1e-400', '1' + '0'.repeat(400)),
  fc.bigInt({ min: -(10n ** 40n), max: 10n ** 40n }).map(String),
).map((n) => `{"n":${n},"list":[${n}]}`);
const escapeText = fc
  .constantFrom('\\ud800', '\\udfff', '\\ud83d\\ude00', '\\u0000', '\\ud83d', 'x\\udc00y', '\\uD800\\uD800')
  .chain((escape) => fc.constantFrom(`"${escape}"`, `{"a":"${escape}"}`, `{"${escape}":1}`, `[["${escape}"]]`));
const invalidUtf8 = fc
  .tuple(fc.jsonValue({ maxDepth: 2 }), fc.uint8Array({ minLength: 1, maxLength: 8 }).map((bytes) => Buffer.from([0xff, ...bytes])))
  .map(([value, bad]) => Buffer.concat([Buffer.from(`{"v":${JSON.stringify(value)},"s":"`), bad, Buffer.from('"}')]));
const body: fc.Arbitrary<Buffer | undefined> = fc.oneof(
  fc.constant(undefined),
  fc.jsonValue({ stringUnit: 'binary' }).map((value) => Buffer.from(JSON.stringify(value), 'utf8')),
  fc.jsonValue({ maxDepth: 3 }).map((value) => Buffer.from(JSON.stringify({ order: value }), 'utf8')),
  depthText.map((text) => Buffer.from(text)),
  numberText.map((text) => Buffer.from(text)),
  escapeText.map((text) => Buffer.from(text)),
  invalidUtf8,
  fc.uint8Array({ maxLength: 2000 }).map((bytes) => Buffer.from(bytes)),
  fc.constantFrom('', ' ', 'null', '{"__proto__":{"polluted":1}}', '{"constructor":{"prototype":{"polluted":1}}}', '{"a":1}{"b":2}', '\ufeff{}').map((text) => Buffer.from(text)),
  fc.integer({ min: BODY_LIMIT - 16, max: BODY_LIMIT + 4096 }).map((size) => Buffer.from(`{"blob":"${'x'.repeat(size)}"}`)),
);

const anyRequest = fc.record({
  method: fc.constantFrom('GET', 'POST', 'POST', 'POST', 'PUT', 'DELETE', 'PATCH', 'HEAD', 'OPTIONS'),
  path,
  authorization: fc.option(fc.oneof(fc.constant(`Bearer ${TOKEN}`), fc.constant(`bearer   ${TOKEN}`), headerValue.map((v) => `Bearer ${v}`), headerValue), { nil: undefined, freq: 1 }),
  key: fc.option(fc.oneof(fc.stringMatching(/^[a-z0-9-]{1,12}$/), headerValue, fc.constantFrom('""', '"a\\"b"', '"unterminated', 'k'.repeat(256))), { nil: undefined, freq: 1 }),
  contentType: fc.option(
    fc.oneof(
      fc.constantFrom(
        'application/json',
        'application/json; charset=utf-8',
        'APPLICATION/JSON',
        'application/json; charset=latin1',
        'application/json;;',
        'text/plain',
        'application/x-www-form-urlencoded',
        'multipart/form-data; boundary=x',
        'application/problem+json',
        'application/jsonx',
      ),
      headerValue,
    ),
    { nil: undefined, freq: 1 },
  ),
  prefer: fc.option(fc.oneof(fc.constantFrom('wait=0', 'wait=abc', 'wait=-1', 'respond-async'), headerValue), { nil: undefined, freq: 1 }),
  requestId: fc.option(headerValue, { nil: undefined, freq: 2 }),
  extra: fc.dictionary(fc.stringMatching(/^x-[a-z0-9-]{1,16}$/), headerValue, { maxKeys: 3 }),
  body,
});

/** A POST that gets past token, queue, key and content type: only its body (and name) are hostile. */
const wellFramedPost = fc.record({
  method: fc.constant('POST'),
  path: fc.option(fc.oneof(fc.constantFrom('charge', 'a.b:c-1'), segment), { nil: undefined }).map((name) => `/v1/queues/${QUEUE}/jobs${name === undefined ? '' : `?name=${name}`}`),
  authorization: fc.constant(`Bearer ${TOKEN}`),
  key: fc.stringMatching(/^[A-Za-z0-9-]{1,16}$/),
  contentType: fc.constantFrom('application/json', 'application/json; charset=utf-8'),
  prefer: fc.constant(undefined),
  requestId: fc.constant(undefined),
  extra: fc.constant({}),
  body,
});
const request = fc.oneof(anyRequest, wellFramedPost);

describe('HTTP API under random requests', () => {
  it('answers every request below 500, refusals as problem+json, and keeps serving', async () => {
    const seen = new Map<number, number>();
    await fc.assert(
      fc.asyncProperty(request, async (r) => {
        const headers: Record<string, string> = { ...r.extra };
        if (r.authorization !== undefined) headers.authorization = r.authorization;
        if (r.key !== undefined) headers['idempotency-key'] = r.key;
        if (r.contentType !== undefined) headers['content-type'] = r.contentType;
        if (r.prefer !== undefined) headers.prefer = r.prefer;
        if (r.requestId !== undefined) headers['request-id'] = r.requestId;
        // A body on HEAD leaves Node's client unable to read the answer (the raw-socket test covers such framing).
        const answer = await send(r.method, r.path, headers, r.method === 'HEAD' ? undefined : r.body);
        seen.set(answer.status, (seen.get(answer.status) ?? 0) + 1);
        expect(answer.status, `${r.method} ${r.path} answered ${answer.status}: ${answer.body.slice(0, 300)}`).toBeLessThan(500);
        if (answer.status >= 400 && r.method !== 'HEAD') {
          expect(answer.contentType, `${r.method} ${r.path}: ${answer.status}`).toMatch(/^application\/problem\+json/);
        }
      }),
      { numRuns: 300 },
    );
    // The fuzz reached the routes, not just the 404 handler.
    expect([...seen.keys()]).toEqual(expect.arrayContaining([202, 400, 401, 404]));

    expect((await send('GET', '/healthz', {}, undefined)).status).toBe(200);
    expect((await send('GET', '/readyz', {}, undefined)).status).toBe(200);
    const after = await send(
      'POST',
      `/v1/queues/${QUEUE}/jobs`,
      { authorization: `Bearer ${TOKEN}`, 'idempotency-key': `after-fuzz-${Date.now()}`, 'content-type': 'application/json' },
      Buffer.from('{"ok":true}'),
    );
    expect(after.status).toBe(202);
  });

  it('answers raw bytes on a socket with a 4xx or not at all, and keeps serving', async () => {
    const requestLine = fc.constantFrom('POST /v1/queues/fuzz/jobs HTTP/1.1', 'GET /healthz HTTP/1.1', 'GET / HTTP/1.0', 'BREW /pot HTTP/1.1', 'GET /%ff%fe HTTP/1.1', '');
    const garbage = fc.uint8Array({ maxLength: 400 }).map((bytes) => Buffer.from(bytes).toString('latin1'));
    const lines = fc.array(fc.oneof(garbage, fc.constantFrom('Host: x', 'Content-Length: 5', 'Content-Length: -1', 'Content-Length: 99999999999', 'Transfer-Encoding: chunked', 'Transfer-Encoding: gzip, chunked', 'Content-Type: application/json', `Authorization: Bearer ${TOKEN}`, 'Idempotency-Key: raw')), { maxLength: 6 });
    await fc.assert(
      fc.asyncProperty(requestLine, lines, garbage, async (first, headerLines, rest) => {
        const status = await rawExchange(Buffer.from(`${[first, ...headerLines].join('\r\n')}\r\n\r\n${rest}`, 'latin1'));
        if (status !== undefined) expect(status, `answered ${status}`).toBeLessThan(500);
      }),
      { numRuns: 100 },
    );
    expect((await send('GET', '/healthz', {}, undefined)).status).toBe(200);
  });
});

/** Writes `bytes`, then reads the status of the first answer; undefined when none comes within a moment (the server waits for more). */
function rawExchange(bytes: Buffer): Promise<number | undefined> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    let text = '';
    const finish = () => {
      clearTimeout(timer);
      socket.destroy();
      const match = /^HTTP\/1\.[01] (\d{3})/.exec(text);
      resolve(match ? Number(match[1]) : undefined);
    };
    const timer = setTimeout(finish, 150);
    socket.on('data', (chunk) => {
      text += chunk.toString('latin1');
      if (/^HTTP\/1\.[01] \d{3}/.test(text)) finish();
    });
    socket.on('error', finish);
    socket.on('close', finish);
    socket.write(bytes);
  });
}
