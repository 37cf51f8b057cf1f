// @module-tag redis
import { execFile } from 'node:child_process';
import { request as httpRequest, type OutgoingHttpHeaders } from 'node:http';
import { readFileSync } from 'node:fs';
import { Writable } from 'node:stream';
import { promisify } from 'node:util';
import { Queue } from 'bullmq';
import { sql, type Kysely } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { ConfigError, IdempotencyKeys, IdempotentProducer, KeySettledListener, createHttpApi, createIdempotentWorker, jobIdFor, type HttpApi, type IdempotentWorker } from '../src/index.js';
import { isLoopbackHost } from '../src/http/http-options.js';
import { Janitor, loadHttpEnvConfig, parseTokens } from '../src/process/index.js';
import { problemType } from '../src/http/problems.js';
import { requestScopeFor } from '../src/http/job-ingestion.js';
import { createEffectsTable, createGate, effectsOf } from './support/protocol-fixtures.js';
import { httpClient, type HttpResult } from './support/http-client.js';
import { startHttpServerChild, type HttpServerChild } from './support/http-server-child.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { startTestHandlerWorker } from './support/test-handler.js';
import { systemToolForTests, withToolOnPath } from './support/system-tools.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const CURL = systemToolForTests('curl');
const ACME = 'tok_acme_0123456789abcdef';
const GLOBEX = 'tok_globex_0123456789abcdef';
const TOKENS = { [ACME]: 'acme', [GLOBEX]: 'globex' };
const QUEUES = ['payments', 'concurrent', 'e2e', 'isolation', 'steps'];
const BODY_LIMIT = 4096;
const silent = pino({ level: 'silent' });

let env: TestEnv;
let db: Kysely<any>;
let keys: IdempotencyKeys;
let listener: KeySettledListener;
let api: HttpApi;
let client: ReturnType<typeof httpClient>;
let baseUrl: string;
const logLines: Array<Record<string, unknown>> = [];
const workers: IdempotentWorker<any, any>[] = [];
const queues: Queue[] = [];
const extraApis: HttpApi[] = [];
const children: HttpServerChild[] = [];

beforeAll(async () => {
  env = await createTestEnv('http-api');
  await createEffectsTable(env.db, env.schema);
  // The server's own small pool: 100 concurrent requests queue on it.
  db = env.openDb(15);
  keys = new IdempotencyKeys({ db, schema: env.schema, claimLockTimeoutMs: 500 });
  listener = new KeySettledListener({ connectionString: env.databaseDirectUrl, schema: env.schema });
  const logStream = new Writable({
    write(chunk, _encoding, done) {
      for (const line of String(chunk).split('\n')) if (line.trim() !== '') logLines.push(JSON.parse(line));
      done();
    },
  });
  api = await createHttpApi({
    keys,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    queues: QUEUES,
    tokens: TOKENS,
    listener,
    maxWaitSeconds: 10,
    bodyLimitBytes: BODY_LIMIT,
    relayPollIntervalMs: 50,
    logger: pino({ level: 'info' }, logStream),
  });
  baseUrl = await api.listen({ host: '127.0.0.1', port: 0 });
  client = httpClient(baseUrl);
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.close({ force: true })));
  await Promise.all(extraApis.splice(0).map((a) => a.close()));
});
afterAll(async () => {
  for (const child of children) if (child.process.exitCode === null && child.process.signalCode === null) child.process.kill('SIGKILL');
  await Promise.all(children.map((child) => child.exited));
  await api?.close();
  await Promise.all(queues.map((q) => q.close()));
  await listener?.close();
  await env?.teardown();
});

