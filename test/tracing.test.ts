// @module-tag redis
/**
 * Traces (OpenTelemetry, an in-memory exporter): the span tree of a job from POST to
 * completion, of a replay, of a deferral and of a takeover after a kill, and how keys show.
 */
import { randomUUID } from 'node:crypto';
import { SpanStatusCode } from '@opentelemetry/api';
import type { ReadableSpan } from '@opentelemetry/sdk-trace';
import { Queue } from 'bullmq';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, createHttpApi, createIdempotentWorker, jobIdFor, type HttpApi, type IdempotentWorker, type IdempotentWorkerOptions } from '../src/index.js';
import { ANONYMOUS_TENANT } from '../src/http/http-options.js';
import { traceKeyHash, configureTracing } from '../src/telemetry/trace-attributes.js';
import { createEffectsTable, createGate, effectsOf, expireLease } from './support/protocol-fixtures.js';
import { waitFor } from './support/queue-helpers.js';
import { SpanTree, foreignTraceparent, startInMemoryTracing, type InMemoryTracing } from './support/span-tree.js';
import { testHandler, type TestPayload } from './support/test-handler.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';
import { startWorkerChild, stopChildren, type WorkerChild } from './support/worker-child.js';

const QUEUE = 'payments';
const TAKEOVER_QUEUE = 'takeover';
const silent = pino({ level: 'silent' });
let env: TestEnv;
let keys: IdempotencyKeys;
let tracing: InMemoryTracing;
let api: HttpApi;
const queues: Queue[] = [];
const workers: IdempotentWorker<any, any>[] = [];
const children: WorkerChild[] = [];

beforeAll(async () => {
  tracing = startInMemoryTracing();
  env = await createTestEnv('tracing');
  await createEffectsTable(env.db, env.schema);
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
  api = await createHttpApi({ keys, connection: { url: env.redisUrl }, prefix: env.redisPrefix, queues: [QUEUE], relayPollIntervalMs: 50, logger: silent });
});
afterEach(async () => {
  configureTracing({ recordKeys: false });
  await stopChildren(children.splice(0));
  await Promise.all(workers.splice(0).map((worker) => worker.close({ force: true })));
});
afterAll(async () => {
  await api?.close();
  await Promise.all(queues.map((queue) => queue.close()));
  await env?.teardown();
  await tracing?.stop();
});

function startWorker(queue: string, options: Partial<IdempotentWorkerOptions<TestPayload>> = {}): IdempotentWorker<TestPayload> {
  const worker = createIdempotentWorker<TestPayload>({
    queue,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    keys: options.keys ?? keys,
    handler: testHandler(env.schema, 'in-process'),
    concurrency: 4,
    logger: silent,
    ...options,
  });
  workers.push(worker);
  return worker;
}

