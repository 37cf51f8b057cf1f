/**
 * Measurements behind docs/operations.md: leased claims + completions per second on one
 * Postgres, bytes per key, the cost of the statistics query, and janitor throughput (one and
 * several instances). Uses its own schema, dropped at the end.
 *
 *   node --import tsx bench/operations-measure.ts [rows]        (default 1,000,000 rows)
 *
 * DATABASE_URL defaults to postgres://postgres@127.0.0.1:5432/postgres, REDIS_URL to
 * redis://127.0.0.1:6379 (only keys under a fresh prefix are written, and deleted after).
 */
import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { pino } from 'pino';
import { Redis } from 'ioredis';
import { IdempotencyKeys, IdempotentProducer, createPostgresDb, migrate } from '../src/index.js';
import { Janitor } from '../src/process/index.js';
import { PostgresOperatorStore } from '../src/store/operator-store.js';

const rows = Number(process.argv[2] ?? 1_000_000);
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const schema = `ops_measure_${randomBytes(3).toString('hex')}`;
const db = createPostgresDb({ connectionString: databaseUrl, maxConnections: 6 });
const silent = pino({ level: 'silent' });
const table = sql.id(schema, 'idempotency_keys');

async function timed<T>(fn: () => Promise<T>): Promise<[T, number]> {
  const start = performance.now();
  const value = await fn();
  return [value, performance.now() - start];
}

/** Inserts `count` completed keys shaped like production ones; `expiredShare` of them past expires_at. */
async function fill(count: number, expiredShare: number): Promise<void> {
  const chunk = 200_000;
  for (let from = 1; from <= count; from += chunk) {
    const to = Math.min(count, from + chunk - 1);
    await sql`
      insert into ${table} (scope, key, fingerprint, status, owner, fence, attempts, result, job_id, queue, job_name,
                            created_at, updated_at, completed_at, expires_at)
      select 'tenant-' || (n % 100), 'order-' || n, encode(sha256(n::text::bytea), 'hex'), 'completed',
             gen_random_uuid(), 1, 1, jsonb_build_object('receipt', 'r-' || n, 'cents', 1999),
             'ij_' || substr(md5(n::text), 1, 32), 'payments', 'charge', now(), now(), now(),
             case when n <= ${Math.round(count * expiredShare)} then now() - interval '1 minute' else now() + interval '1 day' end
        from generate_series(${from}::bigint, ${to}::bigint) as n`.execute(db);
  }
  await sql`analyze ${table}`.execute(db);
}

async function sizes() {
  const { rows: r } = await sql<{ heap: string; indexes: string; total: string; n: string }>`
    select pg_table_size(${`${schema}.idempotency_keys`}::regclass) as heap,
           pg_indexes_size(${`${schema}.idempotency_keys`}::regclass) as indexes,
           pg_total_relation_size(${`${schema}.idempotency_keys`}::regclass) as total,
           (select count(*) from ${table}) as n`.execute(db);
  const { heap, indexes, total, n } = r[0]!;
  return { rows: Number(n), heapBytesPerRow: Number(heap) / Number(n), indexBytesPerRow: Number(indexes) / Number(n), totalBytesPerRow: Number(total) / Number(n) };
}

/** Redis memory of waiting jobs as IdempotentProducer adds them (MEMORY USAGE of every key under a fresh prefix). */
async function redisBytesPerJob(count: number): Promise<number> {
  const prefix = `ops-measure-${randomBytes(3).toString('hex')}`;
  const producer = new IdempotentProducer({ queue: 'payments', connection: { url: redisUrl }, prefix });
  const redis = new Redis(redisUrl);
  try {
    for (let from = 0; from < count; from += 500) {
      await producer.enqueueBulk(
        Array.from({ length: Math.min(500, count - from) }, (_, i) => ({
          name: 'charge',
          scope: 'tenant-1',
          key: `order-${from + i}`,
          data: { orderId: from + i, cents: 1999, currency: 'EUR' },
        })),
      );
    }
    let bytes = 0;
    let cursor = '0';
    do {
      const [next, found] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
      cursor = next;
      for (const key of found) bytes += Number(await redis.memory('USAGE', key));
      if (found.length > 0) await redis.del(...found);
    } while (cursor !== '0');
    return bytes / count;
  } finally {
    await producer.close();
    redis.disconnect();
  }
}

