/**
 * What one job costs the shared servers, counted by the servers themselves: Redis commands
 * (`INFO commandstats` deltas: executed, script calls included; MONITOR: sent by clients) and Postgres commits and rollbacks (`pg_stat_database` deltas),
 * per job, on the leased path, the fast path, and the fast path with group commit. Behind
 * docs/operations.md ("Many worker hosts").
 *
 *   npm run bench:commands-per-job -- [--jobs 5000] [--concurrency 16]
 *
 * Counting needs servers nobody else uses: a private redis-server on a free port in
 * 15500-15599, and a private database on DATABASE_URL's Postgres (its counters are per
 * database), both removed at the end. Per mode: N jobs are added to a paused queue through
 * IdempotentProducer (the producer's commands per job), one runnable worker process
 * (`bench/support/bench-worker.ts`, the effect is one insert) starts and waits, the counters are
 * read, the queue resumes, and the counters are read again once every key is completed and the
 * worker has stopped (a backend reports its counters at exit). The bench's own statements in
 * the private database (the completion polls) are counted and taken off.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { createServer } from 'node:net';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { sql, type Kysely } from 'kysely';
import { IdempotentProducer, createPostgresDb, migrate } from '../src/index.js';
import { startChild, stopGracefully } from './support/child-process.js';
import { optionReader } from './support/cli-args.js';

const argv = process.argv.slice(2);
const options = optionReader(argv);
const jobs = options.positive('--jobs', 5000);
const concurrency = options.positive('--concurrency', 16);
if (argv.length > 0) throw new Error(`unknown arguments: ${argv.join(' ')}`);

const baseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const suffix = randomBytes(3).toString('hex');
const database = `ij_commands_${suffix}`;
const schema = 'idempotent_jobs';
const prefix = 'ij';
const privateUrl = (() => {
  const url = new URL(baseUrl);
  url.pathname = `/${database}`;
  return url.toString();
})();

const MODES = [
  { name: 'leased', env: {} },
  { name: 'fast path', env: { FAST_PATH: 'true' } },
  { name: 'fast path + group commit', env: { FAST_PATH: 'true', GROUP_COMMIT: 'true' } },
] as const;

/** A free port in 15500-15599 (the range this project's benchmarks use for private servers). */
async function freePort(): Promise<number> {
  for (let port = 15500; port < 15600; port++) {
    const server = createServer();
    const free = await new Promise<boolean>((resolve) => {
      server.once('error', () => resolve(false));
      server.listen(port, '127.0.0.1', () => resolve(true));
    });
    if (free) {
      await new Promise((resolve) => server.close(resolve));
      return port;
    }
  }
  throw new Error('no free port in 15500-15599');
}

async function startRedis(): Promise<{ url: string; process: ChildProcess }> {
  const port = await freePort();
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  for (let attempt = 1; ; attempt++) {
    // A fresh client per attempt: refused until the server listens.
    const probe = new Redis({ port, host: '127.0.0.1', lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0 });
    probe.on('error', () => {});
    try {
      await probe.connect();
      await probe.ping();
      break;
    } catch (error) {
      if (attempt > 50) throw error;
      await new Promise((resolve) => setTimeout(resolve, 100));
    } finally {
      probe.disconnect();
    }
  }
  return { url: `redis://127.0.0.1:${port}`, process: child };
}

/**
 * `INFO commandstats` as calls per command: every command Redis executed, those Lua scripts
 * call included (the work Redis does).
 */
async function commandCalls(redis: Redis): Promise<Map<string, number>> {
  const info = await redis.info('commandstats');
  const calls = new Map<string, number>();
  for (const match of info.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) calls.set(match[1]!, Number(match[2]));
  return calls;
}

/**
 * Counts the commands clients send (a script call once, what crosses the network) with
 * MONITOR, which names a script's own calls' source `lua`. The observer's INFO is left out.
 */
async function clientCommandCounter(redisUrl: string): Promise<{ read(): number; close(): void }> {
  const client = new Redis(redisUrl);
  const monitor = await client.monitor();
  let sent = 0;
  monitor.on('monitor', (_time: string, args: string[], source: string) => {
    if (source !== 'lua' && args[0]?.toLowerCase() !== 'info') sent++;
  });
  return {
    read: () => sent,
    close: () => {
      monitor.disconnect();
      client.disconnect();
    },
  };
}

function delta(after: Map<string, number>, before: Map<string, number>, exclude: readonly string[] = []): Map<string, number> {
  const d = new Map<string, number>();
  for (const [command, calls] of after) {
    if (exclude.includes(command)) continue;
    const n = calls - (before.get(command) ?? 0);
    if (n > 0) d.set(command, n);
  }
  return d;
}

const total = (m: Map<string, number>) => [...m.values()].reduce((a, b) => a + b, 0);
const top = (m: Map<string, number>, perJob: number) =>
  [...m.entries()]
    .sort((a, b) => b[1] - a[1])
    .slice(0, 6)
    .map(([c, n]) => `${c} ${(n / perJob).toFixed(2)}`)
    .join(', ');

/** Commits and rollbacks of the private database so far (read from another database: not counted). */
async function transactions(admin: Kysely<any>): Promise<{ commits: number; rollbacks: number }> {
  const { rows } = await sql<{ c: string; r: string }>`
    select xact_commit as c, xact_rollback as r from pg_stat_database where datname = ${database}`.execute(admin);
  return { commits: Number(rows[0]!.c), rollbacks: Number(rows[0]!.r) };
}

type ClientCounter = Awaited<ReturnType<typeof clientCommandCounter>>;

