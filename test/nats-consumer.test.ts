// @module-tag nats
import { AckPolicy, type StoredMsg } from '@nats-io/jetstream';
import { nanos } from '@nats-io/transport-node';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { DataLayerElsewhereError, IdempotencyKeys, createPostgresDb, toWireJobData, ValidationError } from '../src/index.js';
import { pgDataLayer } from '../src/pg/index.js';
import { withAnotherDatabase } from './support/another-database.js';
import { loadEnvConfig } from '../src/process/index.js';
import {
  DEAD_LETTER_ERROR_HEADER,
  DEAD_LETTER_REASON_HEADER,
  DEAD_LETTER_SEQUENCE_HEADER,
  createIdempotentNatsConsumer,
  ensureJetStreamConsumer,
  type IdempotentNatsConsumer,
  type IdempotentNatsConsumerOptions,
  type NatsConsumerEvent,
  type NatsJobHandler,
  startNatsConsumerProcess,
} from '../src/nats/index.js';
import { createEffectsTable, createGate, effectsOf, insertEffect } from './support/protocol-fixtures.js';
import { createNatsTestEnv, type NatsTestEnv } from './support/nats-env.js';
import { PrivateNats } from './support/private-nats.js';
import { sleep, waitFor } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let nats: NatsTestEnv;
let keys: IdempotencyKeys;
const silent = pino({ level: 'silent' });
const consumers: IdempotentNatsConsumer<any, any>[] = [];
const encoder = new TextEncoder();

beforeAll(async () => {
  env = await createTestEnv('nats_consumer');
  nats = await createNatsTestEnv('nats_consumer');
  await createEffectsTable(env.db, env.schema);
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 3_000 });
});
afterEach(async () => {
  await Promise.all(consumers.splice(0).map((c) => c.close({ force: true })));
});
afterAll(async () => {
  await nats?.teardown();
  await env?.teardown();
});

/** A stream, its dead-letter stream and a durable consumer of this test's own. */
async function setUp(options: { ackWaitMs?: number; servers?: string; jsmOf?: NatsTestEnv } = {}) {
  const owner = options.jsmOf ?? nats;
  const stream = owner.name('s');
  const dead = `${stream}_dead`;
  const subject = `${stream}.orders`;
  const deadSubject = `${dead}.letters`;
  await ensureJetStreamConsumer(owner.connection, {
    stream,
    subjects: [`${stream}.>`],
    consumer: 'payments',
    ackWaitMs: options.ackWaitMs ?? 3_000,
    deadLetter: { stream: dead, subject: deadSubject },
  });
  return { stream, subject, dead, deadSubject };
}

function start<P = any>(
  stream: string,
  handler: IdempotentNatsConsumerOptions<P>['handler'],
  options: Partial<IdempotentNatsConsumerOptions<P>> = {},
): { consumer: IdempotentNatsConsumer<P>; events: NatsConsumerEvent[] } {
  const consumer = createIdempotentNatsConsumer<P>({
    servers: nats.servers,
    stream,
    consumer: 'payments',
    deadLetterSubject: `${stream}_dead.letters`,
    keys,
    handler,
    logger: silent,
    deferMinMs: 50,
    deferMaxMs: 200,
    retryDelayMs: 50,
    ...options,
  });
  const events: NatsConsumerEvent[] = [];
  consumer.on('event', (event) => events.push(event));
  consumers.push(consumer);
  return { consumer, events };
}

const effect =
  (worker = 'nats'): NatsJobHandler<{ n: number }> =>
  (ctx) =>
    ctx.transaction(async (tx) => {
      await insertEffect(tx, env.schema, { scope: ctx.scope, key: ctx.key, fence: ctx.fence, worker });
      return { n: ctx.data.n };
    });

async function publishWire(subject: string, scope: string, key: string, payload: unknown, msgID?: string) {
  return nats.js.publish(subject, encoder.encode(JSON.stringify(toWireJobData(scope, key, payload))), msgID ? { msgID } : {});
}

const kinds = (events: NatsConsumerEvent[], key?: string) => events.filter((e) => key === undefined || e.key === key).map((e) => e.kind);

async function consumerState(stream: string) {
  const info = await nats.jsm.consumers.info(stream, 'payments');
  return { pending: info.num_pending, ackPending: info.num_ack_pending, redelivered: info.num_redelivered };
}

