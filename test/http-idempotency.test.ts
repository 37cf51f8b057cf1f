// @module-tag redis
/**
 * `Idempotency-Key` on a service's own endpoints (idempotent-jobs/http-idempotency), on real
 * Postgres, through each framework's adapter (Express, Fastify, NestJS): the draft's conformance
 * points (missing, malformed, reused key; a concurrent retry), replay of the stored response, the
 * handler's writes and its job committed with the response or not at all, which statuses are
 * stored and which release the key, `Prefer: wait`, a lost lease, response size, scopes per
 * client, retention and tombstones.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, beforeEach, describe, expect, it, vi } from 'vitest';
import { request as httpRequest } from 'node:http';
import { IdempotencyKeys, IdempotentProducer, jobIdFor } from '../src/index.js';
import { Janitor } from '../src/process/index.js';
import { IdempotentRequests, type IdempotentResponse, type RequestContext } from '../src/http-idempotency/index.js';
import { FRAMEWORKS, startApp, type OrderHandler, type RunningApp } from './support/idempotent-apps.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let keys: IdempotencyKeys;
let producer: IdempotentProducer;
/** Handler runs per key (every run, committed or not). */
const runs = new Map<string, number>();
/** Gates a test opens to let a held handler go on, by key. */
const gates = new Map<string, { reached: () => void; release: Promise<void> }>();

beforeAll(async () => {
  env = await createTestEnv('http_idempotency');
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
  producer = new IdempotentProducer({ queue: 'payments', connection: { url: env.redisUrl }, prefix: env.redisPrefix, schema: env.schema });
  await sql`create table ${sql.id(env.schema, 'orders')} (client text not null, id text not null, attempt integer not null, cents integer not null, primary key (client, id, attempt))`.execute(env.db);
});
afterAll(async () => {
  await producer?.close();
  await env?.teardown();
});
beforeEach(() => {
  runs.clear();
  gates.clear();
});

/**
 * The order endpoint: validates (a stored 400), may be held on a gate before its transaction,
 * throws or answers 503 when asked, and otherwise writes the order and its payment job's outbox
 * row in the transaction that stores its 201.
 */
const orderHandler: OrderHandler = async (ctx: RequestContext, body: any): Promise<IdempotentResponse> => {
  runs.set(ctx.key ?? '', (runs.get(ctx.key ?? '') ?? 0) + 1);
  if (!body || !Number.isInteger(body.cents) || body.cents <= 0) return { status: 400, body: { error: 'cents must be a positive whole number' } };
  if (body.mode === 'throw') throw Object.assign(new Error('the payment provider is down'), { status: 502 });
  if (body.mode === 'unavailable') return { status: 503, headers: { 'retry-after': '1' }, body: { error: 'try later' } };
  const gate = gates.get(ctx.key ?? '');
  if (gate && body.mode !== 'inside') {
    gate.reached();
    await gate.release;
  }
  return ctx.transaction(async (tx) => {
    if (gate && body.mode === 'inside') {
      gate.reached();
      await gate.release;
    }
    await sql`insert into ${sql.id(env.schema, 'orders')} (client, id, attempt, cents) values (${ctx.client}, ${ctx.key}, ${ctx.attempt}, ${body.cents})`.execute(tx);
    await producer.enqueue({ name: 'pay', scope: ctx.client!, key: `order-${ctx.key}`, data: { cents: body.cents } }, { tx });
    const headers = { location: `/orders/${ctx.key}`, 'x-order-attempt': String(ctx.attempt), ...(typeof body.headerBytes === 'number' ? { 'x-padding': 'x'.repeat(body.headerBytes) } : {}) };
    // Text of control characters: each byte takes six as JSON text (`\u0001`).
    if (typeof body.controlText === 'number') return { status: 201, headers, body: '\u0001'.repeat(body.controlText) };
    const size = typeof body.padding === 'number' ? body.padding : 0;
    return { status: 201, headers, body: { id: ctx.key, cents: body.cents, padding: 'x'.repeat(size) } };
  });
};

