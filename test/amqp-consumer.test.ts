// @module-tag rabbitmq
/**
 * The RabbitMQ consumer against the real broker and Postgres: every outcome in RabbitMQ's
 * vocabulary (ack after commit, delay queues for deferrals and store faults, dead-letter with a
 * reason), identity from body or headers, heartbeat, shutdown and channel recovery.
 */
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { ConsumeMessage, GetMessage } from 'amqplib';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  ATTEMPTS_HEADER,
  DEFERRALS_HEADER,
  ERROR_HEADER,
  REASON_HEADER,
  createAmqpConsumer,
  type AmqpConsumer,
  type AmqpConsumerOptions,
  type AmqpJobHandler,
} from '../src/amqp/index.js';
import pg from 'pg';
import { DataLayerElsewhereError, IdempotencyKeys, ValidationError, createPostgresDb, type WorkerEvent } from '../src/index.js';
import { pgDataLayer } from '../src/pg/index.js';
import { withAnotherDatabase } from './support/another-database.js';
import { createAmqpTestEnv, type AmqpTestEnv, AMQP_URL } from './support/amqp-test-env.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let amqp: AmqpTestEnv;
let keys: IdempotencyKeys;
const consumers: AmqpConsumer<any, any>[] = [];

beforeAll(async () => {
  env = await createTestEnv('amqp_consumer');
  amqp = await createAmqpTestEnv('amqp-consumer');
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
  await sql`create table ${sql.table(`${env.schema}.ledger`)} (key text not null, amount int not null)`.execute(env.db);
});
afterEach(async () => {
  await Promise.all(consumers.splice(0).map((consumer) => consumer.close()));
});
afterAll(async () => {
  await amqp?.teardown();
  await env?.teardown();
});

interface Consumer {
  readonly consumer: AmqpConsumer<any, any>;
  readonly events: WorkerEvent[];
  readonly queue: string;
}

async function startConsumer(queue: string, handler: AmqpConsumerOptions<any>['handler'], options: Partial<AmqpConsumerOptions<any>> = {}): Promise<Consumer> {
  const consumer = createAmqpConsumer<any>({
    url: AMQP_URL,
    queue,
    keys,
    handler,
    logger: pino({ level: 'silent' }),
    retryDelayMs: 50,
    deferMinMs: 50,
    deferMaxMs: 200,
    storeRetryMinMs: 50,
    storeRetryMaxMs: 200,
    shutdownTimeoutMs: 5_000,
    ...options,
  });
  const events: WorkerEvent[] = [];
  consumer.on('event', (event) => events.push(event));
  consumers.push(consumer);
  await consumer.start();
  return { consumer, events, queue };
}

/** A handler writing one ledger row per effect, in the key's completion transaction. */
const ledger: AmqpJobHandler<{ amount: number }> = async (ctx) =>
  ctx.transaction(async (tx) => {
    await tx.insertInto(`${env.schema}.ledger`).values({ key: ctx.key, amount: ctx.data.amount }).execute();
    return { booked: ctx.data.amount };
  });

async function ledgerRows(key: string): Promise<number> {
  const rows = await env.db.selectFrom(`${env.schema}.ledger`).select('amount').where('key', '=', key).execute();
  return rows.length;
}

async function until<T>(what: string, probe: () => Promise<T | undefined> | T | undefined, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

const kinds = (events: WorkerEvent[], key?: string) => events.filter((e) => key === undefined || e.key === key).map((e) => e.kind);
const count = (events: WorkerEvent[], kind: string, key?: string) => kinds(events, key).filter((k) => k === kind).length;

function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { open, opened };
}

async function deadLetters(queue: string, expected: number): Promise<GetMessage[]> {
  const got: GetMessage[] = [];
  await until(`${expected} dead-lettered messages`, async () => {
    got.push(...(await amqp.drain(`${queue}.dead-letter`)));
    return got.length >= expected ? true : undefined;
  });
  return got;
}