async function runMode(mode: (typeof MODES)[number], redisUrl: string, admin: Kysely<any>, observer: Redis, sent: ClientCounter): Promise<string[]> {
  const queueName = `cmds-${mode.name.replace(/\W+/g, '-')}`;
  const connection = { url: redisUrl, maxRetriesPerRequest: null };
  const queue = new Queue(queueName, { connection, prefix });
  const producer = new IdempotentProducer({ queue: queueName, connection, prefix });
  await queue.waitUntilReady();
  await producer.queue.waitUntilReady();
  await queue.pause();

  const beforeAdd = await commandCalls(observer);
  const sentBeforeAdd = sent.read();
  for (let start = 0; start < jobs; start += 100) {
    await producer.enqueueBulk(
      Array.from({ length: Math.min(100, jobs - start) }, (_, i) => ({ name: 'charge', scope: queueName, key: `k${start + i}`, data: { n: start + i } })),
    );
  }
  const added = delta(await commandCalls(observer), beforeAdd, ['info']);
  const addedSent = sent.read() - sentBeforeAdd;
  await producer.close();

  const worker = startChild('support/bench-worker.ts', {
    DATABASE_URL: privateUrl,
    REDIS_URL: redisUrl,
    SCHEMA: schema,
    REDIS_PREFIX: prefix,
    QUEUE: queueName,
    CONCURRENCY: String(concurrency),
    MIGRATE: 'false',
    JANITOR_ENABLED: 'false',
    SWEEPER_ENABLED: 'false',
    STATS_INTERVAL_MS: '0',
    LOG_LEVEL: 'warn',
    SHUTDOWN_TIMEOUT_MS: '5000',
    ...mode.env,
  });
  await worker.waitForLine((line) => line.msg === 'bench worker ready');
  const poll = createPostgresDb({ connectionString: privateUrl, maxConnections: 1, applicationName: 'bench:commands-poll' }, () => {});
  let ownTransactions = 0;
  const pgBefore = await transactions(admin);
  const redisBefore = await commandCalls(observer);
  const sentBefore = sent.read();
  const start = performance.now();
  await queue.resume();
  for (;;) {
    ownTransactions++;
    const { rows } = await sql<{ n: string }>`
      select count(*) as n from ${sql.id(schema, 'idempotency_keys')} where scope = ${queueName} and status = 'completed'`.execute(poll);
    if (Number(rows[0]!.n) >= jobs) break;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  const elapsedMs = performance.now() - start;
  // BullMQ moves a job to completed after the key's commit; let the last ones land.
  await new Promise((resolve) => setTimeout(resolve, 500));
  const worked = delta(await commandCalls(observer), redisBefore, ['info', 'monitor']);
  const workedSent = sent.read() - sentBefore;
  await stopGracefully(worker);
  await poll.destroy();
  // Backends report their counters at exit; give the stats system a moment.
  await new Promise((resolve) => setTimeout(resolve, 1500));
  const pgAfter = await transactions(admin);
  await queue.obliterate({ force: true });
  await queue.close();
  const commits = pgAfter.commits - pgBefore.commits - ownTransactions;
  const rollbacks = pgAfter.rollbacks - pgBefore.rollbacks;
  console.log(
    `${mode.name}: ${jobs} jobs in ${(elapsedMs / 1000).toFixed(1)} s; producer: ${(addedSent / jobs).toFixed(2)} sent, ${(total(added) / jobs).toFixed(2)} executed Redis commands/job (${top(added, jobs)}); ` +
      `worker: ${(workedSent / jobs).toFixed(2)} sent, ${(total(worked) / jobs).toFixed(2)} executed Redis commands/job (${top(worked, jobs)}); ` +
      `Postgres ${(commits / jobs).toFixed(3)} commits/job, ${(rollbacks / jobs).toFixed(3)} rollbacks/job`,
  );
  const perJob = (n: number, digits = 2) => (n / jobs).toFixed(digits);
  return [mode.name, perJob(addedSent), perJob(total(added)), perJob(workedSent), perJob(total(worked)), perJob(commits, 3), perJob(rollbacks, 3), (jobs / (elapsedMs / 1000)).toFixed(0)];
}

async function main(): Promise<void> {
  const admin = createPostgresDb({ connectionString: baseUrl, maxConnections: 1, applicationName: 'bench:commands-per-job' }, () => {});
  const redisServer = await startRedis();
  const observer = new Redis(redisServer.url);
  const sent = await clientCommandCounter(redisServer.url);
  await sql`create database ${sql.id(database)}`.execute(admin);
  try {
    const setup = createPostgresDb({ connectionString: privateUrl, maxConnections: 1 }, () => {});
    await migrate(setup, { schema });
    await sql`create table ${sql.id(schema, 'bench_effects')} (
                id bigint generated always as identity primary key,
                scope text not null, key text not null, worker text not null,
                created_at timestamptz not null default clock_timestamp())`.execute(setup);
    await setup.destroy();
    console.log(`commands per job: ${jobs} jobs per mode, one worker process at CONCURRENCY=${concurrency}, private redis-server at ${redisServer.url}, private database ${database}`);
    const rows: string[][] = [];
    for (const mode of MODES) rows.push(await runMode(mode, redisServer.url, admin, observer, sent));
    console.log('\n| mode | producer: Redis commands sent/job | executed/job | worker: Redis commands sent/job | executed/job | Postgres commits/job | rollbacks/job | jobs/s (1 process, noisy) |');
    console.log('|---|---|---|---|---|---|---|---|');
    for (const row of rows) console.log(`| ${row.join(' | ')} |`);
  } finally {
    observer.disconnect();
    sent.close();
    redisServer.process.kill('SIGTERM');
    await once(redisServer.process, 'exit');
    await sql`drop database if exists ${sql.id(database)} with (force)`.execute(admin);
    await admin.destroy();
  }
}

await main();