/** Holds `key`'s next handler run; resolves `reached` once it is held, `open()` lets it go on. */
function holdHandler(key: string): { reached: Promise<void>; open: () => void } {
  let reached!: () => void;
  let open!: () => void;
  const reachedPromise = new Promise<void>((resolve) => (reached = resolve));
  const release = new Promise<void>((resolve) => (open = resolve));
  gates.set(key, { reached, release });
  return { reached: reachedPromise, open };
}

interface Reply {
  readonly status: number;
  readonly headers: Headers;
  readonly text: string;
  json(): any;
}

/** POSTs with node's client (each `key` a header line of its own, as fetch cannot send them). */
function post(app: RunningApp, path: string, options: { key?: string | string[]; body?: unknown; client?: string | null; headers?: Record<string, string>; raw?: string }): Promise<Reply> {
  const url = new URL(path, app.url);
  const headers: Record<string, string | string[]> = { 'content-type': 'application/json', ...options.headers };
  if (options.client !== null) headers['x-client'] = options.client ?? 'acme';
  if (options.key !== undefined) headers['idempotency-key'] = options.key;
  const body = options.raw ?? JSON.stringify(options.body ?? {});
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: url.hostname, port: url.port, path: url.pathname + url.search, method: 'POST', headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        const answerHeaders = new Headers();
        for (const [name, value] of Object.entries(res.headers)) if (value !== undefined) answerHeaders.set(name, Array.isArray(value) ? value.join(', ') : value);
        resolve({ status: res.statusCode!, headers: answerHeaders, text, json: () => JSON.parse(text) });
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

const count = async (table: 'orders' | 'outbox', where = sql`true`) =>
  Number((await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, table)} where ${where}`.execute(env.db)).rows[0]!.n);
const ordersOf = (key: string, client = 'acme') => count('orders', sql`client = ${client} and id = ${key}`);
const jobsOf = (key: string, client = 'acme') => count('outbox', sql`job_id = ${jobIdFor(client, `order-${key}`)}`);

/** A request key's row as the store has it, with how long until it expires (null: no expiry), or undefined when there is none. */
async function requestKeyRow(namespace: string, key: string, client = 'acme') {
  const { rows } = await sql<{ status: string; owner: string | null; expires_in_ms: number | null }>`
    select status, owner, (extract(epoch from expires_at - now()) * 1000)::float8 as expires_in_ms
      from ${sql.id(env.schema, 'idempotency_keys')} where scope = ${`request:${namespace}:${client}`} and key = ${key}`.execute(env.db);
  return rows[0];
}
const tombstonesOf = async (namespace: string, key: string, client = 'acme') =>
  Number(
    (
      await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, 'key_tombstones')}
        where scope = ${`request:${namespace}:${client}`} and key_hash = sha256(convert_to(${key}::text, 'UTF8'))`.execute(env.db)
    ).rows[0]!.n,
  );

/** A leased handler runs once per request; a database-only one may run again up to its transaction, which then finds the stored response and rolls back. */
const expectRuns = (path: string, key: string, leased: number) => {
  if (path === '/orders') expect(runs.get(key)).toBe(leased);
  else expect(runs.get(key)).toBeGreaterThanOrEqual(leased);
};

