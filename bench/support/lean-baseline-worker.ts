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
 *
 * `LEAN_PROTOCOL=keyed`: the claim protocol written by hand, for a reference of what the shape
 * costs without this library's code: the key claimed in the keys table with one autocommit
 * `insert … on conflict do nothing` (durable before the transaction, as a leased claim must be;
 * a key with a row is skipped, the job replayed), then BEGIN, the insert, the fenced completion
 * (one `update` of the key's row), COMMIT. No batching, no group commit, no lease heartbeat, no
 * takeover; both statements named (prepared once per connection, as a performance-minded user
 * would): the least Node and Postgres work the protocol's statements can cost.
 */
import { randomUUID } from 'node:crypto';
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

const keyed = process.env.LEAN_PROTOCOL === 'keyed';
const keysTable = `${pg.escapeIdentifier(schema)}.idempotency_keys`;
const claimKey =
  `insert into ${keysTable} (scope, key, fingerprint, status, owner, locked_until, job_id) ` +
  `values ($1, $2, $3, 'processing', $4, now() + interval '30 seconds', $5) on conflict do nothing returning fence`;
const completeKey =
  `update ${keysTable} set status = 'completed', locked_until = null, completed_at = now(), updated_at = now(), ` +
  `expires_at = now() + interval '1 day' where scope = $1 and key = $2 and owner = $3 and fence = $4 and status = 'processing'`;

async function processJob(job: Job<WireJobData>): Promise<null> {
  const callMs = job.data.payload?.sleepMs;
  const scope = job.data.scope ?? 'default';
  const key = job.data.idempotencyKey;
  const owner = keyed ? randomUUID() : undefined;
  if (keyed) {
    const claimed = await pool.query({ name: 'lean-claim-key', text: claimKey, values: [scope, key, 'bench', owner, job.id ?? null] });
    if (claimed.rowCount === 0) return null;
  }
  if (callMs) await new Promise((resolve) => setTimeout(resolve, callMs));
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await client.query(insertEffect, [scope, key, workerName]);
    if (keyed && (await client.query({ name: 'lean-complete-key', text: completeKey, values: [scope, key, owner, 1] })).rowCount !== 1) {
      throw new Error(`key ${key}: lease lost`);
    }
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
