/**
 * What a schedule costs per tick, as a ratio to enqueuing the same job directly, measured in the
 * same run. Behind docs/benchmarks.md ("Schedules").
 *
 *   npm run bench:schedule-ticks -- [--rounds 5] [--schedules 200]
 *
 * A tick's job is an ordinary keyed job (scope `schedule:<name>`, key the tick's time), so a
 * worker runs it at the cost of any job; what a schedule adds is the scheduler's round: reading
 * the schedules with the database's `now()`, computing the due ticks, and moving each schedule's
 * cursor (one statement per schedule). Measured as one scheduler round over `--schedules`
 * schedules with one due tick each (fresh schedules every round, so no tick is a duplicate)
 * against `IdempotentProducer.enqueue` of as many new keys one after another, as the scheduler
 * enqueues; rounds alternate which goes first. The ratio of the medians is the result.
 *
 * Uses one schema of its own on DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres)
 * and a Redis prefix of its own on REDIS_URL (default redis://127.0.0.1:6379), removed at the end.
 */
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { sql } from 'kysely';
import { pino } from 'pino';
import { IdempotentProducer, Schedules, createPostgresDb, migrate } from '../src/index.js';
import { BullmqTickEnqueuer, Scheduler } from '../src/process/index.js';
import { optionReader } from './support/cli-args.js';
import { formatSpread, spread } from './support/stats.js';

const argv = process.argv.slice(2);
const options = optionReader(argv);
const rounds = options.positive('--rounds', 5);
const count = options.positive('--schedules', 200);
if (argv.length > 0) throw new Error(`unknown arguments: ${argv.join(' ')}`);

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const suffix = randomBytes(3).toString('hex');
const schema = `bench_schedule_ticks_${suffix}`;
const prefix = `bench-schedule-ticks-${suffix}`;
const db = createPostgresDb({ connectionString: databaseUrl, maxConnections: 4, applicationName: 'bench:schedule-ticks' });
const connection = { connection: { url: redisUrl }, prefix };
const schedules = new Schedules({ db, schema });
const enqueuer = new BullmqTickEnqueuer(connection);
const producer = new IdempotentProducer({ ...connection, queue: 'direct' });

/** One scheduler round over `count` fresh schedules, each with one due tick; ticks per second. */
async function tickRound(label: string): Promise<number> {
  for (let n = 0; n < count; n++) await schedules.upsert({ name: `${label}-${n}`, every: 60_000, queue: 'ticks' });
  await sql`update ${sql.id(schema, 'schedules')} set cursor = cursor - interval '1 minute' where name like ${`${label}-%`}`.execute(db);
  const scheduler = new Scheduler({ db, schema, enqueuer, logger: pino({ level: 'silent' }) });
  const started = performance.now();
  const report = await scheduler.runOnce();
  const seconds = (performance.now() - started) / 1000;
  if (report.enqueued !== count || report.duplicates !== 0) throw new Error(`round ${label}: ${report.enqueued} ticks, ${report.duplicates} duplicates; expected ${count} new ones`);
  for (let n = 0; n < count; n++) await schedules.remove(`${label}-${n}`);
  return count / seconds;
}

/** `count` direct enqueues of new keys, one after another; jobs per second. */
async function directRound(label: string): Promise<number> {
  const started = performance.now();
  for (let n = 0; n < count; n++) await producer.enqueue({ name: 'direct', scope: 'bench', key: `${label}-${n}`, data: null });
  return count / ((performance.now() - started) / 1000);
}

try {
  await migrate(db, { schema });
  await tickRound('warm-up');
  await directRound('warm-up');
  const ticks: number[] = [];
  const direct: number[] = [];
  for (let r = 0; r < rounds; r++) {
    if (r % 2 === 0) {
      ticks.push(await tickRound(`t${r}`));
      direct.push(await directRound(`d${r}`));
    } else {
      direct.push(await directRound(`d${r}`));
      ticks.push(await tickRound(`t${r}`));
    }
  }
  const a = spread(ticks);
  const b = spread(direct);
  console.log(`schedule ticks: ${rounds} rounds of ${count} schedules with one due tick each, against ${count} direct enqueues\n`);
  console.log('| path | jobs/s through a scheduler round | jobs/s enqueued directly | ratio |');
  console.log('|---|---|---|---|');
  console.log(`| enqueue (Redis) | ${formatSpread(a)} | ${formatSpread(b)} | ${(a.median / b.median).toFixed(3)} |`);
} finally {
  await enqueuer.close();
  await producer.close();
  const redis = new Redis(redisUrl);
  for (;;) {
    const found = await redis.keys(`${prefix}:*`);
    if (found.length === 0) break;
    await redis.del(...found);
  }
  redis.disconnect();
  await sql`drop schema if exists ${sql.id(schema)} cascade`.execute(db);
  await db.destroy();
}
