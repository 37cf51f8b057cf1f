// @module-tag redis
/**
 * The HTTP API's semantics without HTTP (`JobIngestion`), on real Postgres and Redis: a request
 * whose record expires between its claim and the read of its answer (the janitor deleted it
 * right then) is answered as the key now stands, never with an error.
 */
import { randomUUID } from 'node:crypto';
import { sql, type Transaction } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, IdempotentProducer, jobIdFor, type Claim, type ExecuteOnceOptions, type ExecuteOnceOutcome } from '../src/index.js';
import { Janitor } from '../src/process/index.js';
import { JobIngestion, requestScopeFor } from '../src/http/job-ingestion.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const HOUR = 3_600_000;
const silent = pino({ level: 'silent' });

/**
 * Keys whose next `executeOnce` has its key expire, and the janitor delete it, once the claim has
 * answered: the moment a retry's claim found the record and its read comes next.
 */
class ExpiringKeys extends IdempotencyKeys {
  /** The janitor's tombstone window for the next expiry; unset: no expiry. */
  expireNext: { readonly tombstoneMs: number } | undefined;

  override async executeOnce<T>(
    scope: string,
    key: string,
    fingerprint: string,
    effect: (tx: Transaction<any>, claim: Claim) => Promise<T>,
    options?: ExecuteOnceOptions,
  ): Promise<ExecuteOnceOutcome<T>> {
    const outcome = await super.executeOnce(scope, key, fingerprint, effect, options);
    const expiry = this.expireNext;
    this.expireNext = undefined;
    if (expiry) {
      await sql`update ${sql.id(env.schema, 'idempotency_keys')} set expires_at = now() - interval '1 second' where scope = ${scope} and key = ${key}`.execute(env.db);
      const { keysDeleted } = await new Janitor({ db: env.db, schema: env.schema, retentionMs: HOUR, tombstoneMs: expiry.tombstoneMs, logger: silent }).runOnce();
      expect(keysDeleted).toBe(1);
    }
    return outcome;
  }
}

let env: TestEnv;
let keys: ExpiringKeys;
let producer: IdempotentProducer;
let ingestion: JobIngestion;

beforeAll(async () => {
  env = await createTestEnv('job_ingestion');
  keys = new ExpiringKeys({ db: env.db, schema: env.schema });
  producer = new IdempotentProducer({ queue: 'payments', connection: { url: env.redisUrl }, prefix: env.redisPrefix, schema: env.schema });
  ingestion = new JobIngestion({ keys, producers: new Map([['payments', producer]]) });
});
afterAll(async () => {
  await producer?.close();
  await env?.teardown();
});

const submit = (key: string, cents = 100) => ingestion.submit({ tenant: 'acme', queue: 'payments', key, name: 'charge', payload: { cents } });
const recordOf = async (key: string) =>
  (await sql<{ status: string }>`select status from ${sql.id(env.schema, 'idempotency_keys')} where scope = ${requestScopeFor('acme')} and key = ${key}`.execute(env.db)).rows[0];

describe('a record that expires between the claim and the read of its answer', () => {
  it('a retry that found the record is answered as the key stands after it: 410 expired while its tombstone lasts', async () => {
    const key = randomUUID();
    expect((await submit(key)).kind).toBe('created');
    keys.expireNext = { tombstoneMs: 2 * HOUR };
    const retry = await submit(key);
    expect(retry).toMatchObject({ kind: 'expired' });
    expect(await recordOf(key)).toBeUndefined();
  });

  it('a retry that found the record, which left no tombstone, is a new request: accepted again', async () => {
    const key = randomUUID();
    expect((await submit(key)).kind).toBe('created');
    keys.expireNext = { tombstoneMs: 0 };
    const retry = await submit(key);
    expect(retry.kind).toBe('created');
    expect(await recordOf(key)).toEqual({ status: 'completed' });
  });

  it('a first request whose record expired as soon as it committed is answered created, from what it wrote, and enqueued once', async () => {
    for (const tombstoneMs of [2 * HOUR, 0]) {
      const key = randomUUID();
      keys.expireNext = { tombstoneMs };
      const first = await submit(key);
      expect(first).toMatchObject({ kind: 'created', view: { key, queue: 'payments', name: 'charge' } });
      // Not claimed again: no second record, and one outbox row for the job.
      expect(await recordOf(key)).toBeUndefined();
      const { rows } = await sql<{ n: number }>`select count(*)::int as n from ${sql.id(env.schema, 'outbox')} where job_id = ${jobIdFor('acme', key)}`.execute(env.db);
      expect(rows[0]!.n).toBe(1);
    }
  });
});