async function main() {
  console.log(`redis: ${(await redisBytesPerJob(5_000)).toFixed(0)} bytes per waiting job (small payload, 5,000 jobs)`);
  await migrate(db, { schema });
  try {
    // Leased claim + fenced completion (two transactions per key), 16 at a time, like one
    // worker process at CONCURRENCY=16 whose handler does nothing.
    const keys = new IdempotencyKeys({ db, schema });
    const claims = 10_000;
    let next = 0;
    const [, claimMs] = await timed(() =>
      Promise.all(
        Array.from({ length: 5 }, async () => {
          while (next < claims) {
            const n = next++;
            const outcome = await keys.claim('bench', `k-${n}`, keys.fingerprint({ n }));
            if (outcome.kind !== 'claimed') throw new Error(outcome.kind);
            await keys.runEffect(outcome, async () => ({ n }));
          }
        }),
      ),
    );
    console.log(`claim + complete: ${claims} keys in ${Math.round(claimMs)} ms = ${Math.round(claims / (claimMs / 1000))} keys/s (5 connections)`);
    await sql`truncate ${table} cascade`.execute(db);

    const [, fillMs] = await timed(() => fill(rows, 0.5));
    console.log(`filled ${rows} completed keys (half expired) in ${Math.round(fillMs)} ms`);
    const size = await sizes();
    console.log(
      `size: ${size.totalBytesPerRow.toFixed(0)} bytes/key total (heap ${size.heapBytesPerRow.toFixed(0)}, indexes ${size.indexBytesPerRow.toFixed(0)})`,
    );

    const statTimes: number[] = [];
    for (let i = 0; i < 3; i++) statTimes.push((await timed(() => new PostgresOperatorStore(db, schema).keyStats()))[1]);
    console.log(`stats query over ${rows} keys: ${statTimes.map((t) => Math.round(t)).join(', ')} ms (3 runs)`);

    const expired = Math.round(rows * 0.5);
    const half = Math.round(expired / 2);
    // One janitor deletes the first half of the expired keys…
    const one = new Janitor({ db, schema, batchSize: 1000, maxBatchesPerRun: Math.ceil(half / 1000), logger: silent });
    const [r1, t1] = await timed(() => one.runOnce());
    console.log(`1 janitor, batch 1000: ${r1.keysDeleted} keys in ${Math.round(t1)} ms = ${Math.round(r1.keysDeleted / (t1 / 1000))} keys/s`);
    // …four at once delete the rest.
    const four = Array.from({ length: 4 }, () => new Janitor({ db, schema, batchSize: 1000, maxBatchesPerRun: 10_000, logger: silent }));
    const [r4, t4] = await timed(() => Promise.all(four.map((j) => j.runOnce())));
    const deleted4 = r4.reduce((sum, r) => sum + r.keysDeleted, 0);
    console.log(`4 janitors at once, batch 1000: ${deleted4} keys in ${Math.round(t4)} ms = ${Math.round(deleted4 / (t4 / 1000))} keys/s`);
    console.log(`expired keys deleted in total: ${r1.keysDeleted + deleted4} of ${expired}`);

    const [, vacuumMs] = await timed(() => sql`vacuum ${table}`.execute(db));
    const after = await sizes();
    console.log(`after vacuum (${Math.round(vacuumMs)} ms): ${after.rows} keys, table size unchanged until reused: ${after.totalBytesPerRow.toFixed(0)} bytes/remaining key`);
  } finally {
    await sql`drop schema ${sql.id(schema)} cascade`.execute(db);
    await db.destroy();
  }
}

await main();
