/**
 * A worker with group commit and the fast path, timed against a plain BullMQ worker doing the
 * same insert, in one run: `tsx run.ts [jobs] [rounds]`. Each round enqueues the jobs, drains
 * them with one worker, then the other (alternating, so both see the same machine load), and
 * prints jobs/s for each and their ratio. Group commit puts up to 32 jobs' effects and keys in
 * one transaction, their effects sent together; the fast path needs no lease (the effect touches
 * only Postgres).
 */
import { Worker } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { IdempotencyKeys, IdempotentProducer, createIdempotentWorker, createPostgresDb, migrate } from 'idempotent-jobs';
import { loadEnvConfig } from 'idempotent-jobs/process';

const [jobs = 2000, rounds = 3] = process.argv.slice(2).map(Number);
const config = loadEnvConfig();
const connection = { url: config.REDIS_URL };
const db = createPostgresDb({ connectionString: config.DATABASE_URL, maxConnections: 8 });
await migrate(db, { schema: config.SCHEMA });
const events = sql.id(config.SCHEMA, 'events');
await sql`create table if not exists ${events} (worker text not null, key text not null, primary key (worker, key))`.execute(db);
const insertEvent = (tx: typeof db, worker: string, key: string) => sql`insert into ${events} (worker, key) values (${worker}, ${key})`.execute(tx);

/** Enqueues `jobs` jobs on `queue`, drains them with `start(onDone)` and returns jobs/s. */
async function drain(queue: string, round: number, start: (onDone: () => void) => { close(): Promise<void> }): Promise<number> {
  const producer = new IdempotentProducer({ queue, connection, prefix: config.REDIS_PREFIX, defaultJobOptions: { removeOnComplete: true } });
  const batch = Array.from({ length: jobs }, (_, i) => ({ name: 'event', key: `r${round}-${i}`, data: { i } }));
  for (let i = 0; i < jobs; i += 500) await producer.enqueueBulk(batch.slice(i, i + 500));
  await producer.close();
  let done = 0;
  let finished!: () => void;
  const allDone = new Promise<void>((resolve) => (finished = resolve));
  const began = performance.now();
  const worker = start(() => ++done === jobs && finished());
  await allDone;
  const perSecond = jobs / ((performance.now() - began) / 1000);
  await worker.close();
  return perSecond;
}

const keys = new IdempotencyKeys({ db, schema: config.SCHEMA, groupCommit: true });
const idempotent = (round: number) =>
  drain('events-idempotent', round, (onDone) => {
    const worker = createIdempotentWorker({
      queue: 'events-idempotent', connection, prefix: config.REDIS_PREFIX, keys, concurrency: 32, fastPath: true,
      logger: pino({ level: config.LOG_LEVEL }),
      handler: (ctx) => ctx.transaction((tx) => insertEvent(tx, 'idempotent', ctx.key).then(() => null)),
    });
    worker.on('event', (event) => event.kind === 'completed' && onDone());
    return worker;
  });
// The baseline: at least once, the same insert in its own transaction.
const plain = (round: number) =>
  drain('events-plain', round, (onDone) => {
    const worker = new Worker('events-plain', (job) => db.transaction().execute((tx) => insertEvent(tx, 'plain', job.data.idempotencyKey).then(() => null)), { connection, prefix: config.REDIS_PREFIX, concurrency: 32 });
    worker.on('completed', onDone);
    return worker;
  });

for (let round = 1; round <= rounds; round++) {
  const fast = await idempotent(round);
  const bare = await plain(round);
  console.log(JSON.stringify({ round, jobs, groupCommitFastPathPerSecond: Math.round(fast), plainBullmqPerSecond: Math.round(bare), ratio: +(fast / bare).toFixed(2) }));
}
await db.destroy();
