// @module-tag redis
/**
 * The HTTP idempotency middleware under hostile requests (fast-check), through each framework's
 * adapter: random `Idempotency-Key` values (bare, quoted, badly quoted, long, Latin-1, repeated
 * as several lines), client identities, `Prefer` headers, content types and bodies (random JSON,
 * deep nesting, huge numbers, surrogates, NUL, invalid UTF-8, random bytes, oversized). A
 * client's mistake is never a 5xx, every refusal of the middleware is problem+json, a request
 * sent again is answered as the first was, and the app still serves afterwards.
 * `HTTP_IDEMPOTENCY_FUZZ_RUNS` sets the runs per framework (default 120).
 */
import { request as httpRequest, Agent } from 'node:http';
import fc from 'fast-check';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys } from '../src/index.js';
import { IdempotentRequests, type IdempotentResponse, type RequestContext } from '../src/http-idempotency/index.js';
import { FRAMEWORKS, startApp, type RunningApp } from './support/idempotent-apps.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const RUNS = Number(process.env.HTTP_IDEMPOTENCY_FUZZ_RUNS ?? 120);
const REQUEST_TIMEOUT_MS = 15_000;

let env: TestEnv;

beforeAll(async () => {
  env = await createTestEnv('http_idempotency_fuzz');
  await sql`create table ${sql.id(env.schema, 'fuzz_orders')} (client text not null, key text not null, attempt integer not null, cents integer not null, primary key (client, key, attempt))`.execute(env.db);
});
afterAll(async () => {
  await env?.teardown();
});

/** Validates like a real endpoint (a stored 400), writes an order, and echoes the body's fields in its 201 (bounded: a response over `maxResponseBytes` is the server's fault, a 500). */
async function fuzzHandler(ctx: RequestContext, body: any): Promise<IdempotentResponse> {
  if (body === null || typeof body !== 'object' || Array.isArray(body) || !Number.isSafeInteger(body.cents) || body.cents <= 0) {
    return { status: 400, body: { error: 'send { "cents": <a positive whole number> }' } };
  }
  return ctx.transaction(async (tx) => {
    await sql`insert into ${sql.id(env.schema, 'fuzz_orders')} (client, key, attempt, cents) values (${ctx.client}, ${ctx.key ?? ''}, ${ctx.attempt}, ${body.cents})`.execute(tx);
    return { status: 201, body: { cents: body.cents, fields: Object.keys(body).slice(0, 20).map((name) => name.slice(0, 100)), extra: JSON.stringify(body.extra ?? null).slice(0, 2_000) } };
  });
}

interface Answer {
  readonly status: number;
  readonly contentType: string | undefined;
  readonly body: string;
}