async function settled(stream: string) {
  await waitFor('every message acknowledged or terminated', async () => {
    const state = await consumerState(stream);
    return state.pending === 0 && state.ackPending === 0;
  });
}

async function deadLetters(deadStream: string): Promise<StoredMsg[]> {
  const found: StoredMsg[] = [];
  const info = await nats.jsm.streams.info(deadStream);
  for (let seq = info.state.first_seq; seq <= info.state.last_seq && info.state.messages > 0; seq++) {
    const stored = await nats.jsm.streams.getMessage(deadStream, { seq });
    if (stored) found.push(stored);
  }
  return found;
}

describe('IdempotentNatsConsumer outcomes', () => {
  it('commits the effect once and acks; a later duplicate is acked as a replay with nothing run', async () => {
    const { stream, subject } = await setUp();
    let runs = 0;
    const { consumer, events } = start<{ n: number }>(stream, async (ctx) => {
      runs++;
      return effect()(ctx);
    });
    await consumer.waitUntilReady();
    await publishWire(subject, 'orders', 'k-1', { n: 1 });
    await waitFor('completed', async () => kinds(events, 'k-1').includes('completed'));
    await publishWire(subject, 'orders', 'k-1', { n: 1 });
    await waitFor('replayed', async () => kinds(events, 'k-1').includes('replayed'));
    await settled(stream);
    expect(runs).toBe(1);
    expect(await effectsOf(env.db, env.schema, 'orders', 'k-1')).toHaveLength(1);
    expect((await keys.get('orders', 'k-1'))?.status).toBe('completed');
  });

  it('reads the key from Nats-Msg-Id with the configured scope, and the body as the payload', async () => {
    const { stream, subject } = await setUp();
    const seen: unknown[] = [];
    const { consumer, events } = start<{ amount: number }>(
      stream,
      async (ctx) => {
        seen.push({ scope: ctx.scope, key: ctx.key, data: ctx.data, subject: ctx.message.subject });
        return null;
      },
      { keyFrom: 'nats-msg-id', scope: 'foreign' },
    );
    await consumer.waitUntilReady();
    await nats.js.publish(subject, encoder.encode(JSON.stringify({ amount: 7 })), { msgID: 'pub-7' });
    await waitFor('completed', async () => kinds(events).includes('completed'));
    expect(seen).toEqual([{ scope: 'foreign', key: 'pub-7', data: { amount: 7 }, subject }]);
    expect((await keys.get('foreign', 'pub-7'))?.status).toBe('completed');
  });

  it('naks an in-progress duplicate with a delay, runs nothing for it, and acks it as a replay once the owner commits', async () => {
    const { stream, subject } = await setUp();
    const gate = createGate();
    let runs = 0;
    const { consumer, events } = start<{ n: number }>(
      stream,
      async (ctx) => {
        runs++;
        await gate.wait;
        return effect()(ctx);
      },
      { concurrency: 2 },
    );
    await consumer.waitUntilReady();
    await publishWire(subject, 'orders', 'dup', { n: 1 });
    await waitFor('claimed', async () => kinds(events, 'dup').includes('claimed'));
    await publishWire(subject, 'orders', 'dup', { n: 1 });
    await waitFor('two deferrals', async () => kinds(events, 'dup').filter((k) => k === 'deferred').length >= 2);
    // Each deferral is a redelivery of the same message (JetStream counts it), never a failure.
    expect((await consumerState(stream)).redelivered).toBeGreaterThan(0);
    gate.open();
    await waitFor('replayed', async () => kinds(events, 'dup').includes('replayed'));
    await settled(stream);
    expect(runs).toBe(1);
    expect(kinds(events, 'dup')).not.toContain('failed');
    expect(kinds(events, 'dup')).not.toContain('dead-lettered');
    expect((await keys.get('orders', 'dup'))?.attempts).toBe(1);
  });

  it('dead-letters a poison message with a reason header, then terminates it', async () => {
    const { stream, subject, dead } = await setUp();
    const { consumer, events } = start(stream, async () => {
      throw new Error('must not run');
    });
    await consumer.waitUntilReady();
    const ack = await nats.js.publish(subject, encoder.encode('{"not": "the wire contract"'));
    await waitFor('dead-lettered', async () => kinds(events).includes('dead-lettered'));
    await settled(stream);
    const [letter, ...more] = await deadLetters(dead);
    expect(more).toHaveLength(0);
    expect(letter!.header.get(DEAD_LETTER_REASON_HEADER)).toBe('invalid-message');
    expect(letter!.header.get(DEAD_LETTER_ERROR_HEADER)).toMatch(/not UTF-8 JSON/);
    expect(letter!.header.get(DEAD_LETTER_SEQUENCE_HEADER)).toBe(String(ack.seq));
    expect(new TextDecoder().decode(letter!.data)).toBe('{"not": "the wire contract"');
    expect(kinds(events)).toEqual(['invalid', 'dead-lettered']);
  });

  it('dead-letters a key reused with another payload (reason key-reused) and keeps the first result', async () => {
    const { stream, subject, dead } = await setUp();
    const { consumer, events } = start<{ n: number }>(stream, effect());
    await consumer.waitUntilReady();
    await publishWire(subject, 'orders', 'reused', { n: 1 });
    await waitFor('completed', async () => kinds(events, 'reused').includes('completed'));
    await publishWire(subject, 'orders', 'reused', { n: 2 });
    await waitFor('dead-lettered', async () => kinds(events).includes('dead-lettered'));
    await settled(stream);
    const letters = await deadLetters(dead);
    expect(letters.map((l) => l.header.get(DEAD_LETTER_REASON_HEADER))).toEqual(['key-reused']);
    expect(await effectsOf(env.db, env.schema, 'orders', 'reused')).toHaveLength(1);
  });

  it('retries a retryable error after a delay (the key released), then completes under a second claim', async () => {
    const { stream, subject } = await setUp();
    let runs = 0;
    const { consumer, events } = start<{ n: number }>(stream, async (ctx) => {
      runs++;
      if (runs === 1) throw new Error('flaky downstream');
      return effect()(ctx);
    });
    await consumer.waitUntilReady();
    await publishWire(subject, 'orders', 'flaky', { n: 1 });
    await waitFor('completed', async () => kinds(events, 'flaky').includes('completed'));
    expect(kinds(events, 'flaky')).toEqual(['claimed', 'released', 'taken-over', 'completed']);
    expect((await keys.get('orders', 'flaky'))?.attempts).toBe(2);
  });

  it('stores a failure after maxAttempts claims, dead-letters it (reason failed), and dead-letters a later duplicate (replayed-failure)', async () => {
    const { stream, subject, dead } = await setUp();
    let runs = 0;
    const { consumer, events } = start(
      stream,
      async () => {
        runs++;
        throw new Error('always broken');
      },
      { maxAttempts: 2 },
    );
    await consumer.waitUntilReady();
    await publishWire(subject, 'orders', 'broken', { n: 1 });
    await waitFor('failed', async () => kinds(events, 'broken').includes('failed'));
    await publishWire(subject, 'orders', 'broken', { n: 1 });
    await waitFor('replayed failure dead-lettered', async () => events.filter((e) => e.kind === 'dead-lettered').length === 2);
    await settled(stream);
    expect(runs).toBe(2);
    const reasons = (await deadLetters(dead)).map((l) => l.header.get(DEAD_LETTER_REASON_HEADER));
    expect(reasons).toEqual(['failed', 'replayed-failure']);
    expect((await keys.get('orders', 'broken'))?.status).toBe('failed');
  });

  it('a database-only handler on the fast path: each failed run uses an attempt, and a poison message is stored failed and dead-lettered at maxAttempts', async () => {
    const { stream, subject, dead } = await setUp();
    const attempts: number[] = [];
    const { consumer, events } = start<{ n: number }>(
      stream,
      {
        transaction: async (tx, ctx) => {
          attempts.push(ctx.attempt);
          await insertEffect(tx, env.schema, { scope: ctx.scope, key: ctx.key, fence: ctx.fence, worker: 'poison' });
          throw new Error('poison message');
        },
      },
      { maxAttempts: 3 },
    );
    await consumer.waitUntilReady();
    await publishWire(subject, 'orders', 'poison-db', { n: 1 });
    await waitFor('dead-lettered', async () => kinds(events).includes('dead-lettered'));
    await settled(stream);
    // A group that rolled back runs its jobs again (under the same claim): count the claims.
    expect([...new Set(attempts)]).toEqual([1, 2, 3]);
    const [letter, ...more] = await deadLetters(dead);
    expect(more).toHaveLength(0);
    expect(letter!.header.get(DEAD_LETTER_REASON_HEADER)).toBe('failed');
    expect(letter!.header.get(DEAD_LETTER_ERROR_HEADER)).toContain('poison message');
    expect(await keys.get('orders', 'poison-db')).toMatchObject({ status: 'failed', attempts: 3, error: { message: 'poison message' } });
    expect(await effectsOf(env.db, env.schema, 'orders', 'poison-db')).toHaveLength(0);
  });

  it('a store fault that lasts past storeRetryWindowMs counts as an attempt: at maxAttempts the message is stored failed and dead-lettered', async () => {
    const { stream, subject, dead } = await setUp();
    const { consumer, events } = start<{ n: number }>(
      stream,
      {
        // Deterministic, but classified as transient: out_of_memory every time.
        transaction: async (tx) => {
          await sql.raw(`do $$ begin raise exception 'simulated out of memory' using errcode = '53200'; end $$`).execute(tx);
        },
      },
      { maxAttempts: 2, storeRetryMinMs: 50, storeRetryMaxMs: 100, storeRetryWindowMs: 600 },
    );
    await consumer.waitUntilReady();
    await publishWire(subject, 'orders', 'persistent-fault', { n: 1 });
    await waitFor('dead-lettered', async () => kinds(events).includes('dead-lettered'));
    await settled(stream);
    // Deferred first (how many times depends on the machine's speed within the window), then counted.
    expect(kinds(events, 'persistent-fault').filter((k) => k === 'store-unavailable').length).toBeGreaterThanOrEqual(1);
    const [letter] = await deadLetters(dead);
    expect(letter!.header.get(DEAD_LETTER_REASON_HEADER)).toBe('failed');
    expect(letter!.header.get(DEAD_LETTER_ERROR_HEADER)).toContain('simulated out of memory');
    expect(await keys.get('orders', 'persistent-fault')).toMatchObject({ status: 'failed', error: expect.objectContaining({ code: 'STORE_FAULT_PERSISTED' }) });
  });

  it('keeps JetStream from redelivering a long handler: working() at every lease heartbeat', async () => {
    const { stream, subject } = await setUp({ ackWaitMs: 1_000 });
    let runs = 0;
    const { consumer, events } = start<{ n: number }>(
      stream,
      async (ctx) => {
        runs++;
        await sleep(3_000);
        return effect()(ctx);
      },
      { leaseMs: 1_200, heartbeatMs: 300, concurrency: 2 },
    );
    await consumer.waitUntilReady();
    await publishWire(subject, 'orders', 'long', { n: 1 });
    await waitFor('completed', async () => kinds(events, 'long').includes('completed'));
    await settled(stream);
    expect(runs).toBe(1);
    // Without working(), JetStream would have redelivered after 1 s to the free slot: a deferral.
    expect(kinds(events, 'long')).not.toContain('deferred');
    expect((await consumerState(stream)).redelivered).toBe(0);
    expect(kinds(events, 'long').filter((k) => k === 'lease-extended').length).toBeGreaterThan(3);
  });

  it('naks with a delay while Postgres is unreachable, without failing or dead-lettering the message', async () => {
    const { stream, subject } = await setUp();
    // A port nothing listens on: every claim meets a refused connection.
    const deadDb = createPostgresDb({ connectionString: 'postgres://postgres@127.0.0.1:1/postgres', maxConnections: 1 }, () => {});
    try {
      const downKeys = new IdempotencyKeys({ db: deadDb, schema: env.schema, leaseMs: 3_000 });
      const { consumer, events } = start(stream, effect(), { keys: downKeys, storeRetryMinMs: 50, storeRetryMaxMs: 100 });
      await consumer.waitUntilReady();
      await publishWire(subject, 'orders', 'no-db', { n: 1 });
      await waitFor('three deferrals', async () => events.filter((e) => e.kind === 'store-unavailable').length >= 3);
      expect(kinds(events).filter((k) => k !== 'store-unavailable')).toEqual([]);
      expect((await consumerState(stream)).redelivered).toBe(1);
      await consumer.close();
      // The message is still in the consumer, waiting for a consumer that reaches Postgres.
      const healed = start<{ n: number }>(stream, effect());
      await waitFor('completed by a healthy consumer', async () => kinds(healed.events, 'no-db').includes('completed'));
    } finally {
      await deadDb.destroy();
    }
  });

  it('refuses a JetStream consumer without explicit acks, and an ack_wait the heartbeat cannot keep at bay', async () => {
    const stream = nats.name('refused');
    await nats.jsm.streams.add({ name: stream, subjects: [`${stream}.>`] });
    await nats.jsm.consumers.add(stream, { durable_name: 'none', ack_policy: AckPolicy.None });
    await nats.jsm.consumers.add(stream, { durable_name: 'short', ack_policy: AckPolicy.Explicit, ack_wait: nanos(1_000) });
    const none = start(stream, effect(), { consumer: 'none' });
    await expect(none.consumer.waitUntilReady()).rejects.toThrow(/ack_policy "none"/);
    const short = start(stream, effect(), { consumer: 'short', leaseMs: 3_000 });
    await expect(short.consumer.waitUntilReady()).rejects.toBeInstanceOf(ValidationError);
  });
});