describe('the queues the consumer declares', () => {
  it('a queue a publisher declared first as docs/brokers.md shows is the consumer\'s; one declared otherwise fails its start, saying what to do', async () => {
    const doc = readFileSync(new URL('../docs/brokers.md', import.meta.url), 'utf8');
    const section = doc.split(/^### The queues it declares$/m)[1]?.split(/^### /m)[0] ?? '';
    const shown = /await channel\.assertQueue\('payments', \{ durable: (true|false) \}\);/.exec(section);
    expect(shown, 'docs/brokers.md shows how a publisher declares the queue').not.toBeNull();
    const queue = amqp.queueName('declared-first');
    await amqp.channel.assertQueue(queue, { durable: shown![1] === 'true' });
    amqp.publish(queue, { idempotencyKey: 'declared-1', scope: 'amqp', payload: { amount: 1 } });
    const { events } = await startConsumer(queue, ledger);
    await until('completion', () => count(events, 'completed') === 1 || undefined);

    const other = amqp.queueName('declared-otherwise');
    await amqp.channel.assertQueue(other, { durable: false });
    await expect(startConsumer(other, ledger)).rejects.toThrow(/^RabbitMQ refused the declaration of queue ".*" or ".*" \(.*PRECONDITION_FAILED.*\): the consumer declares both durable, with no arguments/);
  });
});

describe('AMQP consumer outcomes', () => {
  it('completed: the effect commits once, then the message is acknowledged', async () => {
    const queue = amqp.queueName('completed');
    const { events } = await startConsumer(queue, ledger);
    amqp.publish(queue, { idempotencyKey: 'k1', scope: 'amqp', payload: { amount: 10 } });
    await until('completion', () => count(events, 'completed') === 1 || undefined);
    expect(await ledgerRows('k1')).toBe(1);
    // The row names RabbitMQ's queue as a broker's (a sweeper leaves such keys to the broker).
    expect(await keys.get('amqp', 'k1')).toMatchObject({ status: 'completed', result: { booked: 10 }, queue: `amqp:${queue}` });
    // Acknowledged: nothing waits in the queue or unacked (a consumer close would requeue it).
    await until('ack', async () => ((await amqp.depth(queue)) === 0 ? true : undefined));
  });

  it('replayed: a duplicate message is acknowledged with nothing run', async () => {
    const queue = amqp.queueName('replayed');
    let runs = 0;
    const { events } = await startConsumer(queue, async (ctx) => {
      runs++;
      return ledger(ctx);
    });
    for (let i = 0; i < 5; i++) amqp.publish(queue, { idempotencyKey: 'k-replay', scope: 'amqp', payload: { amount: 5 } });
    await until('five settled', () => count(events, 'completed') + count(events, 'replayed') + count(events, 'deferred') >= 5 || undefined);
    await until('all replayed', () => count(events, 'replayed') === 4 || undefined);
    expect(runs).toBe(1);
    expect(await ledgerRows('k-replay')).toBe(1);
    expect(await amqp.depth(`${queue}.dead-letter`)).toBe(0);
  });

  it('deferred: an in-progress duplicate goes through a delay queue without counting an attempt, then replays', async () => {
    const queue = amqp.queueName('deferred');
    const held = gate();
    const started = gate();
    const seen: ConsumeMessage[] = [];
    const { events } = await startConsumer(
      queue,
      async (ctx) => {
        seen.push(ctx.message);
        started.open();
        await held.opened;
        return ledger(ctx);
      },
      { concurrency: 2, maxAttempts: 1 },
    );
    const message = { idempotencyKey: 'k-defer', scope: 'amqp', payload: { amount: 7 } };
    amqp.publish(queue, message);
    await started.opened;
    amqp.publish(queue, message);
    await until('two deferrals', () => count(events, 'deferred') >= 2 || undefined);
    held.open();
    await until('replay', () => count(events, 'replayed') === 1 || undefined);
    expect(seen).toHaveLength(1);
    expect(count(events, 'failed')).toBe(0);
    expect(await ledgerRows('k-defer')).toBe(1);
    // maxAttempts 1: had a deferral counted as a failed delivery, the duplicate would be dead-lettered.
    expect(await amqp.depth(`${queue}.dead-letter`)).toBe(0);
  });

  it('key-reused: the same key with another payload is dead-lettered with its reason; nothing runs', async () => {
    const queue = amqp.queueName('reused');
    const { events } = await startConsumer(queue, ledger);
    amqp.publish(queue, { idempotencyKey: 'k-reused', scope: 'amqp', payload: { amount: 1 } });
    await until('first', () => count(events, 'completed') === 1 || undefined);
    amqp.publish(queue, { idempotencyKey: 'k-reused', scope: 'amqp', payload: { amount: 2 } }, { messageId: 'second' });
    const [dead] = await deadLetters(queue, 1);
    expect(dead!.properties.headers?.[REASON_HEADER]).toBe('key-reused');
    expect(String(dead!.properties.headers?.[ERROR_HEADER])).toContain('k-reused');
    expect(dead!.properties.messageId).toBe('second');
    expect(JSON.parse(dead!.content.toString())).toMatchObject({ payload: { amount: 2 } });
    expect(await ledgerRows('k-reused')).toBe(1);
  });

  it('invalid-message: a body that is not JSON, and one without a key, are dead-lettered with the reason; nothing runs', async () => {
    const queue = amqp.queueName('invalid');
    let runs = 0;
    await startConsumer(queue, async () => void runs++);
    amqp.publish(queue, Buffer.from('{not json'));
    amqp.publish(queue, { scope: 'amqp', payload: {} });
    const dead = await deadLetters(queue, 2);
    expect(dead.map((m) => m.properties.headers?.[REASON_HEADER])).toEqual(['invalid-message', 'invalid-message']);
    const errors = dead.map((m) => String(m.properties.headers?.[ERROR_HEADER])).join('\n');
    expect(errors).toContain('not JSON');
    expect(errors).toContain('"idempotencyKey" is missing');
    expect(dead[0]!.content.toString()).toBe('{not json');
    expect(runs).toBe(0);
  });

  it('retry: a retryable error goes through a delay queue with the attempt counted, then succeeds once', async () => {
    const queue = amqp.queueName('retry');
    const attempts: unknown[] = [];
    const { events } = await startConsumer(queue, async (ctx) => {
      attempts.push(ctx.message.properties.headers?.[ATTEMPTS_HEADER]);
      if (attempts.length < 3) throw new Error('downstream flaked');
      return ledger(ctx);
    }, { maxAttempts: 3 });
    amqp.publish(queue, { idempotencyKey: 'k-retry', scope: 'amqp', payload: { amount: 3 } });
    await until('completion', () => count(events, 'completed') === 1 || undefined);
    expect(attempts).toEqual([undefined, 1, 2]);
    expect(count(events, 'released')).toBe(2);
    expect(await ledgerRows('k-retry')).toBe(1);
    expect(await amqp.depth(`${queue}.dead-letter`)).toBe(0);
  });

  it('failed-permanently: the last attempt stores the error and dead-letters the message; a duplicate is dead-lettered as replayed-failure', async () => {
    const queue = amqp.queueName('failed');
    let runs = 0;
    const { events } = await startConsumer(queue, async () => {
      runs++;
      throw new Error('card declined');
    }, { maxAttempts: 2 });
    const message = { idempotencyKey: 'k-failed', scope: 'amqp', payload: { amount: 4 } };
    amqp.publish(queue, message);
    const [dead] = await deadLetters(queue, 1);
    expect(runs).toBe(2);
    expect(dead!.properties.headers?.[REASON_HEADER]).toBe('failed');
    expect(String(dead!.properties.headers?.[ERROR_HEADER])).toContain('card declined');
    expect(await keys.get('amqp', 'k-failed')).toMatchObject({ status: 'failed', error: { message: 'card declined' } });
    amqp.publish(queue, message);
    const [replayed] = await deadLetters(queue, 1);
    expect(replayed!.properties.headers?.[REASON_HEADER]).toBe('replayed-failure');
    expect(runs).toBe(2);
    expect(count(events, 'replayed-failure')).toBe(1);
  });

  it('store-unavailable: Postgres unreachable delays the message (deferrals counted, backing off); nothing is failed or lost', async () => {
    const queue = amqp.queueName('store-down');
    // A pool pointed at a port nobody listens on: every claim meets a refused connection.
    const deadDb = createPostgresDb({ connectionString: 'postgres://postgres@127.0.0.1:1/postgres', maxConnections: 1 }, () => {});
    const deadKeys = new IdempotencyKeys({ db: deadDb, schema: env.schema });
    try {
      const { consumer, events } = await startConsumer(queue, ledger, { keys: deadKeys, maxAttempts: 1 });
      amqp.publish(queue, { idempotencyKey: 'k-store', scope: 'amqp', payload: { amount: 9 } });
      await until('three deferrals', () => count(events, 'store-unavailable') >= 3 || undefined);
      await consumer.close();
      expect(count(events, 'failed')).toBe(0);
      expect(await amqp.depth(`${queue}.dead-letter`)).toBe(0);
      // The message is still on its way: in the queue or a delay queue, its deferrals counted.
      const found = await until('the message back', async () => {
        const messages = [];
        for (const each of [queue, ...consumer.topology.delayQueues]) messages.push(...(await amqp.drain(each).catch(() => [])));
        return messages.length > 0 ? messages : undefined;
      });
      expect(found).toHaveLength(1);
      expect(Number(found[0]!.properties.headers?.[DEFERRALS_HEADER])).toBeGreaterThanOrEqual(3);
    } finally {
      await deadDb.destroy();
    }
  });
});

describe('AMQP consumer options', () => {
  it('refuses a count or delay that is not a positive integer, naming the option', () => {
    const base = { url: AMQP_URL, queue: 'never-consumed', keys, handler: async () => null };
    for (const [field, value] of [['concurrency', 0], ['maxAttempts', 1.5], ['retryDelayMs', -1]] as const) {
      expect(() => createAmqpConsumer({ ...base, [field]: value }), field).toThrow(
        expect.objectContaining({ name: 'ValidationError', field, message: `Invalid consumer option ${field}: expected a positive integer, got ${value}.` }),
      );
    }
  });
});

describe('AMQP fast path', () => {
  it('fastPath: claim, effect and completion in one transaction; a duplicate replays; steps are refused with a clear error', async () => {
    const queue = amqp.queueName('fast-path');
    const { events } = await startConsumer(queue, async (ctx) => {
      if (ctx.data.steps) await ctx.step('refused', async () => 1);
      return ledger(ctx);
    }, { fastPath: true, maxAttempts: 1 });
    amqp.publish(queue, { idempotencyKey: 'k-fast', scope: 'amqp', payload: { amount: 8 } });
    amqp.publish(queue, { idempotencyKey: 'k-fast', scope: 'amqp', payload: { amount: 8 } });
    amqp.publish(queue, { idempotencyKey: 'k-fast-steps', scope: 'amqp', payload: { amount: 1, steps: true } });
    await until('settled', () => count(events, 'completed') + count(events, 'replayed') === 2 || undefined);
    const [dead] = await deadLetters(queue, 1);
    expect(await ledgerRows('k-fast')).toBe(1);
    expect(dead!.properties.headers?.[REASON_HEADER]).toBe('failed');
    expect(String(dead!.properties.headers?.[ERROR_HEADER])).toContain('fast path');
  });
});

describe('AMQP database-only handler', () => {
  it('{ transaction } runs on the fast path in groups by default: each effect once, its result stored; a duplicate replays; a failure is dead-lettered', async () => {
    const queue = amqp.queueName('database-only');
    const contexts = new Set<string>();
    const { events } = await startConsumer(
      queue,
      {
        transaction: async (tx, ctx) => {
          contexts.add(Object.keys(ctx).sort().join(' '));
          if (ctx.data.refuse) throw new ValidationError('INVALID_JOB_DATA', 'payload.refuse', 'refused for good');
          await tx.insertInto(`${env.schema}.ledger`).values({ key: ctx.key, amount: ctx.data.amount }).execute();
          return { booked: ctx.data.amount };
        },
      },
      { concurrency: 8 },
    );
    const dbKeys = Array.from({ length: 12 }, (_, i) => `k-db-${String(i).padStart(2, '0')}`);
    dbKeys.forEach((key, i) => amqp.publish(queue, { idempotencyKey: key, scope: 'amqp', payload: { amount: i } }));
    // A duplicate while its key may still be in a group: it replays, never a second effect.
    amqp.publish(queue, { idempotencyKey: dbKeys[0], scope: 'amqp', payload: { amount: 0 } });
    amqp.publish(queue, { idempotencyKey: 'k-db-refused', scope: 'amqp', payload: { amount: 1, refuse: true } });
    await until('completions', () => count(events, 'completed') === dbKeys.length || undefined);
    await until('the replay', () => count(events, 'replayed') === 1 || undefined);
    const [dead] = await deadLetters(queue, 1);
    expect(dead!.properties.headers?.[REASON_HEADER]).toBe('failed');
    expect(String(dead!.properties.headers?.[ERROR_HEADER])).toContain('refused for good');
    expect(contexts).toEqual(new Set(['attempt data fence key message scope signal']));
    const { rows } = await sql<{ key: string; xid: string; claimed_with_effect: boolean; result: unknown }>`
      select l.key, l.xmin::text as xid, k.created_at = k.updated_at as claimed_with_effect, k.result
        from ${sql.table(`${env.schema}.ledger`)} l
        join ${sql.table(`${env.schema}.idempotency_keys`)} k on k.scope = 'amqp' and k.key = l.key
       where l.key like 'k-db-%' order by l.key`.execute(env.db);
    expect(rows.map((row) => [row.key, row.claimed_with_effect, row.result])).toEqual(dbKeys.map((key, i) => [key, true, { booked: i }]));
    // Group commit: some of the effects shared a transaction (xmin: the inserting transaction).
    expect(new Set(rows.map((row) => row.xid)).size).toBeLessThan(dbKeys.length);
    expect(await keys.get('amqp', 'k-db-refused')).toMatchObject({ status: 'failed' });
  });
});

describe('AMQP attempts and store faults', () => {
  it('a database-only handler on the fast path: each failed run is an attempt (the header counts them); a poison message is dead-lettered at maxAttempts', async () => {
    const queue = amqp.queueName('db-poison');
    const headers: unknown[] = [];
    await startConsumer(
      queue,
      {
        transaction: async (tx, ctx) => {
          headers.push(ctx.message.properties.headers?.[ATTEMPTS_HEADER]);
          await tx.insertInto(`${env.schema}.ledger`).values({ key: ctx.key, amount: 1 }).execute();
          throw new Error('poison message');
        },
      },
      { maxAttempts: 3 },
    );
    amqp.publish(queue, { idempotencyKey: 'k-db-poison', scope: 'amqp', payload: { amount: 1 } });
    const [dead] = await deadLetters(queue, 1);
    expect(dead!.properties.headers?.[REASON_HEADER]).toBe('failed');
    expect(String(dead!.properties.headers?.[ERROR_HEADER])).toContain('poison message');
    // A group that rolled back runs its jobs again within one delivery: count the deliveries.
    expect([...new Set(headers)]).toEqual([undefined, 1, 2]);
    expect(await keys.get('amqp', 'k-db-poison')).toMatchObject({ status: 'failed', error: { message: 'poison message' } });
    expect(await ledgerRows('k-db-poison')).toBe(0);
  });

  it('a store fault that lasts past storeRetryWindowMs counts as an attempt: at maxAttempts it is stored and the message dead-lettered', async () => {
    const queue = amqp.queueName('persistent-fault');
    const { events } = await startConsumer(
      queue,
      async (ctx) =>
        ctx.transaction(async (tx) => {
          // Deterministic, but classified as transient: out_of_memory every time.
          await sql.raw(`do $$ begin raise exception 'simulated out of memory' using errcode = '53200'; end $$`).execute(tx);
        }),
      { maxAttempts: 2, storeRetryWindowMs: 600, storeRetryMaxMs: 100 },
    );
    amqp.publish(queue, { idempotencyKey: 'k-persistent', scope: 'amqp', payload: { amount: 1 } });
    const [dead] = await deadLetters(queue, 1);
    expect(dead!.properties.headers?.[REASON_HEADER]).toBe('failed');
    expect(String(dead!.properties.headers?.[ERROR_HEADER])).toContain('simulated out of memory');
    // Deferred first (how many times depends on the machine's speed within the window), then counted.
    expect(count(events, 'store-unavailable', 'k-persistent')).toBeGreaterThanOrEqual(1);
    expect(await keys.get('amqp', 'k-persistent')).toMatchObject({ status: 'failed', error: expect.objectContaining({ code: 'STORE_FAULT_PERSISTED' }) });
  });
});

describe('AMQP identity', () => {
  it('from the Idempotency-Key header with a fixed scope: the whole JSON body is the payload', async () => {
    const queue = amqp.queueName('header');
    const seen: unknown[] = [];
    const { events } = await startConsumer(queue, async (ctx) => {
      seen.push([ctx.scope, ctx.key, ctx.data]);
      return 'ok';
    }, { identity: { source: 'header', scope: 'foreign' } });
    amqp.publish(queue, { amount: 1 }, { headers: { 'idempotency-key': 'h-1' } });
    amqp.publish(queue, { amount: 1 }, { headers: { 'Idempotency-Key': 'h-1' } });
    amqp.publish(queue, { amount: 1 });
    await until('settled', () => count(events, 'completed') + count(events, 'replayed') === 2 || undefined);
    const [dead] = await deadLetters(queue, 1);
    expect(seen).toEqual([['foreign', 'h-1', { amount: 1 }]]);
    expect(String(dead!.properties.headers?.[ERROR_HEADER])).toContain('Idempotency-Key');
  });

  it('from the message-id property with a fixed scope', async () => {
    const queue = amqp.queueName('message-id');
    const { events } = await startConsumer(queue, async (ctx) => ctx.key, { identity: { source: 'message-id', scope: 'foreign' } });
    const messageId = randomUUID();
    amqp.publish(queue, { any: 'body' }, { messageId });
    amqp.publish(queue, { any: 'body' }, { messageId });
    await until('settled', () => count(events, 'completed') + count(events, 'replayed') === 2 || undefined);
    expect(await keys.get('foreign', messageId)).toMatchObject({ status: 'completed', result: messageId });
  });
});

describe('AMQP lease, steps, shutdown and recovery', () => {
  it('heartbeat: a handler longer than its lease keeps the key (lease extended, no takeover by a second consumer)', async () => {
    const queue = amqp.queueName('heartbeat');
    let runs = 0;
    const handler: AmqpJobHandler<any> = async (ctx) => {
      runs++;
      await new Promise((resolve) => setTimeout(resolve, 1_500));
      return ledger(ctx);
    };
    const first = await startConsumer(queue, handler, { leaseMs: 400 });
    const second = await startConsumer(queue, handler, { leaseMs: 400 });
    const message = { idempotencyKey: 'k-beat', scope: 'amqp', payload: { amount: 1 } };
    amqp.publish(queue, message);
    amqp.publish(queue, message);
    const all = () => [...first.events, ...second.events];
    await until('done', () => count(all(), 'completed') === 1 && count(all(), 'replayed') === 1 || undefined);
    expect(runs).toBe(1);
    expect(count(all(), 'lease-extended')).toBeGreaterThan(0);
    expect(count(all(), 'taken-over')).toBe(0);
  });

  it('steps: ctx.step records a step once and a retry replays it', async () => {
    const queue = amqp.queueName('steps');
    let charges = 0;
    let calls = 0;
    const { events } = await startConsumer(queue, async (ctx) => {
      const charge = await ctx.step('charge', async () => ++charges);
      if (++calls === 1) throw new Error('after the charge');
      return ctx.transaction(async () => ({ charge }));
    });
    amqp.publish(queue, { idempotencyKey: 'k-steps', scope: 'amqp', payload: {} });
    await until('completion', () => count(events, 'completed') === 1 || undefined);
    expect(charges).toBe(1);
    expect(count(events, 'step-replayed')).toBe(1);
    expect(await keys.get('amqp', 'k-steps')).toMatchObject({ result: { charge: 1 } });
  });

  it('graceful close: an active message finishes and is acknowledged before the connection closes', async () => {
    const queue = amqp.queueName('close');
    const started = gate();
    const { consumer, events } = await startConsumer(queue, async (ctx) => {
      started.open();
      await new Promise((resolve) => setTimeout(resolve, 300));
      return ledger(ctx);
    });
    amqp.publish(queue, { idempotencyKey: 'k-close', scope: 'amqp', payload: { amount: 1 } });
    await started.opened;
    await consumer.close();
    expect(kinds(events)).toContain('completed');
    expect(await amqp.depth(queue)).toBe(0);
  });

  it('close past the deadline: the key is released and the message given back; another consumer finishes it once', async () => {
    const queue = amqp.queueName('abandon');
    const started = gate();
    let aborted: unknown;
    const { consumer, events } = await startConsumer(queue, async (ctx) => {
      started.open();
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve, { once: true }));
      aborted = ctx.signal.reason;
      throw ctx.signal.reason;
    }, { shutdownTimeoutMs: 200 });
    amqp.publish(queue, { idempotencyKey: 'k-abandon', scope: 'amqp', payload: { amount: 2 } });
    await started.opened;
    await consumer.close();
    expect((aborted as Error).name).toBe('WorkerClosingError');
    expect(count(events, 'released')).toBe(1);
    expect(await keys.get('amqp', 'k-abandon')).toMatchObject({ status: 'processing' });
    const next = await startConsumer(queue, ledger);
    await until('completion elsewhere', () => count(next.events, 'completed') === 1 || undefined);
    expect(next.events.find((e) => e.kind === 'taken-over' || e.kind === 'claimed')?.kind).toBe('taken-over');
    expect(await ledgerRows('k-abandon')).toBe(1);
  });

  it('a closed channel mid-message: the consumer reconnects, the redelivered copy waits for the lease and replays; one effect', async () => {
    const queue = amqp.queueName('channel-closed');
    const started = gate();
    const held = gate();
    let runs = 0;
    const { consumer, events } = await startConsumer(queue, async (ctx) => {
      runs++;
      started.open();
      await held.opened;
      return ledger(ctx);
    }, { concurrency: 2 });
    amqp.publish(queue, { idempotencyKey: 'k-channel', scope: 'amqp', payload: { amount: 6 } });
    await started.opened;
    // The broker closes the channel (what consumer_timeout or a channel error does).
    await closeConsumerChannel(consumer);
    await until('reconnected and the copy deferred', () => consumer.isConsuming && count(events, 'deferred') >= 1 || undefined);
    held.open();
    await until('replayed', () => count(events, 'replayed') === 1 || undefined);
    expect(runs).toBe(1);
    expect(count(events, 'completed')).toBe(1);
    expect(await ledgerRows('k-channel')).toBe(1);
    // And it goes on consuming on its new channel.
    amqp.publish(queue, { idempotencyKey: 'k-after', scope: 'amqp', payload: { amount: 1 } });
    await until('after reconnect', () => count(events, 'completed') === 2 || undefined);
  });
});

