/**
 * Per-test-file isolation: a Postgres schema and a Redis key prefix of the file's own, both
 * removed afterwards. Nothing outside them is touched (no FLUSHDB, no DROP of shared objects).
 * In a run without Redis (./redis-files.ts) the prefix is not cleaned and `openRedis` refuses.
 */
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import type { Kysely } from 'kysely';
import { sql } from 'kysely';
import { inject } from 'vitest';
import { createPostgresDb } from '../../src/store/create-postgres-db.js';
import { migrate } from '../../src/store/migrate.js';

export interface TestEnv {
  /** Where the store's pools connect: Postgres, or the run's PgBouncer (`TEST_PGBOUNCER=1`). */
  readonly databaseUrl: string;
  /** Postgres itself, for sessions: migrations, advisory locks, LISTEN (`DATABASE_DIRECT_URL` of child processes). */
  readonly databaseDirectUrl: string;
  readonly redisUrl: string;
  /**
   * Whether pools over {@link databaseUrl} may name the store's statements (`preparedStatements`
   * of `createPostgresDb`): not through the run's PgBouncer, whose version keeps no prepared
   * statements in transaction mode (the rule of `PG_PREPARED_STATEMENTS`'s default).
   */
  readonly preparedStatements: boolean;
  /** Hash partitions of this file's keys table (`TEST_KEYS_PARTITIONS`); 0: one plain table. */
  readonly keysPartitions: number;
  /** This file's Postgres schema (idempotency tables live here). */
  readonly schema: string;
  /** This file's BullMQ prefix / Redis key prefix. */
  readonly redisPrefix: string;
  /** A Kysely instance for the file (pool of 20). */
  readonly db: Kysely<any>;
  /** Opens another Kysely instance the env will close at teardown. */
  openDb(maxConnections?: number): Kysely<any>;
  /** An ioredis connection the env will close at teardown. */
  openRedis(options?: { maxRetriesPerRequest?: number | null }): Redis;
  /** Drops the schema, deletes the prefix's Redis keys, closes every pool and connection. */
  teardown(): Promise<void>;
}

/** Creates the schema (migrated) and prefix for one test file; `keysPartitions` overrides the run's `TEST_KEYS_PARTITIONS`. */
export async function createTestEnv(name: string, options: { keysPartitions?: number } = {}): Promise<TestEnv> {
  const databaseUrl = inject('databaseUrl');
  const databaseDirectUrl = inject('databaseDirectUrl');
  const redisUrl = inject('redisUrl');
  const redisMissing = inject('redisMissing');
  const keysPartitions = options.keysPartitions ?? inject('keysPartitions');
  const suffix = randomBytes(4).toString('hex');
  const schema = `t_${name.replace(/[^a-z0-9]/gi, '_').toLowerCase()}_${suffix}`.slice(0, 63);
  const redisPrefix = `ijtest-${name}-${suffix}`;
  const dbs: Kysely<any>[] = [];
  const redises: Redis[] = [];

  const preparedStatements = databaseUrl === databaseDirectUrl;
  const openDb = (maxConnections = 20) => {
    const db = createPostgresDb({ connectionString: databaseUrl, maxConnections, applicationName: `test:${name}`, preparedStatements }, () => {});
    dbs.push(db);
    return db;
  };
  const db = openDb();
  // The migrations' advisory lock needs a session: Postgres itself, not the pooler.
  const directDb = databaseDirectUrl === databaseUrl ? db : createPostgresDb({ connectionString: databaseDirectUrl, maxConnections: 1, applicationName: `test:${name}` }, () => {});
  if (directDb !== db) dbs.push(directDb);
  await migrate(directDb, { schema, keysPartitions });

  return {
    databaseUrl,
    databaseDirectUrl,
    preparedStatements,
    redisUrl,
    keysPartitions,
    schema,
    redisPrefix,
    db,
    openDb,
    openRedis(options = {}) {
      // A file that runs in a run without Redis was not marked as needing it (./redis-files.ts).
      if (redisMissing !== '') {
        throw new Error(`test file "${name}" uses Redis, which this run does not have (${redisMissing}): mark the file \`// @module-tag redis\``);
      }
      const redis = new Redis(redisUrl, { maxRetriesPerRequest: options.maxRetriesPerRequest ?? null });
      redises.push(redis);
      return redis;
    },
    async teardown() {
      await dropSchema(db, schema);
      if (redisMissing === '') {
        const cleaner = new Redis(redisUrl);
        try {
          await deleteKeysWithPrefix(cleaner, redisPrefix);
        } finally {
          cleaner.disconnect();
        }
      }
      for (const redis of redises) redis.disconnect();
      for (const each of dbs) await each.destroy();
    },
  };
}

/** Deletes only keys under `prefix` (SCAN, never FLUSHDB). */
export async function deleteKeysWithPrefix(redis: Redis, prefix: string): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) await redis.del(...keys);
  } while (cursor !== '0');
}

/**
 * Drops the file's schema. A statement of a worker closed with `force` may still be finishing
 * (a slot's release, a heartbeat), and the drop, which locks every object of the schema, can
 * deadlock with it: Postgres then cancels one of the two, and the drop is tried again.
 */
async function dropSchema(db: Kysely<any>, schema: string): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await sql`drop schema if exists ${sql.id(schema)} cascade`.execute(db);
      return;
    } catch (error) {
      if ((error as { code?: unknown }).code !== '40P01' || attempt >= 5) throw error;
      await new Promise((resolve) => setTimeout(resolve, 100 * attempt));
    }
  }
}