describe.each(FRAMEWORKS)('%s', (framework) => {
  let app: RunningApp;
  let requests: IdempotentRequests;
  beforeAll(async () => {
    requests = new IdempotentRequests({ keys, namespace: 'orders', leaseMs: 1_000, logger: pino({ level: 'silent' }) });
    app = await startApp(framework, requests, orderHandler);
  });
  afterAll(async () => {
    await app?.close();
  });

  for (const path of ['/orders', '/fast-orders']) {
    describe(path, () => {
      it('runs the handler once: its order, its job and its 201 commit together; a retry gets the same response, replayed', async () => {
        const key = randomUUID();
        const first = await post(app, path, { key, body: { cents: 1999 } });
        expect(first.status).toBe(201);
        expect(first.json()).toEqual({ id: key, cents: 1999, padding: '' });
        expect(first.headers.get('location')).toBe(`/orders/${key}`);
        expect(first.headers.get('idempotent-replayed')).toBeNull();
        const again = await post(app, path, { key, body: { cents: 1999 } });
        expect(again.status).toBe(201);
        expect(again.text).toBe(first.text);
        expect(again.headers.get('location')).toBe(`/orders/${key}`);
        expect(again.headers.get('content-type')).toBe(first.headers.get('content-type'));
        expect(again.headers.get('idempotent-replayed')).toBe('true');
        expectRuns(path, key, 1);
        expect(await ordersOf(key)).toBe(1);
        expect(await jobsOf(key)).toBe(1);
      });

      it('the same body in another key order and spacing is the same request', async () => {
        const key = randomUUID();
        expect((await post(app, path, { key, raw: '{"cents":5,"note":{"a":1,"b":2}}' })).status).toBe(201);
        const again = await post(app, path, { key, raw: '{ "note": { "b": 2, "a": 1 }, "cents": 5 }' });
        expect(again.headers.get('idempotent-replayed')).toBe('true');
      });

      it('the key reused with another body, or on another endpoint, is 422 and does nothing', async () => {
        const key = randomUUID();
        expect((await post(app, path, { key, body: { cents: 100 } })).status).toBe(201);
        const other = await post(app, path, { key, body: { cents: 101 } });
        expect(other.status).toBe(422);
        expect(other.headers.get('content-type')).toMatch(/^application\/problem\+json/);
        expect(other.json().type).toBe('urn:idempotent-jobs:problem:idempotency-key-reused');
        const elsewhere = await post(app, path === '/orders' ? '/fast-orders' : '/orders', { key, body: { cents: 100 } });
        expect(elsewhere.status).toBe(422);
        expect(await ordersOf(key)).toBe(1);
      });

      it('a missing key is 400 missing-idempotency-key; a malformed one 400 invalid-idempotency-key; the handler never runs', async () => {
        const missing = await post(app, path, { body: { cents: 1 } });
        expect(missing.status).toBe(400);
        expect(missing.json().type).toBe('urn:idempotent-jobs:problem:missing-idempotency-key');
        for (const key of ['', 'k'.repeat(256), '"unterminated\\"', ['a', 'b']]) {
          const malformed = await post(app, path, { key, body: { cents: 1 } });
          expect(malformed.status, JSON.stringify(key)).toBe(400);
          expect(malformed.json().type).toBe('urn:idempotent-jobs:problem:invalid-idempotency-key');
        }
        expect(runs.size).toBe(0);
        // The draft's Structured Field string form names the same key as the bare form.
        const key = randomUUID();
        expect((await post(app, path, { key: `"${key}"`, body: { cents: 3 } })).status).toBe(201);
        expect((await post(app, path, { key, body: { cents: 3 } })).headers.get('idempotent-replayed')).toBe('true');
      });

      it('keys are per client: another client with the same key makes its own order; no client identity is 401', async () => {
        const key = randomUUID();
        expect((await post(app, path, { key, body: { cents: 7 }, client: 'acme' })).status).toBe(201);
        const other = await post(app, path, { key: key, body: { cents: 8 }, client: 'globex' });
        // Same key, another client: its own first request (not a replay, not a 422); the order id collides, which is the handler's business.
        expect(other.headers.get('idempotent-replayed')).toBeNull();
        expect(other.status).not.toBe(422);
        expect((await post(app, path, { key: randomUUID(), body: { cents: 8 }, client: null })).status).toBe(401);
      });

      it('a 4xx the handler answers is stored and replayed; the handler does not run again', async () => {
        const key = randomUUID();
        const first = await post(app, path, { key, body: { cents: -1 } });
        expect(first.status).toBe(400);
        const again = await post(app, path, { key, body: { cents: -1 } });
        expect(again.status).toBe(400);
        expect(again.text).toBe(first.text);
        expect(again.headers.get('idempotent-replayed')).toBe('true');
        expectRuns(path, key, 1);
      });

      it('a 5xx the handler answers is sent, not stored: the retry runs the handler again and commits', async () => {
        const key = randomUUID();
        const first = await post(app, path, { key, body: { cents: 5, mode: 'unavailable' } });
        expect(first.status).toBe(503);
        expect(first.headers.get('retry-after')).toBe('1');
        expect(await ordersOf(key)).toBe(0);
        const again = await post(app, path, { key, body: { cents: 5, mode: 'unavailable' } });
        expect(again.status).toBe(503);
        expect(again.headers.get('idempotent-replayed')).toBeNull();
        expect(runs.get(key)).toBe(2);
      });

      it("the handler's thrown error goes to the framework; nothing is stored and a retry runs again", async () => {
        const key = randomUUID();
        const first = await post(app, path, { key, body: { cents: 5, mode: 'throw' } });
        expect(first.status).toBe(framework === 'fastify' ? 502 : framework === 'express' ? 502 : 500);
        const again = await post(app, path, { key, body: { cents: 5, mode: 'throw' } });
        expect(again.headers.get('idempotent-replayed')).toBeNull();
        expect(runs.get(key)).toBe(2);
        expect(await ordersOf(key)).toBe(0);
      });

      it('a key a 5xx or a thrown handler left released expires after the retention: the janitor deletes it, without a tombstone, and a corrected request under it runs', async () => {
        const DAY = 86_400_000;
        const janitor = new Janitor({ db: env.db, schema: env.schema, tombstoneMs: 2 * DAY, logger: pino({ level: 'silent' }) });
        for (const mode of ['unavailable', 'throw']) {
          const key = randomUUID();
          expect((await post(app, path, { key, body: { cents: 5, mode } })).status).toBeGreaterThanOrEqual(500);
          if (path === '/orders') {
            // Released by the leased run: no owner, and an expiry the keys' retention (24 h) away.
            const released = await requestKeyRow('orders', key);
            expect(released).toMatchObject({ status: 'processing', owner: null });
            expect(released!.expires_in_ms).toBeGreaterThan(DAY - 60_000);
            expect(released!.expires_in_ms).toBeLessThanOrEqual(DAY);
            // Until then the key keeps its request: another body is refused, the same one may retry.
            expect((await post(app, path, { key, body: { cents: 6 } })).status).toBe(422);
            await sql`update ${sql.id(env.schema, 'idempotency_keys')} set expires_at = now() - interval '1 second' where key = ${key}`.execute(env.db);
          } else {
            // Database-only: the claim rolled back with the handler's transaction; nothing is left.
            expect(await requestKeyRow('orders', key)).toBeUndefined();
          }
          await janitor.runOnce();
          expect(await requestKeyRow('orders', key)).toBeUndefined();
          expect(await tombstonesOf('orders', key)).toBe(0);
          const corrected = await post(app, path, { key, body: { cents: 6 } });
          expect(corrected.status, mode).toBe(201);
          expect(await ordersOf(key)).toBe(1);
        }
      });

      it('a response within maxResponseBytes is stored whatever its bytes: text of control characters, six times its size as JSON text, is replayed', async () => {
        const key = randomUUID();
        // 200 000 bytes, under maxResponseBytes (256 KiB); 1.2 MB as JSON text, over the keys' maxResultBytes (1 MiB).
        const first = await post(app, path, { key, body: { cents: 5, controlText: 200_000 } });
        expect(first.status).toBe(201);
        expect(first.text).toBe('\u0001'.repeat(200_000));
        const again = await post(app, path, { key, body: { cents: 5, controlText: 200_000 } });
        expect(again.status).toBe(201);
        expect(again.headers.get('idempotent-replayed')).toBe('true');
        expect(again.text).toBe(first.text);
        expectRuns(path, key, 1);
        expect(await ordersOf(key)).toBe(1);
      });

      it('a concurrent retry while the first is in flight is 409 with Retry-After; after it, the first response replays', async () => {
        const key = randomUUID();
        const held = holdHandler(key);
        // Database-only: the first request's claim is its open transaction, so it is held inside it.
        const mode = path === '/fast-orders' ? 'inside' : 'before';
        const first = post(app, path, { key, body: { cents: 42, mode } });
        await held.reached;
        const concurrent = await post(app, path, { key, body: { cents: 42, mode } });
        expect(concurrent.status).toBe(409);
        expect(concurrent.json().type).toBe('urn:idempotent-jobs:problem:request-in-progress');
        expect(Number(concurrent.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
        held.open();
        expect((await first).status).toBe(201);
        const after = await post(app, path, { key, body: { cents: 42, mode } });
        expect(after.status).toBe(201);
        expect(after.headers.get('idempotent-replayed')).toBe('true');
        expect(await ordersOf(key)).toBe(1);
        expect(await jobsOf(key)).toBe(1);
      });

      it('with Prefer: wait, a concurrent retry waits for the first and answers with its response', async () => {
        const key = randomUUID();
        const held = holdHandler(key);
        const mode = path === '/fast-orders' ? 'inside' : 'before';
        const first = post(app, path, { key, body: { cents: 43, mode } });
        await held.reached;
        const waiting = post(app, path, { key, body: { cents: 43, mode }, headers: { prefer: 'wait=10' } });
        // Whatever the waiting retry is doing, it does not answer before the first commits.
        await new Promise((resolve) => setTimeout(resolve, 300));
        held.open();
        const [firstAnswer, waited] = await Promise.all([first, waiting]);
        expect(firstAnswer.status).toBe(201);
        expect(waited.status).toBe(201);
        expect(waited.text).toBe(firstAnswer.text);
        expect(waited.headers.get('idempotent-replayed')).toBe('true');
        expect(await ordersOf(key)).toBe(1);
      });

      it('Prefer: wait is timed by a monotonic clock: a wall clock that stops or steps back does not stretch it', async () => {
        const key = randomUUID();
        const held = holdHandler(key);
        const mode = path === '/fast-orders' ? 'inside' : 'before';
        const first = post(app, path, { key, body: { cents: 44, mode } });
        await held.reached;
        // The wall clock stands still (an NTP step back looks the same to a deadline) while the retry waits.
        const stopped = vi.spyOn(Date, 'now').mockReturnValue(Date.now());
        try {
          const waiting = post(app, path, { key, body: { cents: 44, mode }, headers: { prefer: 'wait=1' } });
          const answer = await Promise.race([waiting, new Promise<'still waiting'>((resolve) => setTimeout(() => resolve('still waiting'), 8_000))]);
          expect(answer === 'still waiting' ? answer : answer.status).toBe(409);
        } finally {
          stopped.mockRestore();
          held.open();
        }
        expect((await first).status).toBe(201);
      });
    });
  }
});

describe('semantics apart from the framework (Fastify)', () => {
  let app: RunningApp;
  let requests: IdempotentRequests;
  beforeAll(async () => {
    requests = new IdempotentRequests({ keys, namespace: 'semantics', leaseMs: 1_000, maxResponseBytes: 1_000, logger: pino({ level: 'silent' }) });
    app = await startApp('fastify', requests, orderHandler);
  });
  afterAll(async () => {
    await app?.close();
  });

  it('a lost lease rolls the handler transaction back: the retry that took the key over is the one that commits', async () => {
    const key = randomUUID();
    const held = holdHandler(key);
    const first = post(app, '/orders', { key, body: { cents: 9, mode: 'inside' } });
    await held.reached;
    // The first request's lease runs out (backdated, as a stalled process's would) and a retry takes the key over.
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 second' where key = ${key}`.execute(env.db);
    gates.delete(key);
    const retry = await post(app, '/orders', { key, body: { cents: 9, mode: 'inside' } });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('x-order-attempt')).toBe('2');
    held.open();
    const firstAnswer = await first;
    // The zombie's completion is fenced out: its order and job rolled back, it is told the key is someone else's.
    expect(firstAnswer.status).toBe(409);
    expect(await ordersOf(key)).toBe(1);
    expect(await jobsOf(key)).toBe(1);
    const replay = await post(app, '/orders', { key, body: { cents: 9, mode: 'inside' } });
    expect(replay.text).toBe(retry.text);
  });

  it('a response over maxResponseBytes is a 500, rolled back and not stored; the key is free for the retry', async () => {
    const key = randomUUID();
    const tooLarge = await post(app, '/orders', { key, body: { cents: 9, padding: 2_000 } });
    expect(tooLarge.status).toBe(500);
    expect(tooLarge.json().type).toBe('urn:idempotent-jobs:problem:internal-error');
    expect(await ordersOf(key)).toBe(0);
    expect(await jobsOf(key)).toBe(0);
    const fits = await post(app, '/orders', { key, body: { cents: 9, padding: 2_000 } });
    expect(fits.status).toBe(500);
    expect(runs.get(key)).toBe(2);
  });

  it("maxResponseBytes must fit the keys' maxResultBytes once stored: refused at construction, naming both; unset, it is lowered to what fits, and a response of that size stores", async () => {
    expect(() => new IdempotentRequests({ keys, maxResponseBytes: 1_000_000 })).toThrow(/maxResponseBytes.*1000000.*maxResultBytes.*1048576/s);
    const small = new IdempotencyKeys({ db: env.db, schema: env.schema, maxResultBytes: 65_536 });
    const lowered = new IdempotentRequests({ keys: small, namespace: 'lowered' });
    const limit = lowered.options.maxResponseBytes;
    expect(limit).toBeLessThan(65_536);
    expect(new IdempotentRequests({ keys: small, maxResponseBytes: limit }).options.maxResponseBytes).toBe(limit);
    expect(() => new IdempotentRequests({ keys: small, maxResponseBytes: limit + 1 })).toThrow(/maxResponseBytes.*maxResultBytes.*65536/s);
    // The bodies that grow most once stored: bytes that are not UTF-8 (base64), text that JSON escapes.
    for (const body of [randomBytes(limit), '\u0001'.repeat(limit), '"'.repeat(limit)]) {
      const request = { method: 'POST', target: '/orders', idempotencyKey: randomUUID(), body: { cents: 1 }, client: 'acme' };
      const respond = async (ctx: RequestContext) => ctx.transaction(async () => ({ status: 201, headers: { location: '/orders/1', etag: '"v1"' }, body }));
      const first = await lowered.handle(request, respond);
      expect(first.outcome).toBe('created');
      const again = await lowered.handle(request, respond);
      expect(again.outcome).toBe('replayed');
      expect(again.body).toEqual(first.body);
    }
    const tiny = new IdempotencyKeys({ db: env.db, schema: env.schema, maxResultBytes: 1_000 });
    expect(() => new IdempotentRequests({ keys: tiny })).toThrow(/maxResultBytes.*1000/s);
  });

  it('a response whose headers make it too large to store is a 500 before anything commits, naming the limit; the key is released for the retry', async () => {
    const logged: string[] = [];
    const logger = { info() {}, warn() {}, error: (object: object, message: string) => logged.push(`${message} ${String((object as { err?: Error }).err?.message)}`) };
    const small = new IdempotencyKeys({ db: env.db, schema: env.schema, maxResultBytes: 32_768 });
    const strict = new IdempotentRequests({ keys: small, namespace: 'strict', maxResponseBytes: 16_000, logger });
    const strictApp = await startApp('fastify', strict, orderHandler);
    try {
      const key = randomUUID();
      const tooLarge = await post(strictApp, '/orders', { key, body: { cents: 9, headerBytes: 40_000 } });
      expect(tooLarge.status).toBe(500);
      expect(tooLarge.json().type).toBe('urn:idempotent-jobs:problem:internal-error');
      expect(logged.join('\n')).toMatch(/maxResultBytes/);
      expect(await ordersOf(key)).toBe(0);
      expect(await jobsOf(key)).toBe(0);
      expect(await requestKeyRow('strict', key)).toMatchObject({ status: 'processing', owner: null });
      // The same request runs again, and is refused again: nothing of it ever commits.
      expect((await post(strictApp, '/orders', { key, body: { cents: 9, headerBytes: 40_000 } })).status).toBe(500);
      expect(runs.get(key)).toBe(2);
      expect(await ordersOf(key)).toBe(0);
    } finally {
      await strictApp.close();
    }
  });

  it("a retention above the keys' bounds is refused, naming the option, the value, the bound and how to raise it; raised, it is kept as asked", async () => {
    const DAY = 86_400_000;
    expect(() => new IdempotentRequests({ keys, retention: { resultMs: 40 * DAY } })).toThrow(/retention\.resultMs.*3456000000.*maxJobRetentionMs.*2592000000.*IdempotencyKeys/s);
    expect(() => new IdempotentRequests({ keys, retention: { tombstoneMs: 400 * DAY } })).toThrow(/retention\.tombstoneMs.*34560000000.*maxJobTombstoneMs.*31536000000/s);
    const roomy = new IdempotencyKeys({ db: env.db, schema: env.schema, maxJobRetentionMs: 40 * DAY });
    const kept = new IdempotentRequests({ keys: roomy, namespace: 'kept', retention: { resultMs: 40 * DAY } });
    const key = randomUUID();
    const answer = await kept.handle({ method: 'POST', target: '/orders', idempotencyKey: key, body: { cents: 1 }, client: 'acme' }, async (ctx) =>
      ctx.transaction(async () => ({ status: 201 })),
    );
    expect(answer.outcome).toBe('created');
    const { rows } = await sql<{ days: number }>`select (extract(epoch from expires_at - now()) / 86400)::float8 as days from ${sql.id(env.schema, 'idempotency_keys')} where key = ${key}`.execute(env.db);
    expect(rows[0]!.days).toBeGreaterThan(39.9);
  });

  it('methods other than POST and PATCH run without a key', async () => {
    const response = await fetch(`${app.url}/orders/abc`);
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({ id: 'abc' });
  });

  it('an expired response leaves a tombstone: a retry is 410 request-expired until it ends, and runs nothing', async () => {
    const expiring = new IdempotentRequests({ keys, namespace: 'expiring', retention: { resultMs: 1, tombstoneMs: 3_600_000 } });
    const expiringApp = await startApp('fastify', expiring, orderHandler);
    try {
      const key = randomUUID();
      expect((await post(expiringApp, '/orders', { key, body: { cents: 3 } })).status).toBe(201);
      await new Promise((resolve) => setTimeout(resolve, 20));
      await new Janitor({ db: env.db, schema: env.schema, tombstoneMs: 0, logger: pino({ level: 'silent' }) }).runOnce();
      const retry = await post(expiringApp, '/orders', { key, body: { cents: 3 } });
      expect(retry.status).toBe(410);
      expect(retry.json().type).toBe('urn:idempotent-jobs:problem:request-expired');
      const reused = await post(expiringApp, '/orders', { key, body: { cents: 4 } });
      expect(reused.status).toBe(422);
      expect(runs.get(key)).toBe(1);
    } finally {
      await expiringApp.close();
    }
  });

  it('options: unknown names and bad values are refused, naming the option', () => {
    expect(() => new IdempotentRequests({ keys, leaseMS: 5 } as never)).toThrow(/unknown option "leaseMS"\. Did you mean "leaseMs"\?/);
    expect(() => new IdempotentRequests({ keys, namespace: 'a:b' })).toThrow(/namespace/);
    expect(() => new IdempotentRequests({ keys, leaseMs: 10 })).toThrow(/leaseMs/);
    expect(() => new IdempotentRequests({ keys, methods: ['PO ST'] })).toThrow(/methods/);
    expect(() => new IdempotentRequests({ keys, retention: { resultMs: 0 } })).toThrow(/retention.resultMs/);
    expect(() => new IdempotentRequests({} as never)).toThrow(/keys/);
  });
});