function send(url: string, agent: Agent, method: string, path: string, headers: Record<string, string | string[]>, body: Buffer | undefined): Promise<Answer> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: hostname, port, method, path, headers, agent }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () => resolve({ status: res.statusCode!, contentType: res.headers['content-type'], body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.setTimeout(REQUEST_TIMEOUT_MS, () => req.destroy(new Error(`no answer within ${REQUEST_TIMEOUT_MS} ms`)));
    req.on('error', (error: NodeJS.ErrnoException) => {
      // A server may stop reading an oversized body and close the connection after answering.
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
const key = fc.oneof(
  fc.stringMatching(/^[A-Za-z0-9-]{1,24}$/),
  headerValue,
  fc.constantFrom('""', '"a\\"b"', '"unterminated', '"bad \\x escape"', 'k'.repeat(255), 'k'.repeat(256), ' spaced ', '"', '\\'),
  fc.array(fc.stringMatching(/^[a-z0-9]{1,8}$/), { minLength: 2, maxLength: 3 }),
);
const body: fc.Arbitrary<Buffer | undefined> = fc.oneof(
  fc.constant(undefined),
  fc.integer({ min: 1, max: 1_000_000 }).map((cents) => Buffer.from(JSON.stringify({ cents }))),
  fc.tuple(fc.integer({ min: 1, max: 1_000 }), fc.jsonValue({ stringUnit: 'binary', maxDepth: 3 })).map(([cents, extra]) => Buffer.from(JSON.stringify({ cents, extra }), 'utf8')),
  fc.jsonValue({ stringUnit: 'binary' }).map((value) => Buffer.from(JSON.stringify(value), 'utf8')),
  fc.integer({ min: 1, max: 20_000 }).chain((depth) => fc.constantFrom('[', '{"a":').map((open) => Buffer.from(`${open.repeat(depth)}1${(open === '[' ? ']' : '}').repeat(depth)}`))),
  fc.constantFrom('1e400', '-1e999', '12345678901234567890', '0.1e-400').map((n) => Buffer.from(`{"cents":${n},"n":[${n}]}`)),
  fc.constantFrom('"\\ud800"', '{"cents":1,"a":"\\udfff"}', '{"\\ud800":1,"cents":2}', '{"cents":3,"a":"\\u0000"}', '{"cents":4,"s":"x\\udc00y"}').map((text) => Buffer.from(text)),
  fc.uint8Array({ minLength: 1, maxLength: 8 }).map((bytes) => Buffer.concat([Buffer.from('{"cents":5,"s":"'), Buffer.from([0xff, ...bytes]), Buffer.from('"}')])),
  fc.uint8Array({ maxLength: 2000 }).map((bytes) => Buffer.from(bytes)),
  fc.constantFrom('', ' ', 'null', '{"__proto__":{"polluted":1},"cents":1}', '{"constructor":{"prototype":{"polluted":1}},"cents":1}', '{"a":1}{"b":2}', '\ufeff{"cents":1}').map((text) => Buffer.from(text)),
  fc.integer({ min: 90_000, max: 1_200_000 }).map((size) => Buffer.from(`{"cents":1,"blob":"${'x'.repeat(size)}"}`)),
);
const hostileRequest = fc.record({
  path: fc.constantFrom('/orders', '/fast-orders', '/orders?x=1', '/fast-orders?a=%ff'),
  key: fc.option(key, { nil: undefined, freq: 6 }),
  client: fc.option(fc.oneof(fc.constantFrom('acme', 'globex'), headerValue, fc.constant('c'.repeat(300))), { nil: undefined, freq: 8 }),
  contentType: fc.option(fc.oneof(fc.constantFrom('application/json', 'application/json; charset=utf-8', 'APPLICATION/JSON', 'text/plain', 'application/octet-stream', 'application/jsonx'), headerValue), { nil: undefined, freq: 6 }),
  prefer: fc.option(fc.oneof(fc.constantFrom('wait=1', 'wait=0', 'wait=abc', 'wait=99999999999', 'respond-async, wait=1'), headerValue), { nil: undefined, freq: 3 }),
  body,
  again: fc.boolean(),
});

/** A request that gets past key, client and content type: only its body is hostile. */
const wellFramed = fc.record({
  path: fc.constantFrom('/orders', '/fast-orders'),
  key: fc.uuid(),
  client: fc.constant('acme'),
  contentType: fc.constant('application/json'),
  prefer: fc.constant(undefined),
  body,
  again: fc.boolean(),
});
const anyRequest = fc.oneof(hostileRequest, wellFramed);

describe.each(FRAMEWORKS)('%s under hostile requests', (framework) => {
  let app: RunningApp;
  const agent = new Agent({ keepAlive: true, maxSockets: 4 });
  beforeAll(async () => {
    // A namespace per framework: the keys fast-check draws would otherwise meet another framework's.
    const requests = new IdempotentRequests({ keys: new IdempotencyKeys({ db: env.db, schema: env.schema }), namespace: `fuzz-${framework}`, maxWaitSeconds: 1, logger: pino({ level: 'silent' }) });
    app = await startApp(framework, requests, fuzzHandler);
  });
  afterAll(async () => {
    agent.destroy();
    await app?.close();
  });

  it('answers no client mistake with a 5xx, refuses as problem+json, answers a repeated request as the first, and keeps serving', async () => {
    const seen = new Map<number, number>();
    await fc.assert(
      fc.asyncProperty(anyRequest, async (r) => {
        const headers: Record<string, string | string[]> = {};
        if (r.key !== undefined) headers['idempotency-key'] = r.key;
        if (r.client !== undefined) headers['x-client'] = r.client;
        if (r.contentType !== undefined) headers['content-type'] = r.contentType;
        if (r.prefer !== undefined) headers.prefer = r.prefer;
        const answer = await send(app.url, agent, 'POST', r.path, headers, r.body);
        seen.set(answer.status, (seen.get(answer.status) ?? 0) + 1);
        const what = `POST ${r.path} answered ${answer.status}: ${answer.body.slice(0, 300)}`;
        expect(answer.status, what).toBeLessThan(500);
        if (answer.contentType?.startsWith('application/problem+json')) {
          const problem = JSON.parse(answer.body) as { type: string; status: number };
          expect(problem.type).toMatch(/^urn:idempotent-jobs:problem:/);
          expect(problem.status).toBe(answer.status);
        }
        // The same request again: the same answer (a replay of what was stored, or the same refusal).
        if (r.again && answer.status !== 0) {
          const second = await send(app.url, agent, 'POST', r.path, headers, r.body);
          expect(second.status, `again: ${what}; then ${second.status}: ${second.body.slice(0, 300)}`).toBe(answer.status);
          if (answer.status === 201) expect(second.body).toBe(answer.body);
        }
      }),
      { numRuns: RUNS },
    );
    // The fuzz reached the handler (a created order, a stored 400) and the middleware's refusals.
    expect([...seen.keys()]).toEqual(expect.arrayContaining([201, 400]));
    const after = await send(app.url, agent, 'POST', '/orders', { 'idempotency-key': `after-${framework}-${Date.now()}`, 'x-client': 'acme', 'content-type': 'application/json' }, Buffer.from('{"cents":1}'));
    expect(after.status).toBe(201);
  });
});
