/**
 * The lean baseline, as its own worker process: what a performance-minded user writes without
 * idempotent-jobs. A plain BullMQ `Worker` whose processor takes a client from a plain
 * node-postgres pool and runs BEGIN, the benchmark's one-row insert, COMMIT. At-least-once: a
 * redelivered job inserts its row again. Nothing from this library (or Kysely) is in its hot path.
 *
 * Environment: DATABASE_URL, REDIS_URL, SCHEMA, REDIS_PREFIX, QUEUE, CONCURRENCY (pool size =
 * concurrency: one connection per job in flight, no more); QUEUE_BACKEND=postgres and
 * QUEUE_SCHEMA put the queue in Postgres (BullMQ's PostgreSQL backend, over DATABASE_URL). Prints one JSON line
 * `{"msg":"lean baseline worker ready"}` once it takes jobs; SIGTERM closes it gracefully.
 */
import { Worker, createPostgresBackend, type Job } from 'bullmq';
import pg from 'pg';

const required = (name: string) => {
  const value = process.env[name];
  if (!value) throw new Error(`lean baseline worker: ${name} is not set`);
  return value;
};

const concurrency = Number(required('CONCURRENCY'));
const schema = required('SCHEMA');
const redisUrl = new URL(required('REDIS_URL'));
const workerName = `pid-${process.pid}`;
// The same row as bench-handler.ts's insertEffect, as plain SQL text.
const insertEffect = `insert into ${pg.escapeIdentifier(schema)}.bench_effects (scope, key, worker) values ($1, $2, $3)`;

const pool = new pg.Pool({ connectionString: required('DATABASE_URL'), max: concurrency, application_name: 'idempotent-jobs:bench:lean-baseline' });
// An idle client's error (a Postgres restart, say) must not crash the process; the pool replaces it.
pool.on('error', () => {});

/** The wire format producers use (`toWireJobData`): `{ idempotencyKey, scope, payload }`; the scope defaults to "default". */
interface WireJobData {
  readonly idempotencyKey: string;
  readonly scope?: string;
  /** The benchmark's payload: `sleepMs`, a call to another system before the transaction (bench-handler.ts). */
  readonly payload?: { readonly sleepMs?: number };
}

async function processJob(job: Job<WireJobData>): Promise<null> {
  const callMs = job.data.payload?.sleepMs;
  if (callMs) await new Promise((resolve) => setTimeout(resolve, callMs));
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await client.query(insertEffect, [job.data.scope ?? 'default', job.data.idempotencyKey, workerName]);
    await client.query('COMMIT');
  } catch (error) {
    await client.query('ROLLBACK').catch(() => {});
    throw error;
  } finally {
    client.release();
  }
  return null;
}

const worker =
  process.env.QUEUE_BACKEND === 'postgres'
    ? (new Worker(
        required('QUEUE'),
        processJob as never,
        { connection: { connectionString: required('DATABASE_URL'), schema: required('QUEUE_SCHEMA'), migrate: true }, concurrency },
        createPostgresBackend,
      ) as unknown as Worker<WireJobData>)
    : new Worker<WireJobData>(required('QUEUE'), processJob, {
        connection: { host: redisUrl.hostname, port: Number(redisUrl.port || 6379), maxRetriesPerRequest: null },
        prefix: process.env.REDIS_PREFIX ?? 'bull',
        concurrency,
      });
worker.on('error', (error) => process.stderr.write(`lean baseline worker: ${error.message}\n`));
await worker.waitUntilReady();
process.stdout.write(`${JSON.stringify({ msg: 'lean baseline worker ready', pid: process.pid })}\n`);

let closing = false;
const close = async () => {
  if (closing) return;
  closing = true;
  await worker.close();
  await pool.end();
  process.exit(0);
};
process.on('SIGTERM', close);
process.on('SIGINT', close);
