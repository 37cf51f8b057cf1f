/**
 * `npm run demo`: the docker-compose demo on the local services. Starts three payments
 * workers and a load generator (a few thousand payments, 20% duplicate keys), SIGKILLs one
 * worker mid-run, prints progress, then what each step of the payments did (reserve → charge →
 * ledger → e-mail → completion), where the killed worker's keys stopped and resumed, and a
 * summary. Exits non-zero if any database effect ran twice, a key was lost, a key resumed at
 * another step than the one where it stopped, or an e-mail repeated where no worker died
 * inside the e-mail step.
 *
 * Uses its own schema (`ij_demo`) and Redis prefix (`ijdemo`), recreated at every run.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { sql } from 'kysely';
import { createPostgresDb, loadEnvConfig, runMain } from '../src/index.js';
import { unansweredServices } from '../src/runtime/services-answer.js';
import { formatPaymentReport, paymentReport } from './payment-report.js';

const JOBS = Number(process.env.DEMO_JOBS ?? 3000);
const base = await runMain(() => loadEnvConfig({ QUEUE: 'payments-demo', SCHEMA: 'ij_demo', REDIS_PREFIX: 'ijdemo', ...process.env }));
const unanswered = await unansweredServices(base.DATABASE_URL, base.REDIS_URL);
if (unanswered.length > 0) {
  console.error(
    `The demo needs Postgres and Redis.\n  ${unanswered.join('\n  ')}\n` +
      'Start them with `docker compose up -d postgres redis`, or your distribution\'s packages ' +
      '(Debian/Ubuntu: apt-get install postgresql redis-server), or point DATABASE_URL and REDIS_URL at yours.',
  );
  process.exit(1);
}
const childEnv = {
  ...process.env,
  DATABASE_URL: base.DATABASE_URL,
  REDIS_URL: base.REDIS_URL,
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
const redis = new Redis(base.REDIS_URL, { maxRetriesPerRequest: null });
const queue = new Queue(base.QUEUE, { connection: { url: base.REDIS_URL }, prefix: base.REDIS_PREFIX });
const count = async (query: ReturnType<typeof sql<{ n: string }>>) => Number((await query.execute(db)).rows[0]!.n);

try {
  console.log(
    `demo: ${JOBS} payments (reserve → charge → ledger → e-mail → completion), 20% duplicate keys, 3 workers; ` +
      `Postgres ${base.DATABASE_URL}, Redis ${base.REDIS_URL}`,
  );
  await sql`drop schema if exists ${sql.id(base.SCHEMA)} cascade`.execute(db);
  for (let cursor = '0'; ; ) {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${base.REDIS_PREFIX}:*`, 'COUNT', 1000);
    if (keys.length) await redis.del(...keys);
    if ((cursor = next) === '0') break;
  }
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
    const counts = await queue.getJobCounts('completed', 'failed', 'active', 'wait', 'delayed');
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
  const failedJobs = (await queue.getJobCounts('failed')).failed!;
  const unique = producerSummary!.uniqueKeys!;
  const lost = unique - completedKeys;
  const summary = {
    enqueued: producerSummary!.enqueued,
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
        `where they stopped; ${report.emailRepeats} e-mail${report.emailRepeats === 1 ? '' : 's'} repeated, each where a worker died inside ` +
        `the e-mail step after sending (${inEmail} key${inEmail === 1 ? '' : 's'} stopped inside it); worker pid ${killed} was killed mid-run`,
    );
  }
} finally {
  // A child killed by a signal (the SIGKILLed worker) has exited with exitCode null: only
  // signalCode tells it apart from a running one, whose 'exit' is still to come.
  const running = children.filter((child) => child.exitCode === null && child.signalCode === null);
  for (const child of running) child.kill('SIGTERM');
  await Promise.all(running.map((child) => new Promise((resolve) => child.once('exit', resolve))));
  await queue.close();
  redis.disconnect();
  await db.destroy();
}