function openQueue(name: string): Queue {
  const queue = new Queue(name, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  queues.push(queue);
  return queue;
}

/** A foreign producer's job: raw BullMQ under the wire contract, its own job id, a `traceparent` in its data. */
function foreignAdd(queue: Queue, key: string, payload: TestPayload, traceparent: string) {
  return queue.add('charge', { idempotencyKey: key, scope: ANONYMOUS_TENANT, payload, traceparent }, { jobId: `raw-${randomUUID()}` });
}

/** Waits until the trace holds a finished `process <queue>` span with `outcome`, and returns the trace. */
async function traceWithOutcome(traceId: string, queue: string, outcome: string, timeoutMs = 20_000): Promise<SpanTree> {
  return waitFor(
    `a "process ${queue}" span with outcome ${outcome} in trace ${traceId}`,
    async () => {
      const tree = SpanTree.of(tracing.exporter, traceId);
      return tree.named(`process ${queue}`).some((span) => span.attributes['idempotent_jobs.outcome'] === outcome) && tree;
    },
    timeoutMs,
  );
}

const parentId = (span: ReadableSpan) => span.parentSpanContext?.spanId;
const eventNames = (span: ReadableSpan) => span.events.map((event) => event.name);

describe('traces', () => {
  it('a job from POST to completion is one trace, joined to the caller’s traceparent', async () => {
    startWorker(QUEUE);
    const caller = foreignTraceparent();
    const response = await api.app.inject({
      method: 'POST',
      url: `/v1/queues/${QUEUE}/jobs?name=charge`,
      headers: { 'content-type': 'application/json', 'idempotency-key': 'order-1', traceparent: caller.traceparent },
      payload: { value: 1 },
    });
    // The worker runs meanwhile: 202, or 200 when the job finished before the answer read its state.
    expect([200, 202]).toContain(response.statusCode);
    expect(response.headers['idempotent-replayed']).toBeUndefined();
    const tree = await traceWithOutcome(caller.traceId, QUEUE, 'completed');

    // HTTP request → request record and outbox row (one transaction) → relay → BullMQ add →
    // worker → claim, effect transaction → commit.
    const effectCommit = tree.children(tree.one('effect transaction')).find((span) => span.name === 'commit')!;
    // By default the job's ctx.transaction shares a group's: its commit span is its wait for the group's COMMIT.
    expect(tree.one('effect transaction').attributes).toMatchObject({ 'idempotent_jobs.group_commit': true });
    expect(effectCommit.attributes).toMatchObject({ 'idempotent_jobs.group_commit': true });
    expect(tree.ancestry(effectCommit)).toEqual([
      'commit',
      'effect transaction',
      `process ${QUEUE}`,
      `send ${QUEUE}`,
      'outbox relay',
      `outbox insert ${QUEUE}`,
      'execute once',
      'POST /v1/queues/:queue/jobs',
    ]);
    const request = tree.one('POST /v1/queues/:queue/jobs');
    expect(parentId(request)).toBe(caller.spanId);
    expect(request.attributes).toMatchObject({ 'http.route': '/v1/queues/:queue/jobs', 'http.response.status_code': 202, 'idempotent_jobs.queue': QUEUE });
    // The request record's own claim, on the fast path, in the request scope.
    expect(tree.one('execute once').attributes).toMatchObject({ 'idempotent_jobs.scope': `http:${ANONYMOUS_TENANT}`, 'idempotent_jobs.outcome': 'executed' });
    expect(tree.children(tree.one('execute once')).map((span) => span.name).sort()).toEqual(['commit', `outbox insert ${QUEUE}`]);

    const process = tree.one(`process ${QUEUE}`);
    const jobId = jobIdFor(ANONYMOUS_TENANT, 'order-1');
    expect(process.attributes).toMatchObject({
      'messaging.destination.name': QUEUE,
      'messaging.message.id': jobId,
      'idempotent_jobs.outcome': 'completed',
      'idempotent_jobs.fence': 1,
      'idempotent_jobs.attempt': 1,
      'messaging.bullmq.attempt': 1,
    });
    expect(eventNames(process)).toEqual(['claimed', 'completed']);
    const claim = tree.one('claim');
    expect(parentId(claim)).toBe(process.spanContext().spanId);
    // Keys are hashed unless enabled: the hash is the key's BullMQ job id after `ij_`.
    expect(claim.attributes).toEqual({
      'idempotent_jobs.scope': ANONYMOUS_TENANT,
      'idempotent_jobs.key_hash': jobId.slice('ij_'.length),
      'idempotent_jobs.queue': QUEUE,
      'idempotent_jobs.outcome': 'claimed',
      'idempotent_jobs.fence': 1,
      'idempotent_jobs.attempt': 1,
    });
    for (const span of tree.spans) expect(JSON.stringify(span.attributes)).not.toContain('order-1');
    expect(tree.one(`send ${QUEUE}`).attributes['idempotent_jobs.outcome']).toBe('added');
    expect(tree.one('outbox relay').events.map((event) => event.name)).toEqual(['committed']);
  });

  it('a replay: a foreign producer’s duplicate joins its own trace and replays without an effect transaction', async () => {
    startWorker(QUEUE);
    const queue = openQueue(QUEUE);
    const first = foreignTraceparent();
    await foreignAdd(queue, 'order-2', { value: 2 }, first.traceparent);
    await traceWithOutcome(first.traceId, QUEUE, 'completed');

    const duplicate = foreignTraceparent();
    await foreignAdd(queue, 'order-2', { value: 2 }, duplicate.traceparent);
    const tree = await traceWithOutcome(duplicate.traceId, QUEUE, 'replayed');
    const process = tree.one(`process ${QUEUE}`);
    expect(parentId(process)).toBe(duplicate.spanId);
    expect(eventNames(process)).toEqual(['replayed']);
    // Spans about a key carry its scope and hash, a replay's too (it claims nothing).
    expect(process.attributes).toMatchObject({ 'idempotent_jobs.scope': ANONYMOUS_TENANT, 'idempotent_jobs.key_hash': traceKeyHash(ANONYMOUS_TENANT, 'order-2') });
    expect(tree.one('claim').attributes['idempotent_jobs.outcome']).toBe('completed');
    expect(tree.named('effect transaction')).toHaveLength(0);
    expect(await effectsOf(env.db, env.schema, ANONYMOUS_TENANT, 'order-2')).toHaveLength(1);
  });

  it('a deferral: the duplicate of a key in progress elsewhere is deferred, not failed', async () => {
    startWorker(QUEUE, { deferMinMs: 300, deferMaxMs: 300 });
    const queue = openQueue(QUEUE);
    const original = foreignTraceparent();
    await foreignAdd(queue, 'order-3', { sleepMs: 1_500, value: 3 }, original.traceparent);
    await waitFor('the original to claim', async () => (await keys.get(ANONYMOUS_TENANT, 'order-3'))?.status === 'processing');
    const duplicate = foreignTraceparent();
    await foreignAdd(queue, 'order-3', { sleepMs: 1_500, value: 3 }, duplicate.traceparent);

    const tree = await traceWithOutcome(duplicate.traceId, QUEUE, 'deferred');
    const deferred = tree.named(`process ${QUEUE}`).find((span) => span.attributes['idempotent_jobs.outcome'] === 'deferred')!;
    expect(deferred.status.code).toBe(SpanStatusCode.UNSET);
    expect(eventNames(deferred)).toEqual(['deferred']);
    const claim = tree.children(deferred).find((span) => span.name === 'claim')!;
    expect(claim.attributes['idempotent_jobs.outcome']).toBe('in-progress');
    // The deferred job runs again in the same trace and replays the original's result.
    await traceWithOutcome(duplicate.traceId, QUEUE, 'replayed');
  });

  it('a takeover after a kill: the surviving worker’s spans show the takeover, fence 2, attempt 2', async () => {
    const queue = openQueue(TAKEOVER_QUEUE);
    const timing = { LEASE_MS: '2000', STALLED_INTERVAL_MS: '1000' };
    const victim = await startWorkerChild('./test-worker.ts', {
      DATABASE_URL: env.databaseUrl,
      DATABASE_DIRECT_URL: env.databaseDirectUrl,
      REDIS_URL: env.redisUrl,
      REDIS_PREFIX: env.redisPrefix,
      SCHEMA: env.schema,
      QUEUE: TAKEOVER_QUEUE,
      MIGRATE: 'false',
      ...timing,
    });
    children.push(victim);
    const producer = foreignTraceparent();
    // The victim holds its first claim for a minute: it cannot finish before the kill.
    await foreignAdd(queue, 'order-4', { holdFirstClaimMs: 60_000, value: 4 }, producer.traceparent);
    await victim.waitForLine((line) => line.key === 'order-4' && line.msg === 'key claimed', 60_000);
    const rescuer = startWorker(TAKEOVER_QUEUE, { keys: new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 2_000 }), stalledIntervalMs: 1_000 });
    await rescuer.waitUntilReady();
    victim.kill('SIGKILL');
    await victim.exited;

    // The victim's spans died with it; the rescuer's join the producer's trace.
    const tree = await traceWithOutcome(producer.traceId, TAKEOVER_QUEUE, 'completed', 30_000);
    const process = tree.one(`process ${TAKEOVER_QUEUE}`);
    expect(parentId(process)).toBe(producer.spanId);
    expect(eventNames(process)).toEqual(['taken-over', 'completed']);
    expect(process.attributes).toMatchObject({ 'idempotent_jobs.fence': 2, 'idempotent_jobs.attempt': 2 });
    expect(tree.one('claim').attributes).toMatchObject({ 'idempotent_jobs.outcome': 'taken-over', 'idempotent_jobs.fence': 2, 'idempotent_jobs.attempt': 2 });
    expect(tree.ancestry(tree.one('commit'))).toEqual(['commit', 'effect transaction', `process ${TAKEOVER_QUEUE}`]);
    expect(await effectsOf(env.db, env.schema, ANONYMOUS_TENANT, 'order-4')).toHaveLength(1);
  });

  it('a fenced commit: the run whose lease was taken over cannot commit; its span says so', async () => {
    const gate = createGate();
    startWorker(QUEUE, {
      handler: async (ctx) => {
        await gate.wait;
        return ctx.transaction(async () => 'late');
      },
      // The default heartbeat (a third of the 30 s lease) does not beat before the gate opens:
      // the loss is found by the fenced completion itself.
      deferMinMs: 200,
      deferMaxMs: 200,
    });
    const queue = openQueue(QUEUE);
    const producer = foreignTraceparent();
    await foreignAdd(queue, 'order-6', { value: 6 }, producer.traceparent);
    await waitFor('the worker to claim', async () => (await keys.get(ANONYMOUS_TENANT, 'order-6'))?.status === 'processing');
    await expireLease(env.db, env.schema, ANONYMOUS_TENANT, 'order-6');
    const rival = await keys.claim(ANONYMOUS_TENANT, 'order-6', keys.fingerprint({ name: 'charge', payload: { value: 6 } }));
    expect(rival.kind).toBe('taken-over');
    gate.open();

    // The fenced run defers its job (to replay the rival's outcome): events fenced, deferred.
    const tree = await waitFor('a process span with a fenced event', async () => {
      const found = SpanTree.of(tracing.exporter, producer.traceId);
      return found.named(`process ${QUEUE}`).some((span) => eventNames(span).includes('fenced')) && found;
    });
    const fenced = tree.named(`process ${QUEUE}`).find((span) => eventNames(span).includes('fenced'))!;
    expect(eventNames(fenced)).toEqual(['claimed', 'fenced', 'deferred']);
    expect(fenced.status.code).toBe(SpanStatusCode.UNSET);
    const effect = tree.children(fenced).find((span) => span.name === 'effect transaction')!;
    expect(eventNames(effect)).toContain('fenced');
    expect(effect.status.code).toBe(SpanStatusCode.ERROR);
  });

  it('keys appear on spans only when enabled', async () => {
    configureTracing({ recordKeys: true });
    startWorker(QUEUE);
    const queue = openQueue(QUEUE);
    const producer = foreignTraceparent();
    await foreignAdd(queue, 'order-5', { value: 5 }, producer.traceparent);
    const tree = await traceWithOutcome(producer.traceId, QUEUE, 'completed');
    expect(tree.one('claim').attributes).toMatchObject({ 'idempotent_jobs.key': 'order-5' });
    expect(tree.one('claim').attributes['idempotent_jobs.key_hash']).toBeUndefined();
  });
});

describe('without @opentelemetry/api', () => {
  it('the library loads and runs its traced paths untraced', async () => {
    const { execFile } = await import('node:child_process');
    const { fileURLToPath } = await import('node:url');
    const path = (file: string) => fileURLToPath(new URL(`./support/${file}`, import.meta.url));
    const stdout = await new Promise<string>((resolve, reject) =>
      execFile(process.execPath, ['--import', path('without-otel-api.mjs'), '--import', 'tsx', path('untraced-child.ts')], (error, out, err) =>
        error ? reject(new Error(`${error.message}\n${err}`)) : resolve(out),
      ),
    );
    expect(JSON.parse(stdout.trim().split('\n').at(-1)!)).toEqual({
      apiLoaded: false,
      mainEntryLoaded: true,
      jobRun: 'ran',
      claim: 'completed',
      messageSpans: true,
      handlerUnwrapped: true,
      dataUnchanged: { a: 1 },
    });
  });
});
