/**
 * Deployed runs: every contender is its own worker process, started the way its users start
 * it, and the rate is read from the effects' database timestamps.
 *
 * One drain: a paused queue is filled with N unique jobs, the contender's process is started
 * and waited for (it shows up among the queue's BullMQ workers), the queue is resumed, and
 * when all N jobs are completed the process is stopped with SIGTERM. The rate is
 * (rows − 1) / (last row's created_at − first row's created_at): the span of the effects
 * themselves, so process start-up, queue polling and shutdown are outside it on every side.
 * The CPU the drain cost (worker process, its Postgres backends, Redis; see drain-cpu.ts) is
 * read from /proc just before the queue is resumed and just after the last job completed,
 * before the process is stopped.
 *
 * Contenders: `lean` is lean-baseline-worker.ts (plain BullMQ + node-postgres, BEGIN/insert/
 * COMMIT); the others are `node bin/idempotent-jobs.js worker --handler deployed-handler.ts`
 * with the environment a user would set, from this checkout or another one (for A/B runs), and
 * `database-only` the same worker with deployed-database-only-handler.ts (the `{ transaction }`
 * form) and no environment: its defaults.
 */
import { randomBytes } from 'node:crypto';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Queue, createPostgresBackend } from 'bullmq';
import { sql } from 'kysely';
import type { BenchEnv } from './bench-env.js';
import { sleep } from './bench-handler.js';
import { startBinScript, startChild, stopGracefully, type BenchChild } from './child-process.js';
import { redisServerPid, startDrainCpuMeter, type DrainCpu } from './drain-cpu.js';
import { fillQueue, redisConnection, withTimeout } from './throughput.js';

/** The idempotent-jobs contenders and the environment that selects each (everything else: defaults). */
export const CLI_WORKER_SETTINGS = {
  /** The default configuration: leased path, one job per effect transaction. */
  leased: {},
  'fast-path': { FAST_PATH: 'true' },
  'leased-group': { GROUP_COMMIT: 'true' },
  'fast-path-group': { FAST_PATH: 'true', GROUP_COMMIT: 'true' },
  /** The database-only handler (`{ transaction }`) with its defaults: the fast path with group commit. */
  'database-only': {},
} as const satisfies Record<string, Record<string, string>>;

/** The handler module each CLI contender's worker loads: the function form, except `database-only`. */
export function handlerModuleOf(contender: keyof typeof CLI_WORKER_SETTINGS): string {
  return contender === 'database-only' ? DATABASE_ONLY_HANDLER_MODULE : HANDLER_MODULE;
}

/** How a contender's worker is set up, for tables: its environment, and its handler's form when not a function. */
export function describeContender(contender: DeployedContender): string {
  if (contender === 'lean') return '(plain BullMQ + pg)';
  const settings = Object.entries(CLI_WORKER_SETTINGS[contender]).map(([k, v]) => `${k}=${v}`).join(' ') || '(defaults)';
  return contender === 'database-only' ? `${settings}, handler { transaction }` : settings;
}

/** Who drains the queue: the lean baseline, or the CLI worker in one of its configurations. */
export type DeployedContender = 'lean' | keyof typeof CLI_WORKER_SETTINGS;

/** Every contender name, for parsing specs. */
export const DEPLOYED_CONTENDERS: readonly DeployedContender[] = ['lean', ...(Object.keys(CLI_WORKER_SETTINGS) as Array<keyof typeof CLI_WORKER_SETTINGS>)];

/** Parameters of one deployed drain. */
export interface DeployedSpec {
  readonly contender: DeployedContender;
  readonly concurrency: number;
  readonly n: number;
  /**
   * The checkout whose `bin/idempotent-jobs.js` runs the CLI contenders (the handler module
   * and the lean baseline always come from this checkout). @defaultValue this checkout
   */
  readonly workerCheckout?: string;
  /** More environment for the worker process, e.g. `{ GROUP_COMMIT_GROUPS: '2' }`. */
  readonly extraEnv?: Readonly<Record<string, string>>;
  /**
   * The worker process's `DATABASE_URL`, e.g. a PgBouncer in front of the bench's Postgres; its
   * `DATABASE_DIRECT_URL` is then the bench's Postgres. The effects are counted there either way.
   * @defaultValue the bench's Postgres
   */
  readonly databaseUrl?: string;
  /**
   * Where the queue is: Redis, or Postgres (BullMQ's PostgreSQL backend, schema
   * `<bench schema>_queue` of the bench's database; the contender gets QUEUE_BACKEND=postgres).
   * @defaultValue `'redis'`
   */
  readonly queueBackend?: 'redis' | 'postgres';
  /**
   * Each job first waits this long outside its transaction, standing in for a call to another
   * system (a payment provider): the handler's `sleepMs`, which the lean baseline honours too.
   * @defaultValue `0`
   */
  readonly callMs?: number;
}