describe('IdempotentNatsConsumer shutdown', () => {
  it('close() lets a running message finish and acks it', async () => {
    const { stream, subject } = await setUp();
    const gate = createGate();
    const { consumer, events } = start<{ n: number }>(stream, async (ctx) => {
      await gate.wait;
      return effect()(ctx);
    });
    await consumer.waitUntilReady();
    await publishWire(subject, 'orders', 'graceful', { n: 1 });
    await waitFor('claimed', async () => kinds(events, 'graceful').includes('claimed'));
    const closed = consumer.close();
    await sleep(200);
    gate.open();
    await closed;
    expect(kinds(events, 'graceful')).toContain('completed');
    await settled(stream);
  });

  it('past shutdownTimeoutMs, aborts the handler, releases the key and naks the message for another consumer', async () => {
    const { stream, subject } = await setUp();
    let aborted: unknown;
    const { consumer, events } = start<{ n: number }>(
      stream,
      (ctx) =>
        new Promise((_, reject) => {
          ctx.signal.addEventListener('abort', () => {
            aborted = ctx.signal.reason;
            reject(ctx.signal.reason);
          });
        }),
      { shutdownTimeoutMs: 200 },
    );
    await consumer.waitUntilReady();
    await publishWire(subject, 'orders', 'stuck', { n: 1 });
    await waitFor('claimed', async () => kinds(events, 'stuck').includes('claimed'));
    await consumer.close();
    expect((aborted as Error).name).toBe('WorkerClosingError');
    expect(kinds(events, 'stuck')).toContain('released');
    const next = start<{ n: number }>(stream, effect());
    await waitFor('taken over at once', async () => kinds(next.events, 'stuck').includes('completed'), 5_000);
    expect(kinds(next.events, 'stuck')[0]).toBe('taken-over');
  });
});