function bullQueue(name: string): Queue {
  const queue = new Queue(name, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  queues.push(queue);
  return queue;
}

function startWorker(queue: string) {
  const worker = startTestHandlerWorker(env, queue);
  workers.push(worker);
  return worker;
}

async function outboxRows(jobId: string): Promise<number> {
  const { rows } = await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, 'outbox')} where job_id = ${jobId}`.execute(env.db);
  return Number(rows[0]!.n);
}

/** A POST through node:http, which (unlike fetch) can send a header line twice. */
function rawPost(path: string, headers: OutgoingHttpHeaders, body: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(new URL(path, baseUrl), { method: 'POST', headers }, (res) => {
      let text = '';
      res.on('data', (chunk) => (text += chunk));
      res.on('end', () => resolve({ status: res.statusCode!, body: text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

function expectProblem(result: HttpResult, status: number, kind: Parameters<typeof problemType>[0]) {
  expect({ status: result.status, type: result.body?.type }).toEqual({ status, type: problemType(kind) });
  expect(result.headers.get('content-type')).toMatch(/^application\/problem\+json/);
  expect(result.body.status).toBe(status);
  expect(typeof result.body.title).toBe('string');
  expect(typeof result.body.detail).toBe('string');
  expect(result.body.requestId).toBe(result.headers.get('request-id'));
}

describe('HTTP API', () => {
  it('1. every status path answers with its status and problem type, and refused requests enqueue nothing', async () => {
    const path = '/v1/queues/payments/jobs';
    const body = { orderId: 1, cents: 1999 };

    const noToken = await client.post(path, { key: 's-1', json: body });
    expectProblem(noToken, 401, 'unauthorized');
    expect(noToken.headers.get('www-authenticate')).toMatch(/^Bearer/);
    const badToken = await client.post(path, { token: 'tok_wrong_0123456789abcdef', key: 's-1', json: body });
    expectProblem(badToken, 401, 'unauthorized');
    expect(badToken.headers.get('www-authenticate')).toContain('invalid_token');

    expectProblem(await client.post('/v1/queues/nope/jobs', { token: ACME, key: 's-1', json: body }), 404, 'unknown-queue');
    expectProblem(await client.post(path, { token: ACME, json: body }), 400, 'missing-idempotency-key');
    expectProblem(await client.post(path, { token: ACME, key: '', json: body }), 400, 'invalid-idempotency-key');
    expectProblem(await client.post(path, { token: ACME, key: '""', json: body }), 400, 'invalid-idempotency-key');
    expectProblem(await client.post(path, { token: ACME, key: 'k'.repeat(256), json: body }), 400, 'invalid-idempotency-key');
    expectProblem(await client.post(path, { token: ACME, key: 's-1', rawBody: 'hello', contentType: 'text/plain' }), 415, 'unsupported-media-type');
    expectProblem(await client.post(path, { token: ACME, key: 's-1' }), 415, 'unsupported-media-type');
    expectProblem(await client.post(path, { token: ACME, key: 's-1', json: { blob: 'x'.repeat(BODY_LIMIT) } }), 413, 'payload-too-large');
    expectProblem(await client.post(path, { token: ACME, key: 's-1', rawBody: '{"orderId": ' }), 400, 'invalid-request');
    expectProblem(await client.post(`${path}?name=bad%20name`, { token: ACME, key: 's-1', json: body }), 400, 'invalid-request');
    expectProblem(await client.post(path, { token: ACME, key: 's-1', json: { note: 'nul \u0000 here' } }), 400, 'invalid-request');
    // A repeated Idempotency-Key header is refused rather than joined into "a, b".
    const twice = await rawPost(path, { authorization: `Bearer ${ACME}`, 'content-type': 'application/json', 'idempotency-key': ['s-1', 's-2'] }, JSON.stringify(body));
    expect({ status: twice.status, type: JSON.parse(twice.body).type }).toEqual({ status: 400, type: problemType('invalid-idempotency-key') });
    expect(await outboxRows(jobIdFor('acme', 's-1'))).toBe(0);

    // 202: accepted, with the job id, its state and a link to the GET.
    const first = await client.post(`${path}?name=charge`, { token: ACME, key: 's-1', json: body });
    expect(first.status).toBe(202);
    expect(first.headers.get('idempotent-replayed')).toBeNull();
    expect(first.body).toMatchObject({ queue: 'payments', key: 's-1', name: 'charge', jobId: jobIdFor('acme', 's-1'), attempts: 0 });
    expect(['queued', 'processing']).toContain(first.body.state);
    expect(first.headers.get('location')).toBe('/v1/queues/payments/jobs/s-1');
    expect(first.body.links.self).toBe('/v1/queues/payments/jobs/s-1');

    // The same request again: the same answer, marked as a replay; still one job.
    const again = await client.post(`${path}?name=charge`, { token: ACME, key: 's-1', json: { cents: 1999, orderId: 1 } });
    expect(again.status).toBe(202);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(again.body).toMatchObject({ jobId: first.body.jobId, acceptedAt: first.body.acceptedAt });

    // The same key with a different body, or another job name, or another queue: 422.
    expectProblem(await client.post(`${path}?name=charge`, { token: ACME, key: 's-1', json: { orderId: 1, cents: 2000 } }), 422, 'idempotency-key-reused');
    expectProblem(await client.post(`${path}?name=refund`, { token: ACME, key: 's-1', json: body }), 422, 'idempotency-key-reused');
    expectProblem(await client.post('/v1/queues/e2e/jobs?name=charge', { token: ACME, key: 's-1', json: body }), 422, 'idempotency-key-reused');
    expect(await outboxRows(jobIdFor('acme', 's-1'))).toBe(1);

    // A bare key of 255 characters is fine; so is a quoted Structured Field string.
    expect((await client.post(path, { token: ACME, key: 'k'.repeat(255), json: body })).status).toBe(202);
    const quoted = await client.post(path, { token: ACME, key: '"s-quoted"', json: body });
    expect(quoted.status).toBe(202);
    expect(quoted.body.key).toBe('s-quoted');

    // Keys may hold any characters: the Location and the GET path are percent-encoded.
    const odd = await client.post(path, { token: ACME, key: 'a/b c?d', json: body });
    expect(odd.headers.get('location')).toBe('/v1/queues/payments/jobs/a%2Fb%20c%3Fd');
    expect((await client.get(odd.headers.get('location')!, { token: ACME })).body).toMatchObject({ key: 'a/b c?d', jobId: jobIdFor('acme', 'a/b c?d') });

    // GET: the state of a known key; 404 for an unknown one; 400 for a bad one.
    const read = await client.get('/v1/queues/payments/jobs/s-1', { token: ACME });
    expect(read.status).toBe(200);
    expect(read.body).toMatchObject({ key: 's-1', jobId: first.body.jobId, name: 'charge' });
    expect(read.headers.get('idempotent-replayed')).toBeNull();
    expectProblem(await client.get('/v1/queues/payments/jobs/never-sent', { token: ACME }), 404, 'not-found');
    expectProblem(await client.get('/v1/queues/e2e/jobs/s-1', { token: ACME }), 404, 'not-found');
    expectProblem(await client.get(`/v1/queues/payments/jobs/${'k'.repeat(256)}`, { token: ACME }), 400, 'invalid-idempotency-key');
    expectProblem(await client.get('/v1/queues/nope/jobs/s-1', { token: ACME }), 404, 'unknown-queue');
    expectProblem(await client.get('/v1/queues/payments/jobs/s-1'), 401, 'unauthorized');
    expectProblem(await client.get('/v2/nothing', { token: ACME }), 404, 'not-found');

    // 409: while another request holds the key (its transaction still open), a retry is told
    // to come back later, and enqueues nothing.
    const gate = createGate();
    let held!: () => void;
    const holding = new Promise<void>((resolve) => (held = resolve));
    const holder = keys
      .executeOnce(requestScopeFor('acme'), 's-409', keys.fingerprint('held'), async () => {
        held();
        await gate.wait;
        throw new Error('roll back');
      })
      .catch((error: Error) => error.message);
    await holding;
    let conflict: HttpResult;
    try {
      conflict = await client.post(path, { token: ACME, key: 's-409', json: body });
    } finally {
      gate.open();
    }
    expectProblem(conflict, 409, 'request-in-progress');
    expect(conflict.headers.get('retry-after')).toBe('1');
    expect(await holder).toBe('roll back');
    expect(await outboxRows(jobIdFor('acme', 's-409'))).toBe(0);
    // The holder rolled back: the retry is the first request that counts.
    const retried = await client.post(path, { token: ACME, key: 's-409', json: body });
    expect(retried.status).toBe(202);
    expect(retried.headers.get('idempotent-replayed')).toBeNull();

    // Every response carried a request id.
    expect(conflict.headers.get('request-id')).toMatch(/.+/);
  });

  it('1l. a body that is not JSON: 400 saying so, where (line, column, byte) and what the route takes; nothing enqueued', async () => {
    const path = '/v1/queues/payments/jobs';
    const cut = await client.post(path, { token: ACME, key: 'not-json-1', rawBody: '{"orderId": ' });
    expectProblem(cut, 400, 'invalid-request');
    expect(cut.body.detail).toBe(
      'The body is not valid JSON: unexpected end of the body at line 1, column 13 (byte 12). Nothing was enqueued. ' +
        'The body is the job\'s payload: one JSON value, e.g. {"orderId": 42, "cents": 1999}, sent with Content-Type: application/json; the key goes in the Idempotency-Key header.',
    );
    const comma = await client.post(path, { token: ACME, key: 'not-json-2', rawBody: '{\n  "orderId": 42,\n}' });
    expectProblem(comma, 400, 'invalid-request');
    expect(comma.body.detail).toMatch(/^The body is not valid JSON: unexpected "\}" at line 3, column 1 \(byte 19\)\. /);
    const quotes = await client.post(path, { token: ACME, key: 'not-json-3', rawBody: "{'orderId': 42}" });
    expect(quotes.body.detail).toMatch(/^The body is not valid JSON: unexpected "'" at line 1, column 2 \(byte 1\)\. /);
    for (const key of ['not-json-1', 'not-json-2', 'not-json-3']) expectProblem(await client.get(`${path}/${key}`, { token: ACME }), 404, 'not-found');
  });

  it('1k. a request whose record expired into a tombstone: POST and GET answer 410 request-expired, enqueue nothing; another body is 422', async () => {
    const path = '/v1/queues/payments/jobs';
    const body = { orderId: 'tomb', cents: 1 };
    expect((await client.post(path, { token: ACME, key: 'tomb-1', json: body })).status).toBe(202);
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set expires_at = now() - interval '1 second'
              where scope = ${requestScopeFor('acme')} and key = 'tomb-1'`.execute(env.db);
    const janitor = new Janitor({ db: env.db, schema: env.schema, tombstoneMs: 3_600_000, logger: silent });
    expect((await janitor.runOnce()).keysDeleted).toBeGreaterThanOrEqual(1);

    const again = await client.post(path, { token: ACME, key: 'tomb-1', json: body });
    expectProblem(again, 410, 'request-expired');
    expect(again.body.detail).toContain('stays refused until');
    expectProblem(await client.get('/v1/queues/payments/jobs/tomb-1', { token: ACME }), 410, 'request-expired');
    expectProblem(await client.post(path, { token: ACME, key: 'tomb-1', json: { ...body, cents: 2 } }), 422, 'idempotency-key-reused');
    expect(await outboxRows(jobIdFor('acme', 'tomb-1'))).toBe(1);
    expect((await client.get('/metrics')).body).toMatch(/idempotent_jobs_http_idempotency_outcomes_total\{outcome="expired"\} [1-9]/);
  });

  it('1b. /healthz, /readyz, /metrics and /openapi.json', async () => {
    const health = await client.get('/healthz');
    expect(health).toMatchObject({ status: 200, body: { status: 'ok' } });
    const ready = await client.get('/readyz');
    expect(ready).toMatchObject({ status: 200, body: { status: 'ready', postgres: 'ok', redis: 'ok' } });
    const metrics = await client.get('/metrics');
    expect(metrics.status).toBe(200);
    expect(metrics.headers.get('content-type')).toMatch(/^text\/plain/);
    expect(metrics.body).toContain('idempotent_jobs_http_requests_total{');
    expect(metrics.body).toContain('idempotent_jobs_http_request_duration_seconds_bucket{');
    expect(metrics.body).toMatch(/idempotent_jobs_http_idempotency_outcomes_total\{outcome="created"\} [1-9]/);
    const openapi = await client.get('/openapi.json');
    expect(openapi.status).toBe(200);
    expect(openapi.body.openapi).toBe('3.1.0');
    expect(Object.keys(openapi.body.paths)).toEqual(expect.arrayContaining(['/v1/queues/{queue}/jobs', '/v1/queues/{queue}/jobs/{key}', '/readyz']));
    expect(openapi.body.paths['/v1/queues/{queue}/jobs'].post.responses).toHaveProperty('409');
    const jobSchema = openapi.body.paths['/v1/queues/{queue}/jobs/{key}'].get.responses['200'].content['application/json'].schema;
    expect(Object.keys(jobSchema.properties.steps.items.properties).sort()).toEqual(
      ['fence', 'name', 'position', 'recordedAt', 'result', 'resultBytes', 'startedAt', 'starts'],
    );
  });

  it('1c. /readyz answers 503 not-ready when Redis does not answer', async () => {
    const broken = await createHttpApi({
      keys,
      connection: { host: '127.0.0.1', port: 1, maxRetriesPerRequest: 1, retryStrategy: () => null } as any,
      prefix: env.redisPrefix,
      queues: ['payments'],
      tokens: TOKENS,
      relay: false,
      logger: silent,
    });
    extraApis.push(broken);
    const ready = await broken.app.inject({ method: 'GET', url: '/readyz' });
    expect(ready.statusCode).toBe(503);
    const body = JSON.parse(ready.body);
    expect(body.type).toBe(problemType('not-ready'));
    expect(body.detail).toMatch(/postgres: ok; redis: down/);
    // A POST still lands: the job is in the outbox (Postgres), reported queued.
    const accepted = await broken.app.inject({
      method: 'POST',
      url: '/v1/queues/payments/jobs',
      headers: { authorization: `Bearer ${ACME}`, 'content-type': 'application/json', 'idempotency-key': 'redis-down-1' },
      payload: '{"a":1}',
    });
    expect(accepted.statusCode).toBe(202);
    expect(JSON.parse(accepted.body).state).toBe('queued');
    expect(await outboxRows(jobIdFor('acme', 'redis-down-1'))).toBe(1);
  });

  it('1d. request id: adopted from the client, sent back, and on every log line of the request', async () => {
    logLines.length = 0;
    const result = await client.post('/v1/queues/payments/jobs', { token: ACME, key: 'rid-1', json: {}, headers: { 'request-id': 'client-req-42' } });
    expect(result.status).toBe(202);
    expect(result.headers.get('request-id')).toBe('client-req-42');
    const refused = await client.post('/v1/queues/payments/jobs', { token: ACME, json: {}, headers: { 'request-id': 'client-req-43' } });
    expect(refused.headers.get('request-id')).toBe('client-req-43');
    const generated = await client.get('/healthz');
    expect(generated.headers.get('request-id')).toMatch(/^[0-9a-f-]{36}$/);
    await waitFor('the refused request to be logged', async () => logLines.some((l) => l.reqId === 'client-req-43' && l.msg === 'request completed'));
    const ours = logLines.filter((l) => l.reqId === 'client-req-42').map((l) => l.msg);
    expect(ours).toEqual(expect.arrayContaining(['incoming request', 'job accepted', 'request completed']));
    expect(logLines.filter((l) => l.reqId === 'client-req-43').map((l) => l.msg)).toEqual(expect.arrayContaining(['request refused']));
    // Every line written while handling requests carries a request id.
    const requestLines = logLines.filter((l) => ['incoming request', 'request completed', 'job accepted', 'request refused', 'request replayed'].includes(String(l.msg)));
    expect(requestLines.length).toBeGreaterThanOrEqual(6);
    for (const line of requestLines) expect(line.reqId).toEqual(expect.any(String));
  });

  it('1e. without tokens the server refuses to listen beyond loopback, and serves loopback as tenant "default"', async () => {
    const open = await createHttpApi({ keys, connection: { url: env.redisUrl }, prefix: env.redisPrefix, queues: ['payments'], relay: false, logger: silent });
    extraApis.push(open);
    await expect(open.listen({ host: '0.0.0.0', port: 0 })).rejects.toThrow(ConfigError);
    await expect(open.listen({ host: '::', port: 0 })).rejects.toThrow(/Refusing to listen on "::" without authentication/);
    expect(open.app.server.listening).toBe(false);
    const local = httpClient(await open.listen({ host: '127.0.0.1', port: 0 }));
    const result = await local.post('/v1/queues/payments/jobs', { key: 'anon-1', json: { a: 1 } });
    expect(result.status).toBe(202);
    expect(result.body.jobId).toBe(jobIdFor('default', 'anon-1'));
  });

  it('1f. graceful shutdown: a request in flight when close() starts still gets its answer', async () => {
    const slowKeys = new IdempotencyKeys({ db, schema: env.schema, claimLockTimeoutMs: 20_000 });
    const closing = await createHttpApi({
      keys: slowKeys,
      connection: { url: env.redisUrl },
      prefix: env.redisPrefix,
      queues: ['payments'],
      tokens: TOKENS,
      relay: false,
      logger: silent,
    });
    const local = httpClient(await closing.listen({ port: 0 }));
    // Hold the request's key so the POST blocks inside the server.
    const gate = createGate();
    let held!: () => void;
    const holding = new Promise<void>((resolve) => (held = resolve));
    let holderPid = 0;
    const holder = keys
      .executeOnce(requestScopeFor('acme'), 'shutdown-1', keys.fingerprint('held'), async (tx) => {
        holderPid = (await sql<{ pid: number }>`select pg_backend_pid() as pid`.execute(tx)).rows[0]!.pid;
        held();
        await gate.wait;
        throw new Error('roll back');
      })
      .catch(() => undefined);
    await holding;
    const inFlight = local.post('/v1/queues/payments/jobs', { token: ACME, key: 'shutdown-1', json: { a: 1 } });
    // Released at the end whatever happens, so a failure cannot leave the key locked.
    onTestFinished(() => gate.open());
    // Blocked by the holder itself: a lock wait left by another test would not do.
    await waitFor('the POST to wait on the held key', async () => {
      const { rows } = await sql<{ n: string }>`select count(*) as n from pg_stat_activity
        where wait_event_type = 'Lock' and ${holderPid}::int = any(pg_blocking_pids(pid))`.execute(env.db);
      return Number(rows[0]!.n) > 0;
    });
    const closed = closing.close();
    let closeDone = false;
    void closed.then(() => (closeDone = true));
    // New connections are refused while the in-flight request is still running.
    await waitFor('the listener to stop', async () => !closing.app.server.listening);
    expect(closeDone).toBe(false);
    gate.open();
    await holder;
    const answer = await inFlight;
    expect(answer.status).toBe(202);
    expect(answer.body.key).toBe('shutdown-1');
    expect(answer.headers.get('connection')).toBe('close');
    await closed;
  });

  it('1g. graceful shutdown answers a pending Prefer: wait at once (202, still queued) instead of holding the close', { timeout: 20_000 }, async () => {
    const lines: Array<Record<string, unknown>> = [];
    const stream = new Writable({
      write(chunk, _encoding, done) {
        for (const line of String(chunk).split('\n')) if (line.trim() !== '') lines.push(JSON.parse(line));
        done();
      },
    });
    const waiting = await createHttpApi({
      keys,
      connection: { url: env.redisUrl },
      prefix: env.redisPrefix,
      queues: ['payments'],
      tokens: TOKENS,
      listener,
      maxWaitSeconds: 50,
      relay: false,
      logger: pino({ level: 'info' }, stream),
    });
    const local = httpClient(await waiting.listen({ port: 0 }));
    // No worker runs: without the close, this would wait 50 s (past this test's timeout).
    const pending = local.post('/v1/queues/payments/jobs', { token: ACME, key: 'wait-close-1', json: {}, headers: { prefer: 'wait=50' } });
    await waitFor('the request to be accepted and waiting', async () => lines.some((l) => l.msg === 'job accepted'));
    await waiting.close();
    const answer = await pending;
    expect(answer.status).toBe(202);
    expect(answer.headers.get('preference-applied')).toBe('wait=50');
    expect(answer.body.state).toBe('queued');
  });

  it('1i. a client that hangs up during Prefer: wait ends the wait at once', { timeout: 20_000 }, async () => {
    const timedOut = async () => {
      const text = (await client.get('/metrics')).body as string;
      return Number(/idempotent_jobs_http_prefer_waits_total\{outcome="timed_out"\} (\d+)/.exec(text)?.[1] ?? 0);
    };
    const before = await timedOut();
    const hangUp = new AbortController();
    const request = fetch(`${baseUrl}/v1/queues/payments/jobs`, {
      method: 'POST',
      signal: hangUp.signal,
      headers: { authorization: `Bearer ${ACME}`, 'idempotency-key': 'hang-up-1', 'content-type': 'application/json', prefer: 'wait=10' },
      body: '{}',
    }).catch((error: Error) => error.name);
    await waitFor('the request to be accepted', async () => logLines.some((l) => l.msg === 'job accepted' && l.key === 'hang-up-1'));
    hangUp.abort();
    expect(await request).toBe('AbortError');
    // Without the hang-up the wait would end only after 10 s (past this test's timeout).
    await waitFor('the wait to end', async () => (await timedOut()) === before + 1, 8_000);
  });

  it('1j. two real requests racing on one key: the second, arriving while the first is still being handled, gets 409 and enqueues nothing', async () => {
    const path = '/v1/queues/payments/jobs';
    // Stall the first request inside its transaction (after it claimed the key, at its outbox
    // insert) by holding a lock on the outbox table.
    const gate = createGate();
    let locked!: () => void;
    const isLocked = new Promise<void>((resolve) => (locked = resolve));
    const lockHolder = env.db.transaction().execute(async (tx) => {
      await sql`lock table ${sql.id(env.schema, 'outbox')} in exclusive mode`.execute(tx);
      locked();
      await gate.wait;
    });
    await isLocked;
    let second: HttpResult;
    let first: Promise<HttpResult>;
    try {
      first = client.post(path, { token: ACME, key: 'race-1', json: { n: 1 } });
      await waitFor('the first request to stall at its outbox insert', async () => {
        const { rows } = await sql<{ n: string }>`select count(*) as n from pg_stat_activity
          where wait_event_type = 'Lock' and application_name = 'test:http-api' and query ilike '%insert into%outbox%'`.execute(env.db);
        return Number(rows[0]!.n) > 0;
      });
      second = await client.post(path, { token: ACME, key: 'race-1', json: { n: 1 } });
    } finally {
      gate.open();
      await lockHolder;
    }
    expectProblem(second, 409, 'request-in-progress');
    expect(Number(second.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    const firstAnswer = await first;
    expect(firstAnswer.status).toBe(202);
    expect(firstAnswer.headers.get('idempotent-replayed')).toBeNull();
    const third = await client.post(path, { token: ACME, key: 'race-1', json: { n: 1 } });
    expect(third.headers.get('idempotent-replayed')).toBe('true');
    expect(third.body.jobId).toBe(firstAnswer.body.jobId);
    expect(await outboxRows(jobIdFor('acme', 'race-1'))).toBe(1);
  });

  it('1h. configuration: the runnable refuses an open bind without tokens, and bad tokens are named by position only', () => {
    expect(() => loadHttpEnvConfig({ HTTP_HOST: '0.0.0.0' })).toThrow(/Refusing to listen on "0.0.0.0" without authentication/);
    expect(loadHttpEnvConfig({ HTTP_HOST: '0.0.0.0', HTTP_TOKENS: `${ACME}=acme` }).HTTP_TOKENS.get(ACME)).toBe('acme');
    expect(loadHttpEnvConfig({ QUEUE: 'mail' }).HTTP_QUEUES).toEqual(['mail']);
    expect(loadHttpEnvConfig({ HTTP_QUEUES: 'a, b' }).HTTP_QUEUES).toEqual(['a', 'b']);
    expect(() => loadHttpEnvConfig({ HTTP_QUEUES: 'a b' })).toThrow(/HTTP_QUEUES: "a b" is not a valid queue name/);
    expect(() => loadHttpEnvConfig({ HTTP_PORT: '70000' })).toThrow(/HTTP_PORT/);
    expect(() => parseTokens('short=acme')).toThrow(/entry 1: a token must be at least 16/);
    expect(() => parseTokens(`${ACME}=acme,${GLOBEX}=glo:bex`)).toThrow(/entry 2: tenant "glo:bex"/);
    expect(() => parseTokens(`${ACME}=acme,${ACME}=other`)).toThrow(/entry 2: the same token appears twice/);
    expect(() => parseTokens('no-equals-sign-here-at-all')).toThrow(ConfigError);
    try {
      parseTokens('tok_secret_but_bad_0123=a:b');
    } catch (error) {
      expect((error as Error).message).not.toContain('tok_secret_but_bad_0123');
    }
    expect(isLoopbackHost('127.0.0.1') && isLoopbackHost('::1') && isLoopbackHost('localhost') && isLoopbackHost('127.1.2.3')).toBe(true);
    expect(isLoopbackHost('0.0.0.0') || isLoopbackHost('::') || isLoopbackHost('10.0.0.1')).toBe(false);
  });

  it('2. 100 concurrent POSTs with one key and one body: one job, one effect; the rest replays or 409s, no 5xx', async () => {
    const key = 'concurrent-1';
    const body = { value: 'charged-once', cents: 500 };
    const results = await Promise.all(
      Array.from({ length: 100 }, () => client.post('/v1/queues/concurrent/jobs?name=charge', { token: ACME, key, json: body })),
    );
    const statuses = results.map((r) => r.status);
    expect(statuses.filter((s) => s >= 500)).toEqual([]);
    const created = results.filter((r) => r.status === 202 && r.headers.get('idempotent-replayed') === null);
    const replays = results.filter((r) => r.headers.get('idempotent-replayed') === 'true');
    const conflicts = results.filter((r) => r.status === 409);
    expect(created).toHaveLength(1);
    expect(created.length + replays.length + conflicts.length).toBe(100);
    for (const r of replays) {
      expect([200, 202]).toContain(r.status);
      expect(r.body.jobId).toBe(jobIdFor('acme', key));
    }
    for (const r of conflicts) {
      expect(r.body.type).toBe(problemType('request-in-progress'));
      expect(Number(r.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    }
    console.log(`100 concurrent POSTs, one key: created=1, replays=${replays.length}, 409s=${conflicts.length}`);
    expect(await outboxRows(jobIdFor('acme', key))).toBe(1);

    startWorker('concurrent');
    const queue = bullQueue('concurrent');
    await waitForJobState(queue, jobIdFor('acme', key), ['completed']);
    const counts = await queue.getJobCounts('waiting', 'active', 'delayed', 'completed', 'failed', 'prioritized');
    expect(Object.values(counts).reduce((a, b) => a + b, 0)).toBe(1);
    expect(await effectsOf(env.db, env.schema, 'acme', key)).toHaveLength(1);
    const after = await client.post('/v1/queues/concurrent/jobs?name=charge', { token: ACME, key, json: body });
    expect(after.status).toBe(200);
    expect(after.headers.get('idempotent-replayed')).toBe('true');
    expect(after.body).toMatchObject({ state: 'completed', result: { value: 'charged-once' } });
  });

  it("3. tenant isolation: tenant B's GET and POST of tenant A's key see nothing of A's", async () => {
    const key = 'shared-key';
    const path = '/v1/queues/isolation/jobs';
    const a = await client.post(path, { token: ACME, key, json: { owner: 'acme', secret: 'a-only' } });
    expect(a.status).toBe(202);

    const bGet = await client.get(`${path}/${key}`, { token: GLOBEX });
    expectProblem(bGet, 404, 'not-found');
    expect(JSON.stringify(bGet.body)).not.toContain('a-only');

    // B posting A's key with another body is B's own first request, not a 422 and not a replay of A's.
    const b = await client.post(path, { token: GLOBEX, key, json: { owner: 'globex' } });
    expect(b.status).toBe(202);
    expect(b.headers.get('idempotent-replayed')).toBeNull();
    expect(b.body.jobId).toBe(jobIdFor('globex', key));
    expect(b.body.jobId).not.toBe(a.body.jobId);
    // B posting A's exact body is also B's own request.
    const b2 = await client.post(path, { token: GLOBEX, key: 'other-key', json: { owner: 'acme', secret: 'a-only' } });
    expect(b2.body.jobId).toBe(jobIdFor('globex', 'other-key'));

    // Each tenant sees only its own job under the key; A's replay is still A's job.
    expect((await client.get(`${path}/${key}`, { token: GLOBEX })).body.jobId).toBe(b.body.jobId);
    expect((await client.get(`${path}/${key}`, { token: ACME })).body.jobId).toBe(a.body.jobId);
    const aAgain = await client.post(path, { token: ACME, key, json: { owner: 'acme', secret: 'a-only' } });
    expect(aAgain.headers.get('idempotent-replayed')).toBe('true');
    expect(aAgain.body.jobId).toBe(a.body.jobId);

    // A worker runs both: each tenant reads its own result.
    startWorker('isolation');
    const queue = bullQueue('isolation');
    await waitForJobState(queue, a.body.jobId, ['completed']);
    await waitForJobState(queue, b.body.jobId, ['completed']);
    expect(await effectsOf(env.db, env.schema, 'acme', key)).toHaveLength(1);
    expect(await effectsOf(env.db, env.schema, 'globex', key)).toHaveLength(1);
    const bDone = await client.get(`${path}/${key}`, { token: GLOBEX });
    expect(bDone.body).toMatchObject({ state: 'completed', jobId: b.body.jobId });
    expect(JSON.stringify(bDone.body)).not.toContain('a-only');
  });

  it('4d. a POST shares the (scope, key) namespace with library producers, and the docs and the OpenAPI description say so', async () => {
    startWorker('e2e');
    const producer = new IdempotentProducer({ queue: 'e2e', connection: { url: env.redisUrl }, prefix: env.redisPrefix });
    try {
      const { jobId } = await producer.enqueue({ name: 'charge', scope: 'acme', key: 'shared-1', data: { value: 'from-the-library' } });
      await waitForJobState(producer.queue, jobId, ['completed']);
    } finally {
      await producer.close();
    }
    // Tenant acme's Idempotency-Key shared-1 names the library producer's job: answered from it, nothing runs again.
    const post = await client.post('/v1/queues/e2e/jobs?name=charge', { token: ACME, key: 'shared-1', json: { value: 'from-the-library' }, headers: { prefer: 'wait=5' } });
    expect(post.status).toBe(200);
    expect(post.body).toMatchObject({ state: 'completed', result: { value: 'from-the-library', worker: 'in-process' } });
    expect(await effectsOf(env.db, env.schema, 'acme', 'shared-1')).toHaveLength(1);
    // Said where a user of the API looks: the description of Idempotency-Key, and docs/http-api.md.
    const openapi = await client.get('/openapi.json');
    const header = openapi.body.paths['/v1/queues/{queue}/jobs'].post.parameters.find((p: { in: string; name: string }) => p.in === 'header' && p.name === 'idempotency-key');
    expect(header.description).toMatch(/shared with library producers/);
    expect(readFileSync(new URL('../docs/http-api.md', import.meta.url), 'utf8')).toMatch(/\*\*The \(scope, key\) namespace is shared with library producers\.\*\*/);
  });

  it('4. end to end: POST with Prefer: wait=5 while a worker runs → 200 with its result; the same POST again → the replay', async () => {
    startWorker('e2e');
    const path = '/v1/queues/e2e/jobs?name=charge';
    const body = { sleepMs: 200, value: 'charged' };
    const first = await client.post(path, { token: ACME, key: 'e2e-1', json: body, headers: { prefer: 'wait=5' } });
    expect(first.status).toBe(200);
    expect(first.headers.get('preference-applied')).toBe('wait=5');
    expect(first.headers.get('idempotent-replayed')).toBeNull();
    expect(first.body).toMatchObject({ state: 'completed', result: { value: 'charged', fence: 1, worker: 'in-process' }, attempts: 1 });
    expect(first.body.startedAt).toEqual(expect.any(String));
    expect(first.body.finishedAt).toEqual(expect.any(String));

    const again = await client.post(path, { token: ACME, key: 'e2e-1', json: body, headers: { prefer: 'respond-async, wait=5' } });
    expect(again.status).toBe(200);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(again.body).toEqual(first.body);
    expect(await effectsOf(env.db, env.schema, 'acme', 'e2e-1')).toHaveLength(1);

    // The wait is capped by configuration (maxWaitSeconds: 10).
    const capped = await client.post(path, { token: ACME, key: 'e2e-1', json: body, headers: { prefer: 'wait=999' } });
    expect(capped.headers.get('preference-applied')).toBe('wait=10');

    // A job that fails for good: 200 with the stored failure, then replayed as such.
    const failing = { permanent: true };
    const failed = await client.post(path, { token: ACME, key: 'e2e-2', json: failing, headers: { prefer: 'wait=5' } });
    expect(failed.status).toBe(200);
    expect(failed.body).toMatchObject({ state: 'failed', error: { message: 'account closed (permanent)' } });
    const failedAgain = await client.post(path, { token: ACME, key: 'e2e-2', json: failing });
    expect(failedAgain.status).toBe(200);
    expect(failedAgain.headers.get('idempotent-replayed')).toBe('true');
    expect(failedAgain.body.state).toBe('failed');
  });

  it('4c. a multi-step job lists its steps, started and recorded, with fence, starts, result and result size; a job without steps lists none', async () => {
    const reached = createGate();
    const gate = createGate();
    const worker = createIdempotentWorker<{ amount: number }>({
      queue: 'steps',
      connection: { url: env.redisUrl },
      prefix: env.redisPrefix,
      keys: new IdempotencyKeys({ db: env.db, schema: env.schema }),
      concurrency: 1,
      logger: silent,
      handler: async (ctx) => {
        const hold = await ctx.step('reserve', { transaction: async () => ({ items: ctx.data.amount }) });
        const charge = await ctx.step('charge', async (step) => {
          reached.open();
          await gate.wait;
          return { chargeId: step.stepKey };
        });
        return ctx.transaction(async () => ({ hold, charge }));
      },
    });
    workers.push(worker);
    const path = '/v1/queues/steps/jobs';
    const accepted = await client.post(`${path}?name=order`, { token: ACME, key: 'steps-1', json: { amount: 2 } });
    expect(accepted.status).toBe(202);
    expect(accepted.body.steps).toEqual([]);

    // Held inside the charge: reserve recorded, charge started and not recorded.
    await reached.wait;
    const inFlight = await client.get(`${path}/steps-1`, { token: ACME });
    expect(inFlight.status).toBe(200);
    expect(inFlight.body).toMatchObject({ state: 'processing', attempts: 1 });
    expect(inFlight.body.steps).toEqual([
      { name: 'reserve', position: 1, starts: 1, fence: 1, startedAt: expect.any(String), recordedAt: expect.any(String), result: { items: 2 }, resultBytes: 11 },
      { name: 'charge', position: 2, starts: 1, fence: 1, startedAt: expect.any(String), recordedAt: null, result: null, resultBytes: null },
    ]);
    // Another tenant sees nothing of them.
    expectProblem(await client.get(`${path}/steps-1`, { token: GLOBEX }), 404, 'not-found');

    gate.open();
    const done = await client.get(`${path}/steps-1`, { token: ACME, headers: { prefer: 'wait=5' } });
    expect(done.body.state).toBe('completed');
    const charge = { chargeId: done.body.result.charge.chargeId };
    expect(done.body.result).toEqual({ hold: { items: 2 }, charge });
    expect(done.body.steps.map((step: any) => [step.name, step.recordedAt !== null, step.result, step.resultBytes])).toEqual([
      ['reserve', true, { items: 2 }, 11],
      ['charge', true, charge, Buffer.byteLength(JSON.stringify(charge))],
    ]);
    // The POST's replay carries the same representation.
    const replay = await client.post(`${path}?name=order`, { token: ACME, key: 'steps-1', json: { amount: 2 } });
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.body).toEqual(done.body);

    // A job without steps (the e2e queue's handler) lists none.
    const plain = await client.get('/v1/queues/e2e/jobs/e2e-1', { token: ACME });
    expect(plain.body).toMatchObject({ state: 'completed', steps: [] });
  });

  it('4b. Prefer: wait=1 with no worker running: 202 after the wait, still queued', async () => {
    const result = await client.post('/v1/queues/payments/jobs', { token: ACME, key: 'no-worker-1', json: {}, headers: { prefer: 'wait=1' } });
    expect(result.status).toBe(202);
    expect(result.headers.get('preference-applied')).toBe('wait=1');
    expect(result.body.state).toBe('queued');
    // The GET long-polls the same way.
    const read = await client.get('/v1/queues/payments/jobs/no-worker-1', { token: ACME, headers: { prefer: 'wait=1' } });
    expect(read.status).toBe(200);
    expect(read.headers.get('preference-applied')).toBe('wait=1');
    expect(read.body.state).toBe('queued');
  });

  it.skipIf(CURL === undefined)('5. the curl examples of docs/http-api.md get the statuses they name, against the runnable server with a worker running', async () => {
    const examples = documentedCurlExamples(readFileSync(new URL('../docs/http-api.md', import.meta.url), 'utf8'));
    expect(examples.map((e) => e.status)).toEqual([202, 200, 200, 422, 400, 400, 401, 404, 404, 413, 415]);
    const server = await startHttpServerChild({
      DATABASE_URL: env.databaseUrl,
      DATABASE_DIRECT_URL: env.databaseDirectUrl,
      REDIS_URL: env.redisUrl,
      SCHEMA: env.schema,
      REDIS_PREFIX: env.redisPrefix,
      MIGRATE: 'false',
      PG_POOL_SIZE: '4',
      HTTP_PORT: '0',
      HTTP_QUEUES: 'payments',
      HTTP_TOKENS: `${ACME}=acme`,
    });
    children.push(server);
    for (const [index, example] of examples.entries()) {
      // The worker starts after the first example: a job it finished before the POST's answer
      // was read would make that answer 200 (completed) instead of the 202 the example shows.
      if (index === 1) startWorker('payments');
      const { stdout } = await promisify(execFile)('bash', ['-c', example.command], {
        env: { ...withToolOnPath(CURL!), API: server.url, TOKEN: ACME },
        maxBuffer: 16 * 1024 * 1024,
      });
      const statuses = [...stdout.matchAll(/^HTTP\/[\d.]+ (\d{3})/gm)].map((m) => Number(m[1]));
      // An oversized upload is refused before it is invited: no "100 Continue", so curl never
      // sends the body and cannot be cut off mid-upload.
      if (example.status === 413) expect(statuses).toEqual([413]);
      expect({ example: example.comment, status: statuses.at(-1) }).toEqual({ example: example.comment, status: example.status });
      expect(stdout).toMatch(/^request-id: .+/im);
      if (example.problem) expect(stdout).toContain(`"type":"${problemType(example.problem as Parameters<typeof problemType>[0])}"`);
      if (example.comment.includes('Idempotent-Replayed: true')) expect(stdout).toMatch(/^idempotent-replayed: true/im);
    }
    // The replayed and the read job: completed by the worker, with its result.
    const read = await httpClient(server.url).get('/v1/queues/payments/jobs/order-42', { token: ACME });
    expect(read.body).toMatchObject({ state: 'completed', result: { worker: 'in-process' } });
    expect(await effectsOf(env.db, env.schema, 'acme', 'order-42')).toHaveLength(1);
    // SIGTERM: graceful shutdown, exit 0.
    server.process.kill('SIGTERM');
    expect(await server.exited).toBe(0);
  });
});

/** The annotated examples of docs/http-api.md's "Examples" section: `# → NNN [problem-kind]…` then the command. */
function documentedCurlExamples(doc: string) {
  const section = doc.split(/^## Examples$/m)[1]!.split(/^## /m)[0]!;
  const blocks = [...section.matchAll(/^```sh\n([\s\S]*?)^```$/gm)].map((m) => m[1]!);
  const examples: Array<{ status: number; problem?: string; comment: string; command: string }> = [];
  for (const block of blocks) {
    for (const chunk of block.split(/\n\s*\n/)) {
      const lines = chunk.split('\n').filter((l) => l.trim() !== '');
      const head = /^# → (\d{3})(?: ([a-z][a-z-]+))?/.exec(lines[0] ?? '');
      if (!head) continue;
      const comment = lines.filter((l) => l.startsWith('#')).join(' ');
      const command = lines.filter((l) => !l.startsWith('#')).join('\n');
      examples.push({ status: Number(head[1]), problem: head[2], comment, command });
    }
  }
  return examples;
}