/** One measured deployed drain. */
export interface DeployedRun {
  readonly contender: DeployedContender;
  readonly concurrency: number;
  readonly n: number;
  readonly workerCheckout: string;
  readonly extraEnv: Readonly<Record<string, string>>;
  readonly queueBackend: 'redis' | 'postgres';
  /** (effects − 1) / (last − first effect's created_at). */
  readonly jobsPerSec: number;
  /** From the first effect's created_at to the last's. */
  readonly effectSpanMs: number;
  /** From resuming the queue until all jobs were seen completed (polled every 50 ms; includes the first fetches). */
  readonly wallMs: number;
  /** From spawning the process until the queue listed it as a worker. */
  readonly startupMs: number;
  readonly effects: number;
  readonly failedJobs: number;
  /** How the process ended after SIGTERM: its exit code, or the signal. */
  readonly exit: number | string;
  /** CPU time of the worker, its Postgres backends and Redis from the queue's resume to the last completion. */
  readonly cpu: DrainCpu;
}

/** This checkout's root. */
export const THIS_CHECKOUT = fileURLToPath(new URL('../../', import.meta.url)).replace(/\/$/, '');
const HANDLER_MODULE = fileURLToPath(new URL('./deployed-handler.ts', import.meta.url));
const DATABASE_ONLY_HANDLER_MODULE = fileURLToPath(new URL('./deployed-database-only-handler.ts', import.meta.url));
const DRAIN_TIMEOUT_MS = 15 * 60_000;
const STARTUP_TIMEOUT_MS = 60_000;
const POLL_MS = 50;

/**
 * Runs one drain and cleans up after it (process, queue keys, tables). Throws if a job
 * failed, the process died, or the effects are not exactly one row per job.
 */
export async function runDeployedDrain(env: BenchEnv, spec: DeployedSpec): Promise<DeployedRun> {
  const { contender, concurrency, n } = spec;
  const workerCheckout = resolve(spec.workerCheckout ?? THIS_CHECKOUT);
  const extraEnv = spec.extraEnv ?? {};
  const queueName = `dp-${contender}-${randomBytes(3).toString('hex')}`;
  const queueBackend = spec.queueBackend ?? 'redis';
  const queue =
    queueBackend === 'postgres'
      ? (new Queue(queueName, { connection: { connectionString: env.databaseUrl, schema: queueSchemaOf(env), migrate: true } }, createPostgresBackend) as unknown as Queue)
      : new Queue(queueName, { connection: redisConnection(env.redisUrl), prefix: env.redisPrefix });
  let child: BenchChild | undefined;
  try {
    const redisPid = queueBackend === 'redis' ? await redisServerPid(env.redisUrl) : undefined;
    // `JOB_CONCURRENCY_LIMIT=<n>` in a spec's environment: every job names one concurrency key of that limit.
    const limit = extraEnv.JOB_CONCURRENCY_LIMIT;
    await fillQueue(queue, n, 0, spec.callMs ? { sleepMs: spec.callMs } : {}, limit ? { concurrencyKey: 'tenant:bench', concurrencyLimit: Number(limit) } : {});
    const spawnedAt = performance.now();
    child = startContender(env, queueName, { ...spec, workerCheckout, extraEnv, queueBackend });
    await waitUntilListed(queue, child);
    const startupMs = performance.now() - spawnedAt;

    const cpuMeter = startDrainCpuMeter({ workerPid: child.pid, db: env.db, redisPid, connectsDirectly: spec.databaseUrl === undefined });
    const resumedAt = performance.now();
    await queue.resume();
    await withTimeout(waitUntilDrained(queue, child, n), DRAIN_TIMEOUT_MS, `${contender} c ${concurrency}: draining ${n} jobs`);
    const wallMs = performance.now() - resumedAt;
    // Before the stop: a process's /proc entry goes when it exits.
    const cpu = await cpuMeter.finish();
    const exit = await stopGracefully(child);

    const { effects, spanMs } = await effectSpan(env);
    if (effects !== n) throw new Error(`${contender} c ${concurrency}: ${effects} effect rows for ${n} jobs (expected exactly one each)`);
    return {
      contender,
      concurrency,
      n,
      workerCheckout,
      extraEnv,
      queueBackend,
      jobsPerSec: ((effects - 1) / spanMs) * 1000,
      effectSpanMs: spanMs,
      wallMs,
      startupMs,
      effects,
      failedJobs: 0,
      exit,
      cpu,
    };
  } finally {
    await child?.stop();
    if (queueBackend === 'postgres') await queue.obliterate({ force: true });
    await queue.close();
    if (queueBackend === 'redis') await env.deleteQueueKeys(queueName);
    await env.resetTables();
  }
}