describe('IdempotentNatsConsumer connection recovery', () => {
  let server: PrivateNats;
  let privateNats: NatsTestEnv;
  beforeAll(async () => {
    server = await PrivateNats.start();
    privateNats = await createNatsTestEnv('nats_recovery', server.url);
  });
  afterAll(async () => {
    await privateNats?.connection.close().catch(() => {});
    await server?.destroy();
  });

  it('keeps consuming after the broker is killed and restarted, with every message run once', async () => {
    const { stream, subject } = await setUp({ jsmOf: privateNats });
    const { consumer, events } = start<{ n: number }>(stream, effect('recovery'), { servers: server.url });
    await consumer.waitUntilReady();
    const publish = (key: string) => privateNats.js.publish(subject, encoder.encode(JSON.stringify(toWireJobData('recovery', key, { n: 1 }))));
    await publish('before');
    await waitFor('first completed', async () => kinds(events, 'before').includes('completed'));
    await server.restart(500);
    await waitFor('publisher reconnected', async () => publish('after').then(() => true, () => false), 20_000, 200);
    await waitFor('second completed', async () => kinds(events, 'after').includes('completed'), 30_000);
    expect(await effectsOf(env.db, env.schema, 'recovery', 'before')).toHaveLength(1);
    expect(await effectsOf(env.db, env.schema, 'recovery', 'after')).toHaveLength(1);
  });

  it("a consumer process's /healthz fails the broker check while the server is away, passes once it is back, and fails the consumer check once it closes", async () => {
    const stream = privateNats.name('health');
    await privateNats.jsm.streams.add({ name: stream, subjects: [`${stream}.>`] });
    const started = await startNatsConsumerProcess({
      config: loadEnvConfig({ DATABASE_URL: env.databaseUrl, DATABASE_DIRECT_URL: env.databaseDirectUrl, SCHEMA: env.schema, MIGRATE: 'false', METRICS_PORT: '0' }),
      handler: async (ctx) => ctx.data,
      servers: server.url,
      stream,
      consumer: 'payments',
      logger: silent,
      handleSignals: false,
    });
    const health = async () => {
      const response = await fetch(`${started.metricsServer!.url}/healthz`);
      return { status: response.status, checks: ((await response.json()) as { checks: Record<string, { ok: boolean; error?: string }> }).checks };
    };
    try {
      expect(await health()).toEqual({ status: 200, checks: { postgres: { ok: true }, broker: { ok: true }, consumer: { ok: true } } });
      await server.crash();
      const down = await waitFor('the broker check to fail', async () => {
        const report = await health();
        return report.status === 503 ? report : undefined;
      });
      expect(down.checks).toMatchObject({ postgres: { ok: true }, broker: { ok: false }, consumer: { ok: true } });
      await server.restart(0);
      await waitFor('the broker check to pass again', async () => (await health()).status === 200, 30_000, 200);
      await started.consumer.close();
      expect(await health()).toMatchObject({ status: 503, checks: { consumer: { ok: false, error: 'the consumer is not running (closing or closed)' } } });
    } finally {
      await started.stop();
    }
  });
});

