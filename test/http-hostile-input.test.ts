// @module-tag redis
/**
 * Hostile input at the HTTP API: bodies that once answered 500 (deep nesting, 1e400, lone
 * surrogates) and others nothing can store (invalid UTF-8, NUL, integers that would be
 * rounded) answer 400 `invalid-request` naming what is wrong and where, and enqueue nothing.
 * A store that cannot be reached answers 503 with Retry-After, and the server keeps serving.
 */
import { request as httpRequest } from 'node:http';
import { createServer, type Server } from 'node:net';
import { sql, type Kysely } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, createHttpApi, createPostgresDb, type HttpApi } from '../src/index.js';
import { problemType } from '../src/http/problems.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const TOKEN = 'tok_hostile_0123456789abcdef';
const QUEUE = 'hostile';
const PATH = `/v1/queues/${QUEUE}/jobs`;
const silent = pino({ level: 'silent' });

let env: TestEnv;
let api: HttpApi;
let baseUrl: string;

beforeAll(async () => {
  env = await createTestEnv('http-hostile');
  const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
  api = await createHttpApi({ keys, connection: { url: env.redisUrl }, prefix: env.redisPrefix, queues: [QUEUE], tokens: { [TOKEN]: 'acme' }, relay: false, logger: silent });
  baseUrl = await api.listen({ host: '127.0.0.1', port: 0 });
});
afterAll(async () => {
  await api?.close();
  await env?.teardown();
});

interface RawAnswer {
  readonly status: number;
  readonly headers: Record<string, string | string[] | undefined>;
  readonly body: any;
}

/** A request through node:http with a body of raw bytes (fetch would re-encode a string). */
function send(base: string, method: string, path: string, headers: Record<string, string>, body?: Buffer): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(new URL(path, base), { method, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let parsed: unknown = text;
        try {
          parsed = JSON.parse(text);
        } catch {
          // not JSON: keep the text
        }
        resolve({ status: res.statusCode!, headers: res.headers, body: parsed });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

const postBody = (key: string, body: string | Buffer, base = baseUrl) =>
  send(base, 'POST', PATH, { authorization: `Bearer ${TOKEN}`, 'idempotency-key': key, 'content-type': 'application/json' }, Buffer.isBuffer(body) ? body : Buffer.from(body, 'utf8'));

async function outboxCount(): Promise<number> {
  const { rows } = await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, 'outbox')}`.execute(env.db);
  return Number(rows[0]!.n);
}

function expectInvalidRequest(answer: RawAnswer, detail: RegExp) {
  expect({ status: answer.status, type: answer.body?.type }).toEqual({ status: 400, type: problemType('invalid-request') });
  expect(String(answer.headers['content-type'])).toMatch(/^application\/problem\+json/);
  expect(answer.body.detail).toMatch(detail);
}

describe('hostile request bodies', () => {
  it('a body of 5,000 nested arrays (10 KB) is a 400 naming the depth limit, not a 500 (stack overflow)', async () => {
    const answer = await postBody('deep-1', '['.repeat(5000) + ']'.repeat(5000));
    expectInvalidRequest(answer, /nested deeper than 64 levels.*at \/0\/0\/0/);
  });

  it('a payload nested 64 levels deep is accepted; 65 is refused', async () => {
    expect((await postBody('depth-64', '['.repeat(64) + ']'.repeat(64))).status).toBe(202);
    expectInvalidRequest(await postBody('depth-65', '{"a":' + '['.repeat(64) + ']'.repeat(64) + '}'), /nested deeper than 64 levels/);
  });

  it('{"a":1e400} is a 400 naming the non-finite number, not a 500 ("Infinity is not allowed")', async () => {
    expectInvalidRequest(await postBody('inf-1', '{"a":1e400}'), /number JSON cannot hold.*at \/a/);
    expectInvalidRequest(await postBody('inf-2', '[1, -1e400]'), /at \/1/);
  });

  it('{"a":"\\ud800"} is a 400 naming the lone surrogate, not a 500 ("Lone surrogate is not allowed")', async () => {
    expectInvalidRequest(await postBody('surrogate-1', '{"a":"\\ud800"}'), /lone UTF-16 surrogate.*at \/a/);
    expectInvalidRequest(await postBody('surrogate-2', '{"x":{"\\udc00":1}}'), /has a key that holds a lone UTF-16 surrogate.*at \/x\/\\udc00/);
    // A pair is a character like any other.
    expect((await postBody('surrogate-pair', '{"a":"\\ud83d\\ude00"}')).status).toBe(202);
  });

  it('a body that is not valid UTF-8 is a 400, not silently read with replacement characters', async () => {
    const answer = await postBody('utf8-1', Buffer.concat([Buffer.from('{"a":"'), Buffer.from([0xc3, 0x28, 0xff]), Buffer.from('"}')]));
    expectInvalidRequest(answer, /not valid UTF-8/);
    // An encoded surrogate (CESU-8 style) is not UTF-8 either.
    expectInvalidRequest(await postBody('utf8-2', Buffer.concat([Buffer.from('"'), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from('"')])), /not valid UTF-8/);
  });

  it('a NUL anywhere, in a value or a key, is a 400 naming where', async () => {
    expectInvalidRequest(await postBody('nul-1', '{"a":["x\\u0000y"]}'), /NUL character.*at \/a\/0/);
    expectInvalidRequest(await postBody('nul-2', '{"\\u0000":1}'), /has a key that holds a NUL.*at \/\\u0000/);
  });

  it('an integer literal beyond ±(2^53 − 1) is a 400 (it would be rounded); floats and safe integers are fine', async () => {
    expectInvalidRequest(await postBody('big-1', '{"id":12345678901234567890}'), /integer beyond.*at \/id/);
    expectInvalidRequest(await postBody('big-2', '[-9007199254740993]'), /at \/0/);
    // Digits inside a string are not numbers.
    expect((await postBody('big-ok-1', '{"id":"12345678901234567890","n":9007199254740991,"f":1e300,"g":6.02e23}')).status).toBe(202);
  });

  it('refused bodies enqueue nothing and leave no request record', async () => {
    const before = await outboxCount();
    await postBody('nothing-1', '{"a":1e400}');
    await postBody('nothing-1', '{"a":"\\ud800"}');
    expect(await outboxCount()).toBe(before);
    const { rows } = await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, 'idempotency_keys')} where key = 'nothing-1'`.execute(env.db);
    expect(Number(rows[0]!.n)).toBe(0);
    // The same key with a valid body is a first request.
    expect((await postBody('nothing-1', '{"a":1}')).status).toBe(202);
  });
});

