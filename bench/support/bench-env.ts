/**
 * The benchmark's own corner of the shared servers: one Postgres schema and one Redis key
 * prefix per run, both removed at the end. Nothing outside them is touched.
 */
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { createPostgresDb, migrate } from '../../src/index.js';

/** Where the benchmark runs and what it may use. */
export interface BenchEnv {
  readonly databaseUrl: string;
  readonly redisUrl: string;
  /** This run's Postgres schema (idempotency tables and the `bench_effects` table). */
  readonly schema: string;
  /** This run's BullMQ prefix. */
  readonly redisPrefix: string;
  /** A small pool for the benchmark's own bookkeeping (never used inside a measured window). */
  readonly db: Kysely<any>;
  /** Empties the effects and keys tables between measurements. */
  resetTables(): Promise<void>;
  /** Deletes this run's BullMQ keys of one queue. */
  deleteQueueKeys(queue: string): Promise<void>;
  /** Drops the schema and the prefix's keys, closes the pool. */
  teardown(): Promise<void>;
}

/** Creates (and migrates) this run's schema and prefix. */
export async function createBenchEnv(): Promise<BenchEnv> {
  const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
  const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
  const suffix = randomBytes(4).toString('hex');
  const schema = `bench_${suffix}`;
  const redisPrefix = `ijbench-${suffix}`;
  const db = createPostgresDb({ connectionString: databaseUrl, maxConnections: 2, applicationName: 'idempotent-jobs:bench' }, () => {});
  await migrate(db, { schema });
  // The effect: one row per execution, no unique constraint, so a second execution would show.
  // created_at is the insert's own time (clock_timestamp), not its transaction's start (now()):
  // the deployed runs take their rates from these stamps, and with group commit many jobs'
  // inserts share one transaction that opened before most of them ran, so now() would stamp
  // the last group's rows early and flatter group commit against one-job transactions.
  await sql`create table ${sql.id(schema, 'bench_effects')} (
              id bigint generated always as identity primary key,
              scope text not null, key text not null, worker text not null,
              created_at timestamptz not null default clock_timestamp())`.execute(db);
  const redis = new Redis(redisUrl, { maxRetriesPerRequest: null });

  const deleteKeys = async (pattern: string) => {
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
      cursor = next;
      if (keys.length > 0) await redis.del(...keys);
    } while (cursor !== '0');
  };

  return {
    databaseUrl,
    redisUrl,
    schema,
    redisPrefix,
    db,
    async resetTables() {
      await sql`truncate ${sql.id(schema, 'bench_effects')}, ${sql.id(schema, 'idempotency_keys')} cascade`.execute(db);
    },
    deleteQueueKeys: (queue) => deleteKeys(`${redisPrefix}:${queue}:*`),
    async teardown() {
      await sql`drop schema if exists ${sql.id(schema)} cascade`.execute(db);
      // The Postgres-backend drains' queues (deployed.ts's queueSchemaOf).
      await sql`drop schema if exists ${sql.id(`${schema}_queue`)} cascade`.execute(db);
      await deleteKeys(`${redisPrefix}:*`);
      redis.disconnect();
      await db.destroy();
    },
  };
}

/**
 * Counts Postgres round trips made by this process: every `pg.Client#query` call is one
 * request/response exchange (node-postgres sends one query at a time per connection, no
 * pipelining). BEGIN and COMMIT are queries too, so they are counted.
 */
export class RoundTripCounter {
  #count = 0;
  #installed = false;

  /** Wraps `pg.Client.prototype.query` once for the whole process. */
  install(): void {
    if (this.#installed) return;
    this.#installed = true;
    const original = pg.Client.prototype.query as (...args: unknown[]) => unknown;
    // eslint-disable-next-line @typescript-eslint/no-this-alias
    const counter = this;
    (pg.Client.prototype as any).query = function (this: unknown, ...args: unknown[]) {
      counter.#count++;
      return original.apply(this, args);
    };
  }

  /** Round trips so far. */
  get count(): number {
    return this.#count;
  }
}