describe('data layers checked at start', () => {
  /** A handler writing its effect through node-postgres on the data layer's pool. */
  const writingIn =
    (layer: ReturnType<typeof pgDataLayer>): NatsJobHandler<{ n: number }> =>
    (ctx) =>
      ctx.transaction(layer, async (client) => {
        await client.query(`insert into ${pg.escapeIdentifier(env.schema)}.effects (scope, key, fence, worker) values ($1, $2, $3, 'nats-pg')`, [ctx.scope, ctx.key, ctx.fence]);
        return { n: ctx.data.n };
      });

  it('refuses to start with a data layer on another database than the keys, naming the fix, and takes no message', async () => {
    await withAnotherDatabase(env, async (otherUrl) => {
      const pool = new pg.Pool({ connectionString: otherUrl });
      pool.on('error', () => {});
      try {
        const { stream, subject } = await setUp();
        await publishWire(subject, 'nats', 'dl-elsewhere-1', { n: 1 });
        const layer = pgDataLayer(pool);
        const { consumer } = start(stream, writingIn(layer), { dataLayers: [layer] });
        const refused = await consumer.waitUntilReady().then(
          () => undefined,
          (error: unknown) => error,
        );
        expect(refused).toBeInstanceOf(DataLayerElsewhereError);
        expect((refused as Error).message).toMatch(/connection string/);
        expect(consumer.isRunning).toBe(false);
        await sleep(300);
        expect((await consumerState(stream)).pending).toBe(1);
        expect(await keys.get('nats', 'dl-elsewhere-1')).toBeUndefined();
      } finally {
        await pool.end();
      }
    });
  });

  it("starts with a data layer on the keys' database and runs its messages", async () => {
    const pool = new pg.Pool({ connectionString: env.databaseUrl });
    pool.on('error', () => {});
    try {
      const { stream, subject } = await setUp();
      const layer = pgDataLayer(pool);
      const { consumer } = start(stream, writingIn(layer), { dataLayers: [layer] });
      await consumer.waitUntilReady();
      await publishWire(subject, 'nats', 'dl-here-1', { n: 2 });
      await waitFor('the message committed', async () => (await effectsOf(env.db, env.schema, 'nats', 'dl-here-1')).length === 1);
      await consumer.close();
    } finally {
      await pool.end();
    }
  });
});