/** Closes the consumer's channel from the broker's side: a channel error (an ack of an unknown delivery tag). */
async function closeConsumerChannel(consumer: AmqpConsumer<any, any>): Promise<void> {
  consumer.channel!.ack({ fields: { deliveryTag: 999_999 } } as never);
  await until('channel closed', () => !consumer.isConsuming || undefined);
}

describe('data layers checked at start', () => {
  /** A handler writing its effect through node-postgres on `pool`. */
  const writingIn = (layer: ReturnType<typeof pgDataLayer>): AmqpJobHandler<{ amount: number }> => async (ctx) =>
    ctx.transaction(layer, async (client) => {
      await client.query(`insert into ${pg.escapeIdentifier(env.schema)}.ledger (key, amount) values ($1, $2)`, [ctx.key, ctx.data.amount]);
      return { booked: ctx.data.amount };
    });

  it('refuses to start with a data layer on another database than the keys, naming the fix, and takes no message', async () => {
    await withAnotherDatabase(env, async (otherUrl) => {
      const pool = new pg.Pool({ connectionString: otherUrl });
      pool.on('error', () => {});
      try {
        const queue = amqp.queueName('dl-elsewhere');
        await amqp.channel.assertQueue(queue, { durable: true });
        amqp.publish(queue, { idempotencyKey: 'dl-elsewhere-1', scope: 'amqp', payload: { amount: 5 } });
        const layer = pgDataLayer(pool);
        const refused = await startConsumer(queue, writingIn(layer), { dataLayers: [layer] }).then(
          () => undefined,
          (error: unknown) => error,
        );
        expect(refused).toBeInstanceOf(DataLayerElsewhereError);
        expect((refused as Error).message).toMatch(/connection string/);
        await new Promise((resolve) => setTimeout(resolve, 300));
        expect(await amqp.depth(queue)).toBe(1);
        expect(await keys.get('amqp', 'dl-elsewhere-1')).toBeUndefined();
      } finally {
        await pool.end();
      }
    });
  });

  it("starts with a data layer on the keys' database and runs its messages", async () => {
    const pool = new pg.Pool({ connectionString: env.databaseUrl });
    pool.on('error', () => {});
    try {
      const queue = amqp.queueName('dl-here');
      const layer = pgDataLayer(pool);
      await startConsumer(queue, writingIn(layer), { dataLayers: [layer] });
      amqp.publish(queue, { idempotencyKey: 'dl-here-1', scope: 'amqp', payload: { amount: 7 } });
      await until('the message committed', async () => ((await ledgerRows('dl-here-1')) === 1 ? true : undefined));
    } finally {
      await pool.end();
    }
  });
});