describe('a store whose connections are terminated', () => {
  it('a request after the server\'s backends were terminated answers 202, or 503 and then 202 on retry; never 500', async () => {
    const applicationName = `test:http-hostile-terminated-${process.pid}`;
    const db = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 3, applicationName }, () => {});
    const keys = new IdempotencyKeys({ db, schema: env.schema });
    const own = await createHttpApi({ keys, connection: { url: env.redisUrl }, prefix: env.redisPrefix, queues: [QUEUE], tokens: { [TOKEN]: 'acme' }, relay: false, logger: silent });
    try {
      const url = await own.listen({ host: '127.0.0.1', port: 0 });
      for (let round = 0; round < 3; round++) {
        expect((await postBody(`warm-${round}`, '{"a":1}', url)).status).toBe(202);
        // Only this server's own backends (by application_name), never anyone else's.
        await sql`select pg_terminate_backend(pid) from pg_stat_activity where application_name = ${applicationName}`.execute(env.db);
        const answer = await postBody(`after-terminate-${round}`, '{"a":1}', url);
        expect([202, 503], JSON.stringify(answer.body)).toContain(answer.status);
        if (answer.status === 503) {
          expect(answer.headers['retry-after']).toBeDefined();
          expect((await postBody(`after-terminate-${round}`, '{"a":1}', url)).status).toBe(202);
        }
      }
    } finally {
      await own.close();
      await db.destroy();
    }
  });
});

describe('a store that cannot be reached', () => {
  let closedPort: number;
  let deadDb: Kysely<any>;
  let deadApi: HttpApi;
  let deadUrl: string;
  let holder: Server;

  beforeAll(async () => {
    // A port nobody listens on: bind one, note it, close it.
    holder = createServer();
    await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve));
    closedPort = (holder.address() as { port: number }).port;
    await new Promise<void>((resolve) => holder.close(() => resolve()));
    deadDb = createPostgresDb({ connectionString: `postgres://postgres@127.0.0.1:${closedPort}/postgres`, maxConnections: 2, applicationName: 'test:http-hostile-dead' }, () => {});
    const keys = new IdempotencyKeys({ db: deadDb, schema: env.schema });
    deadApi = await createHttpApi({ keys, connection: { url: env.redisUrl }, prefix: env.redisPrefix, queues: [QUEUE], tokens: { [TOKEN]: 'acme' }, relay: false, logger: silent });
    deadUrl = await deadApi.listen({ host: '127.0.0.1', port: 0 });
  });
  afterAll(async () => {
    await deadApi?.close();
    await deadDb?.destroy();
  });

  it('POST and GET answer 503 problem+json with Retry-After, and the server keeps serving', async () => {
    for (let round = 0; round < 3; round++) {
      const post = await postBody(`down-${round}`, '{"a":1}', deadUrl);
      expect({ status: post.status, type: post.body?.type }).toEqual({ status: 503, type: problemType('temporarily-unavailable') });
      expect(String(post.headers['content-type'])).toMatch(/^application\/problem\+json/);
      expect(Number(post.headers['retry-after'])).toBeGreaterThanOrEqual(1);
      expect(post.body.detail).toMatch(/retry/i);

      const get = await send(deadUrl, 'GET', `${PATH}/down-${round}`, { authorization: `Bearer ${TOKEN}` });
      expect({ status: get.status, type: get.body?.type }).toEqual({ status: 503, type: problemType('temporarily-unavailable') });
      expect(Number(get.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    }
    expect((await send(deadUrl, 'GET', '/healthz', {})).status).toBe(200);
    // Client mistakes are still told apart from the outage.
    expect((await postBody('bad', '{"a":1e400}', deadUrl)).status).toBe(400);
  });
});