/** The schema the Postgres-backend drains keep their queues in (dropped with the bench's own). */
export function queueSchemaOf(env: BenchEnv): string {
  return `${env.schema}_queue`;
}

/** Spawns the contender's process; the CLI contenders get the environment a deployment sets. */
function startContender(env: BenchEnv, queueName: string, spec: DeployedSpec & { workerCheckout: string; extraEnv: Readonly<Record<string, string>> }): BenchChild {
  const common = {
    DATABASE_URL: spec.databaseUrl ?? env.databaseUrl,
    DATABASE_DIRECT_URL: env.databaseUrl,
    REDIS_URL: env.redisUrl,
    SCHEMA: env.schema,
    REDIS_PREFIX: env.redisPrefix,
    QUEUE: queueName,
    CONCURRENCY: String(spec.concurrency),
    ...(spec.queueBackend === 'postgres' ? { QUEUE_BACKEND: 'postgres', QUEUE_SCHEMA: queueSchemaOf(env) } : {}),
  };
  if (spec.contender === 'lean') return startChild('support/lean-baseline-worker.ts', { ...common, ...spec.extraEnv });
  const cliEnv = {
    ...common,
    // The bench created and migrated the schema; a worker of another checkout must not migrate it its way.
    MIGRATE: 'false',
    // Per-job info lines would measure pino, not the worker; the lean baseline logs nothing either.
    LOG_LEVEL: 'warn',
    ...CLI_WORKER_SETTINGS[spec.contender],
    ...spec.extraEnv,
  };
  const bin = resolve(spec.workerCheckout, 'bin/idempotent-jobs.js');
  const args = ['worker', '--handler', handlerModuleOf(spec.contender), '--queue', queueName, '--concurrency', String(spec.concurrency)];
  return startBinScript(bin, args, cliEnv, spec.workerCheckout);
}

/**
 * Waits until the queue lists a worker (BullMQ names each worker's Redis connection after its
 * queue): the CLI prints no ready line below LOG_LEVEL info, and this works for any BullMQ
 * worker process without a benchmark hook in it.
 */
async function waitUntilListed(queue: Queue, child: BenchChild): Promise<void> {
  const deadline = performance.now() + STARTUP_TIMEOUT_MS;
  while ((await queue.getWorkers()).length === 0) {
    assertRunning(child, 'before it took jobs');
    if (performance.now() > deadline) throw new Error(`pid ${child.pid}: not listed as a worker of ${queue.name} within ${STARTUP_TIMEOUT_MS} ms. ${output(child)}`);
    await sleep(POLL_MS);
  }
}

/** Polls the queue's counts until `n` jobs completed; a failed job or a dead process ends the drain with an error. */
async function waitUntilDrained(queue: Queue, child: BenchChild, n: number): Promise<void> {
  for (;;) {
    const counts = await queue.getJobCounts('completed', 'failed');
    if ((counts.failed ?? 0) > 0) {
      const [job] = await queue.getFailed(0, 0);
      throw new Error(`${queue.name}: ${counts.failed} jobs failed, e.g. ${job?.id}: ${job?.failedReason}`);
    }
    if ((counts.completed ?? 0) >= n) return;
    assertRunning(child, `with ${counts.completed}/${n} jobs completed`);
    await sleep(POLL_MS);
  }
}

/** The effects' row count and the span of their timestamps, in ms. */
async function effectSpan(env: BenchEnv): Promise<{ effects: number; spanMs: number }> {
  const { rows } = await sql<{ effects: string; span_ms: string | null }>`
    select count(*) as effects, extract(epoch from max(created_at) - min(created_at)) * 1000 as span_ms
    from ${sql.id(env.schema, 'bench_effects')}`.execute(env.db);
  return { effects: Number(rows[0]?.effects ?? 0), spanMs: Number(rows[0]?.span_ms ?? NaN) };
}

function assertRunning(child: BenchChild, when: string): void {
  const { exitCode, signalCode } = child.process;
  if (exitCode !== null || signalCode !== null) throw new Error(`pid ${child.pid} exited (${exitCode ?? signalCode}) ${when}. ${output(child)}`);
}

/** What a failed child said: its stderr and its last log lines (pino writes warnings and errors to stdout). */
function output(child: BenchChild): string {
  const lines = child.lines.slice(-5).map((line) => JSON.stringify(line));
  return `stderr: ${child.stderrTail() || '(empty)'}; last log lines: ${lines.join(' ') || '(none)'}`;
}
