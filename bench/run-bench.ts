/**
 * `npm run bench`: what exactly-once costs against plain BullMQ, every comparison in one run.
 *
 * Usage: `tsx bench/run-bench.ts [--quick] [--reps N] [--n N] [--only a,b] [--tag name] [--ablation]`
 * Sections: deployed (the CLI worker process in its configurations against the lean baseline
 * process, rates from the effects' timestamps: the README's headline), throughput (in-process,
 * for profiling: baselines, leased, fast path, duplicate loads, claim latency, round trips),
 * steps (a 3-step job against the same work without steps, in-process), data-layers (the one-row
 * effect through each data layer's adapter, leased and database-only, as ratios to the Kysely
 * path and the lean baseline of the same section), producer, processes,
 * rss, recovery, peers. Prints tables and writes `bench/results/<YYYY-MM-DD>-<commit>-<what>.json`
 * and `.svg` (the chart): the date the run started (UTC), the commit measured
 * (`git rev-parse --short HEAD`; the document also says whether tracked files had uncommitted
 * changes), and `<what>` = the `--tag`, else `quick`, else (with --only) the sections joined by
 * `-`, else `full-run`.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import { sql } from 'kysely';
import { createBenchEnv, RoundTripCounter, type BenchEnv } from './support/bench-env.js';
import { renderChart } from './support/chart.js';
import { startChild } from './support/child-process.js';
import { describeContender, runDeployedDrain, type DeployedContender, type DeployedRun } from './support/deployed.js';
import { cpuPerThousandJobs, type CpuPerThousandJobs } from './support/drain-cpu.js';
import { runProcesses, runRecovery, runRss, type ProcessesRun, type RecoveryRun, type RssRun } from './support/processes.js';
import { runProducer, type ProducerRun } from './support/producer.js';
import { formatSpread, spread, type Spread } from './support/stats.js';
import { runThroughput, type Contender, type ThroughputRun } from './support/throughput.js';
import { optionReader } from './support/cli-args.js';
import { runDataLayersBench } from './support/data-layers.js';

interface Args {
  quick: boolean;
  reps: number;
  n: number;
  only: Set<string> | undefined;
  tag: string | undefined;
  ablation: boolean;
}

function parseArgs(argv: string[]): Args {
  const quick = argv.includes('--quick');
  const { value, positive } = optionReader(argv);
  const sections = ['deployed', 'throughput', 'steps', 'data-layers', 'producer', 'processes', 'rss', 'recovery', 'peers'];
  const only = value('--only')?.split(',');
  for (const s of only ?? []) if (!sections.includes(s)) throw new Error(`--only: unknown section "${s}" (known: ${sections.join(', ')})`);
  return {
    quick,
    reps: positive('--reps', quick ? 2 : 3),
    n: positive('--n', quick ? 3000 : 20_000),
    only: only ? new Set(only) : undefined,
    tag: value('--tag'),
    ablation: argv.includes('--ablation'),
  };
}

const args = parseArgs(process.argv.slice(2));
const wants = (section: string) => !args.only || args.only.has(section);
const CONCURRENCY = 16;
/** Group commit pays off with more jobs in flight: the main contenders again at this concurrency. */
const HIGH_CONCURRENCY = 64;
const RATIOS = [0, 0.5, 0.9];
const log = (line: string) => process.stderr.write(`${new Date().toISOString().slice(11, 19)} ${line}\n`);
/** The peers run on Node 22, which they require (not on the Node running this script). */
const NODE_22 = 'tools/node-versions/node_modules/node22/bin/node';
// Checked before anything runs, so a missing Node 22 does not surface after the other sections' minutes.
if (wants('peers') && !existsSync(fileURLToPath(new URL(`../${NODE_22}`, import.meta.url)))) {
  throw new Error(
    `The peers section needs Node 22 (pg-boss and graphile-worker require it) at ${NODE_22}, and the peers themselves: install them with \`npm ci --prefix tools/node-versions && npm ci --prefix bench/peers\`, or leave the peers out with --only.`,
  );
}

// Looked up before anything runs: a results file is named after the commit it measured.
const commit = measuredCommit();

const counter = new RoundTripCounter();
counter.install();
const env = await createBenchEnv();
const startedAt = new Date();
const loadBefore = os.loadavg();
const results: Record<string, unknown> = {};
const tables: string[] = [];
try {
  const machine = await describeMachine(env);
  log(`bench: schema ${env.schema}, prefix ${env.redisPrefix}, N ${args.n}, reps ${args.reps}, ${machine.cpus} cores`);
  if (wants('deployed')) await deployedSection();
  if (wants('throughput')) await throughputSection();
  if (wants('steps')) await stepsSection();
  if (wants('data-layers')) await dataLayersSection();
  if (wants('producer')) await producerSection();
  if (wants('processes')) await processesSection();
  if (wants('rss')) await rssSection();
  if (wants('recovery')) await recoverySection();
  if (wants('peers')) await peersSection();
  results.machine = { ...machine, loadAverageBefore: loadBefore, loadAverageAfter: os.loadavg() };
} finally {
  await env.teardown();
}

const chart = results.chartData
  ? renderChart({
      title: `idempotent-jobs benchmark, ${startedAt.toISOString().slice(0, 10)} (${os.cpus().length} shared cores)`,
      throughput: [],
      baselines: [],
      recovery: [],
      ...(results.chartData as object),
    })
  : undefined;
const finishedAt = new Date();
const date = startedAt.toISOString().slice(0, 10);
// A partial run (--only) is named after its sections, so that it never overwrites a full run.
const what = args.tag ?? (args.quick ? 'quick' : args.only ? [...args.only].join('-') : 'full-run');
const name = `${date}-${commit.hash}-${what}`;
const dir = fileURLToPath(new URL('./results/', import.meta.url));
mkdirSync(dir, { recursive: true });
const document = {
  startedAt: startedAt.toISOString(),
  finishedAt: finishedAt.toISOString(),
  command: `npm run bench -- ${process.argv.slice(2).join(' ')}`.trim(),
  commit: commit.hash,
  uncommittedChanges: commit.uncommittedChanges,
  settings: { n: args.n, reps: args.reps, concurrency: CONCURRENCY, quick: args.quick, ablation: args.ablation },
  notes: [
    'The machine may be shared while measuring (other processes on the same cores, Postgres and Redis): compare ratios within this run, not absolute numbers across runs.',
    'Round trips are counted by wrapping pg.Client#query in the benchmark process (pg_stat_statements is not installed on this server).',
  ],
  ...results,
};
writeFileSync(`${dir}${name}.json`, `${JSON.stringify(document, null, 2)}\n`);
if (chart) writeFileSync(`${dir}${name}.svg`, chart);
process.stdout.write(`\n${tables.join('\n\n')}\n\nResults: bench/results/${name}.json${chart ? `, chart: bench/results/${name}.svg` : ''}\n`);
log(`done in ${Math.round((finishedAt.getTime() - startedAt.getTime()) / 1000)} s`);

// ---------------------------------------------------------------------------------------------

/**
 * The headline: each contender is its own process started as users start it (the CLI worker in
 * its default configuration and with the fast path and group commit), against the lean baseline
 * process at the same concurrency in the same repetition. Rates come from the effects' database
 * timestamps (see support/deployed.ts); beside them, the CPU per 1,000 jobs of the worker, its
 * Postgres backends and Redis (support/drain-cpu.ts), and its ratio to the lean baseline's.
 */
async function deployedSection(): Promise<void> {
  const n = args.quick ? args.n : 10_000;
  // Each idempotent-jobs contender follows the lean baseline at its concurrency.
  type QueueBackend = 'redis' | 'postgres';
  const combos: Array<{ contender: DeployedContender; concurrency: number; queueBackend?: QueueBackend }> = [
    { contender: 'lean', concurrency: 32 },
    { contender: 'leased', concurrency: 32 },
    { contender: 'database-only', concurrency: 32 },
    // The queue in Postgres (BullMQ's PostgreSQL backend): its own lean baseline, ours leased and database-only.
    { contender: 'lean', concurrency: 32, queueBackend: 'postgres' },
    { contender: 'leased', concurrency: 32, queueBackend: 'postgres' },
    { contender: 'database-only', concurrency: 32, queueBackend: 'postgres' },
    { contender: 'lean', concurrency: HIGH_CONCURRENCY },
    { contender: 'fast-path-group', concurrency: HIGH_CONCURRENCY },
    { contender: 'leased-group', concurrency: HIGH_CONCURRENCY },
    { contender: 'lean', concurrency: CONCURRENCY },
    { contender: 'fast-path-group', concurrency: CONCURRENCY },
  ];
  const runs: Array<DeployedRun & { rep: number }> = [];
  for (let rep = 0; rep < args.reps; rep++) {
    // Alternate the order: forward on even repetitions, backward on odd ones.
    for (const { contender, concurrency, queueBackend } of rep % 2 === 0 ? combos : [...combos].reverse()) {
      const run = await runDeployedDrain(env, { contender, concurrency, n, queueBackend });
      log(
        `rep ${rep + 1} deployed ${contender} c ${concurrency} queue ${run.queueBackend} N ${n}: ${run.jobsPerSec.toFixed(0)} jobs/s (effects over ${run.effectSpanMs.toFixed(0)} ms), ` +
          `CPU ${formatCpuSplit(cpuPerThousandJobs(run.cpu, run.n))} ms/1k jobs`,
      );
      runs.push({ ...run, rep });
    }
  }
  // Each contender against the lean baseline on the same queue backend; the Postgres backend's lean also against Redis's.
  const lean = (rep: number, concurrency: number, queueBackend: QueueBackend) =>
    runs.find((r) => r.contender === 'lean' && r.rep === rep && r.concurrency === concurrency && r.queueBackend === queueBackend)!;
  const cpu = (run: DeployedRun) => cpuPerThousandJobs(run.cpu, run.n);
  const measured = (values: Array<number | undefined>) => values.filter((v): v is number => v !== undefined);
  const summary = combos.map(({ contender, concurrency, queueBackend = 'redis' }) => {
    const mine = runs.filter((r) => r.contender === contender && r.concurrency === concurrency && r.queueBackend === queueBackend);
    const cpus = mine.map(cpu);
    return {
      contender,
      concurrency,
      queueBackend,
      n,
      reps: mine.length,
      jobsPerSec: spread(mine.map((r) => r.jobsPerSec)),
      ratioToLean: contender === 'lean' ? undefined : spread(mine.map((r) => r.jobsPerSec / lean(r.rep, concurrency, queueBackend).jobsPerSec)),
      ratioToRedisLean: queueBackend === 'postgres' ? spread(mine.map((r) => r.jobsPerSec / lean(r.rep, concurrency, 'redis').jobsPerSec)) : undefined,
      cpuMsPerThousandJobs: {
        total: spread(cpus.map((c) => c.total)),
        node: spread(cpus.map((c) => c.node)),
        postgres: spread(measured(cpus.map((c) => c.postgres))),
        redis: spread(measured(cpus.map((c) => c.redis))),
      },
      cpuRatioToLean: contender === 'lean' ? undefined : spread(mine.map((r) => cpu(r).total / cpu(lean(r.rep, concurrency, queueBackend)).total)),
    };
  });
  results.deployed = {
    n,
    reps: args.reps,
    method:
      'Each contender is its own process: lean = bench/support/lean-baseline-worker.ts (BullMQ Worker + pg.Pool, BEGIN/insert/COMMIT); ' +
      'the others = `node bin/idempotent-jobs.js worker --handler bench/support/deployed-handler.ts` with MIGRATE=false, LOG_LEVEL=warn and the contender\'s FAST_PATH/GROUP_COMMIT ' +
      '(database-only: --handler bench/support/deployed-database-only-handler.ts, the { transaction } form, neither variable set). ' +
      'One drain of N unique jobs each, alternating; rate = (rows - 1) / (max - min created_at) of the effect rows (clock_timestamp at insert). ' +
      'CPU (bench/support/drain-cpu.ts): utime + stime from /proc/<pid>/stat, read just before the queue is resumed and just after the last completion, per 1,000 jobs: ' +
      'node = the worker process and its descendants; postgres = the backends whose pg_stat_activity.client_port is a TCP port of the worker (its connections only; postgresAllMs in each run: every postgres process); ' +
      'redis = the redis-server process as a whole (every client, the benchmark\'s polling included; none on the Postgres queue backend). cpuRatioToLean: total CPU per job against the lean baseline of the same repetition, concurrency and queue.',
    summary,
    runs,
  };
  tables.push(
    table(
      `Deployed: worker processes as users start them, against the lean baseline process (BullMQ + node-postgres, BEGIN/insert/COMMIT) at the same concurrency in the same repetition; N=${n} unique jobs, rates from the effects' timestamps; median (min–max)`,
      ['contender', 'worker environment', 'queue', 'conc', 'N', 'reps', 'jobs/s', 'x lean (same queue)', 'x lean on Redis', 'CPU ms/1k jobs', 'Node / PG / Redis', 'CPU x lean'],
      summary.map((s) => [
        s.contender,
        describeContender(s.contender),
        s.queueBackend,
        String(s.concurrency),
        String(s.n),
        String(s.reps),
        formatSpread(s.jobsPerSec),
        s.ratioToLean ? formatSpread(s.ratioToLean, 2) : '',
        s.ratioToRedisLean ? formatSpread(s.ratioToRedisLean, 2) : '',
        formatSpread(s.cpuMsPerThousandJobs.total),
        formatCpuSplit({ node: s.cpuMsPerThousandJobs.node.median, postgres: s.cpuMsPerThousandJobs.postgres.median, redis: s.cpuMsPerThousandJobs.redis.median }, false),
        s.cpuRatioToLean ? formatSpread(s.cpuRatioToLean, 2) : '',
      ]),
    ),
  );
}

async function throughputSection(): Promise<void> {
  // The main comparison uses N jobs and every repetition; the duplicate loads use N/2 jobs and
  // at most 2 repetitions (to keep the whole run near 10 minutes); the ablation is opt-in.
  const dupN = Math.max(1000, Math.round(args.n / 2));
  const dupReps = Math.min(args.reps, 2);
  const combos: Array<{ contender: Contender; ratio: number; n: number; reps: number; concurrency?: number }> = [
    { contender: 'bullmq-noop', ratio: 0, n: args.n, reps: args.reps },
    { contender: 'bullmq-tx', ratio: 0, n: args.n, reps: args.reps },
    ...RATIOS.flatMap((ratio) =>
      (['leased', 'fast-path', 'leased-group', 'fast-path-group'] as const).map((contender) => ({
        contender,
        ratio,
        n: ratio === 0 ? args.n : dupN,
        reps: ratio === 0 ? args.reps : dupReps,
      })),
    ),
    // The same at concurrency 64, against the baseline at 64.
    ...(['bullmq-tx', 'leased', 'fast-path', 'leased-group', 'fast-path-group'] as const).map((contender) => ({
      contender,
      ratio: 0,
      n: args.n,
      reps: dupReps,
      concurrency: HIGH_CONCURRENCY,
    })),
    // Ablation: the same protocol without claim batching, without the fast path's settled-key
    // probe, with the completion (or result) and COMMIT as two round trips, and with
    // asynchronous claim commits.
    ...(args.ablation
      ? (['leased-unbatched', 'fast-path-no-probe', 'leased-two-trip-commit', 'fast-path-two-trip-commit', 'leased-async-claim'] as const).map((contender) => ({ contender, ratio: 0, n: args.n, reps: args.reps }))
      : []),
  ];
  const runs: Array<ThroughputRun & { rep: number }> = [];
  for (let rep = 0; rep < args.reps; rep++) {
    // Alternate the order: forward on even repetitions, backward on odd ones.
    const order = (rep % 2 === 0 ? combos : [...combos].reverse()).filter((combo) => rep < combo.reps);
    for (const { contender, ratio, n, concurrency = CONCURRENCY } of order) {
      const run = await runThroughput(env, counter, { contender, n, concurrency, duplicateRatio: ratio });
      log(`rep ${rep + 1} ${contender} c ${concurrency} N ${n} dup ${ratio * 100}%: ${run.jobsPerSec.toFixed(0)} jobs/s, ${run.roundTripsPerJob.toFixed(2)} RT/job`);
      if (run.failedJobs > 0) throw new Error(`${contender}: ${run.failedJobs} jobs failed`);
      const expectedEffects = contender === 'bullmq-noop' ? 0 : contender === 'bullmq-tx' ? run.n : run.distinctKeys;
      if (run.effects !== expectedEffects) throw new Error(`${contender}: ${run.effects} effects, expected ${expectedEffects}`);
      runs.push({ ...run, rep });
    }
  }
  const find = (contender: Contender, ratio: number, rep: number, concurrency: number) =>
    runs.find((r) => r.contender === contender && r.duplicateRatio === ratio && r.rep === rep && r.concurrency === concurrency);
  const summary = combos.map(({ contender, ratio, n, concurrency = CONCURRENCY }) => {
    const mine = runs.filter((r) => r.contender === contender && r.duplicateRatio === ratio && r.concurrency === concurrency);
    const ratioToBaseline = spread(mine.map((r) => r.jobsPerSec / find('bullmq-tx', 0, r.rep, concurrency)!.jobsPerSec));
    const ratioToUnique = ratio > 0 ? spread(mine.map((r) => r.jobsPerSec / find(contender, 0, r.rep, concurrency)!.jobsPerSec)) : undefined;
    // Round trips per duplicate: this run's trips minus the unique jobs' share at the 0% rate.
    const roundTripsPerDuplicate =
      ratio > 0
        ? spread(
            mine.map((r) => {
              const unique = find(contender, 0, r.rep, concurrency)!;
              const duplicates = r.n - r.distinctKeys;
              return (r.roundTrips - r.distinctKeys * unique.roundTripsPerJob) / duplicates;
            }),
          )
        : undefined;
    const latency = (kind: string, field: 'p50' | 'p99') => spread(mine.map((r) => r.claimLatency?.[kind]?.[field] ?? NaN).filter(Number.isFinite));
    return {
      contender,
      concurrency,
      duplicateRatio: ratio,
      n,
      reps: mine.length,
      jobsPerSec: spread(mine.map((r) => r.jobsPerSec)),
      ratioToAtLeastOnce: ratioToBaseline,
      ratioToAllUnique: ratioToUnique,
      roundTripsPerJob: spread(mine.map((r) => r.roundTripsPerJob)),
      roundTripsPerDuplicate,
      claimMs: !contender.startsWith('bullmq')
        ? { claimedP50: latency('claimed', 'p50'), claimedP99: latency('claimed', 'p99'), duplicateP50: latency('completed', 'p50'), duplicateP99: latency('completed', 'p99') }
        : undefined,
    };
  });
  results.throughput = { n: args.n, duplicateLoadN: dupN, concurrency: CONCURRENCY, reps: args.reps, duplicateLoadReps: dupReps, summary, runs };

  const rows = summary.map((s) => [
    s.contender,
    String(s.concurrency),
    `${s.duplicateRatio * 100}%`,
    String(s.n),
    String(s.reps),
    formatSpread(s.jobsPerSec),
    formatSpread(s.ratioToAtLeastOnce, 2),
    s.ratioToAllUnique ? formatSpread(s.ratioToAllUnique, 2) : '',
    formatSpread(s.roundTripsPerJob, 2),
    s.roundTripsPerDuplicate ? formatSpread(s.roundTripsPerDuplicate, 2) : '',
    s.claimMs ? `${fmt(s.claimMs.claimedP50)} / ${fmt(s.claimMs.claimedP99)}` : '',
    s.claimMs && s.duplicateRatio > 0 ? `${fmt(s.claimMs.duplicateP50)} / ${fmt(s.claimMs.duplicateP99)}` : '',
  ]);
  tables.push(
    table(
      `Throughput in-process (worker and drivers in the benchmark's process; for profiling): median (min–max) over repetitions; ratios against bullmq-tx (N=${args.n}) at the same concurrency in the same repetition; *-group: group commit`,
      ['contender', 'conc', 'dup', 'N', 'reps', 'jobs/s', 'x at-least-once', 'x all-unique', 'PG RT/job', 'PG RT/dup', 'claim p50/p99 ms', 'dup claim p50/p99 ms'],
      rows,
    ),
  );
  const series = (contender: Contender, label: string, color: string) => ({
    label,
    color,
    points: summary.filter((s) => s.contender === contender && s.concurrency === CONCURRENCY).map((s) => ({ ratio: s.duplicateRatio, ...pick(s.jobsPerSec) })),
  });
  results.chartData = {
    throughput: [
      series('leased', 'idempotent-jobs, leased', '#2471a3'),
      series('fast-path', 'idempotent-jobs, fast path', '#27ae60'),
      series('leased-group', 'leased + group commit', '#8e44ad'),
      series('fast-path-group', 'fast path + group commit', '#d35400'),
    ],
    baselines: [
      {
        label: `plain BullMQ + same transaction (at-least-once), concurrency ${CONCURRENCY}`,
        color: '#7f8c8d',
        value: summary.find((s) => s.contender === 'bullmq-tx' && s.concurrency === CONCURRENCY)!.jobsPerSec.median,
      },
    ],
  };
}

/**
 * A 3-step job against the same work without steps, in-process on the leased path: two
 * inserts and a call, then the completion's insert in `ctx.transaction`; `leased-3-writes`
 * makes the writes as autocommit statements and the call bare, `leased-3-steps` makes them
 * `ctx.step`s (database, external, database). N (at most 10,000) unique jobs, the two
 * alternating; the ratio is taken within each repetition.
 */
async function stepsSection(): Promise<void> {
  // At most 10,000 jobs a drain (six drains in a full run), as the deployed section.
  const n = Math.min(args.n, 10_000);
  const contenders = ['leased-3-writes', 'leased-3-steps'] as const;
  const runs: Array<ThroughputRun & { rep: number }> = [];
  for (let rep = 0; rep < args.reps; rep++) {
    for (const contender of rep % 2 === 0 ? contenders : [...contenders].reverse()) {
      const run = await runThroughput(env, counter, { contender, n, concurrency: CONCURRENCY, duplicateRatio: 0 });
      log(`rep ${rep + 1} ${contender} c ${CONCURRENCY} N ${n}: ${run.jobsPerSec.toFixed(0)} jobs/s, ${run.roundTripsPerJob.toFixed(2)} RT/job`);
      if (run.failedJobs > 0) throw new Error(`${contender}: ${run.failedJobs} jobs failed`);
      // Each job writes three rows: reserve, ledger and the completion's.
      if (run.effects !== 3 * run.distinctKeys) throw new Error(`${contender}: ${run.effects} effect rows, expected ${3 * run.distinctKeys}`);
      runs.push({ ...run, rep });
    }
  }
  const without = (rep: number) => runs.find((r) => r.contender === 'leased-3-writes' && r.rep === rep)!;
  const summary = contenders.map((contender) => {
    const mine = runs.filter((r) => r.contender === contender);
    return {
      contender,
      concurrency: CONCURRENCY,
      n,
      reps: mine.length,
      jobsPerSec: spread(mine.map((r) => r.jobsPerSec)),
      ratioToWithoutSteps: contender === 'leased-3-steps' ? spread(mine.map((r) => r.jobsPerSec / without(r.rep).jobsPerSec)) : undefined,
      roundTripsPerJob: spread(mine.map((r) => r.roundTripsPerJob)),
      nodeCpuMsPerJob: spread(mine.map((r) => r.nodeCpuMsPerJob)),
    };
  });
  results.steps = {
    n,
    concurrency: CONCURRENCY,
    reps: args.reps,
    method:
      'In-process, leased path (createIdempotentWorker, defaults), N unique jobs, concurrency 16. Each job: insert, call (an in-process function that answers at once), insert, ' +
      'then ctx.transaction with an insert. leased-3-writes: the inserts as autocommit statements on the worker\'s pool, the call bare. ' +
      'leased-3-steps: ctx.step reserve { transaction }, ctx.step charge (fn), ctx.step ledger { transaction }. Ratio within each repetition; each drain checks 3 rows per key.',
    summary,
    runs,
  };
  const handlers: Record<(typeof contenders)[number], string> = {
    'leased-3-writes': 'insert, call, insert, ctx.transaction(insert)',
    'leased-3-steps': 'step(db insert), step(call), step(db insert), ctx.transaction(insert)',
  };
  tables.push(
    table(
      `Multi-step jobs, in-process (leased path, concurrency ${CONCURRENCY}, N=${n} unique jobs): the same three effects without steps and as ctx.step, then the completion; median (min–max); ratio within each repetition`,
      ['contender', 'handler', 'reps', 'jobs/s', 'x without steps', 'PG RT/job', 'node CPU ms/job'],
      summary.map((s) => [
        s.contender,
        handlers[s.contender],
        String(s.reps),
        formatSpread(s.jobsPerSec),
        s.ratioToWithoutSteps ? formatSpread(s.ratioToWithoutSteps, 2) : '',
        formatSpread(s.roundTripsPerJob, 2),
        formatSpread(s.nodeCpuMsPerJob, 3),
      ]),
    ),
  );
}

async function producerSection(): Promise<void> {
  const runs: ProducerRun[] = [];
  const n = Math.min(args.n, 10_000);
  for (let rep = 0; rep < args.reps; rep++) {
    const order = rep % 2 === 0 ? (['bullmq-addBulk', 'IdempotentProducer.enqueueBulk'] as const) : (['IdempotentProducer.enqueueBulk', 'bullmq-addBulk'] as const);
    for (const producer of order) runs.push(await runProducer(env, producer, n, 100));
  }
  const summary = (['bullmq-addBulk', 'IdempotentProducer.enqueueBulk'] as const).map((producer) => ({
    producer,
    jobsPerSec: spread(runs.filter((r) => r.producer === producer).map((r) => r.jobsPerSec)),
  }));
  results.producer = { n, batch: 100, summary, runs };
  tables.push(table(`Enqueue: ${n} unique jobs in batches of 100`, ['producer', 'jobs/s'], summary.map((s) => [s.producer, formatSpread(s.jobsPerSec)])));
  log('producer done');
}

async function processesSection(): Promise<void> {
  const n = args.quick ? args.n : Math.min(args.n, 5000);
  const counts = [1, 2, 4];
  const runs: ProcessesRun[] = [];
  const reps = Math.min(args.reps, 2);
  for (let rep = 0; rep < reps; rep++) {
    for (const processes of rep % 2 === 0 ? counts : [...counts].reverse()) {
      const run = await runProcesses(env, { processes, n, concurrency: 8 });
      log(`processes ${processes}: ${run.jobsPerSec.toFixed(0)} jobs/s`);
      runs.push(run);
    }
  }
  const summary = counts.map((processes) => ({ processes, jobsPerSec: spread(runs.filter((r) => r.processes === processes).map((r) => r.jobsPerSec)) }));
  results.processes = { n, concurrencyPerProcess: 8, cores: os.cpus().length, summary, runs };
  tables.push(
    table(
      `Worker processes (leased path, concurrency 8 each, pool 9 each; N=${n}; the machine has ${os.cpus().length} cores, shared with Postgres and Redis)`,
      ['processes', 'jobs/s'],
      summary.map((s) => [String(s.processes), formatSpread(s.jobsPerSec)]),
    ),
  );
}

async function rssSection(): Promise<void> {
  const runs: RssRun[] = [];
  for (const concurrency of [1, 16, 64]) {
    const run = await runRss(env, { concurrency, n: 10_000, windowMs: args.quick ? 3000 : 6000, warmupMs: 2000, sleepMs: 5 });
    log(`rss concurrency ${concurrency}: max ${run.maxRssMb.toFixed(0)} MB`);
    runs.push(run);
  }
  results.rss = { targetMb: 200, runs };
  tables.push(
    table(
      'Worker RSS under load (one process, leased path, each job sleeps 5 ms then commits its effect; sampled every 100 ms)',
      ['concurrency', 'pg pool', 'max RSS MB', 'median RSS MB', 'jobs in window'],
      runs.map((r) => [String(r.concurrency), String(r.poolSize), r.maxRssMb.toFixed(0), r.medianRssMb.toFixed(0), `${r.jobsInWindow} in ${r.windowMs / 1000} s`]),
    ),
  );
}

async function recoverySection(): Promise<void> {
  const leases = [2000, 5000, 10_000];
  const runs: RecoveryRun[] = [];
  const reps = Math.min(args.reps, 2);
  for (let rep = 0; rep < reps; rep++) {
    for (const leaseMs of rep % 2 === 0 ? leases : [...leases].reverse()) {
      const run = await runRecovery(env, { leaseMs, stalledIntervalMs: 1000 });
      log(`recovery lease ${leaseMs}: ${run.recoveryMs.toFixed(0)} ms, effects ${run.effects}`);
      if (run.effects !== 1) throw new Error(`recovery with lease ${leaseMs}: ${run.effects} effects, expected 1`);
      runs.push(run);
    }
  }
  const summary = leases.map((leaseMs) => ({ leaseMs, targetMs: leaseMs + 2000, recoveryMs: spread(runs.filter((r) => r.leaseMs === leaseMs).map((r) => r.recoveryMs)) }));
  results.recovery = { stalledIntervalMs: 1000, summary, runs };
  tables.push(
    table(
      'Recovery after SIGKILL of the worker holding a key (LOCK_DURATION_MS = lease, STALLED_INTERVAL_MS = 1000; from the kill to the key completed by another worker)',
      ['leaseMs', 'recovery ms', 'target ms', 'met'],
      summary.map((s) => [String(s.leaseMs), formatSpread(s.recoveryMs), String(s.targetMs), s.recoveryMs.max <= s.targetMs ? 'yes' : 'no']),
    ),
  );
  results.chartData = { ...(results.chartData as object), recovery: summary.map((s) => ({ leaseMs: s.leaseMs, ...pick(s.recoveryMs) })) };
}

async function peersSection(): Promise<void> {
  const node22 = fileURLToPath(new URL(`../${NODE_22}`, import.meta.url));
  const runs: Array<Record<string, unknown>> = [];
  const peers = ['pg-boss', 'graphile-worker'];
  const peerN = args.quick ? args.n : Math.min(args.n, 10_000);
  const reps = Math.min(args.reps, 2);
  for (let rep = 0; rep < reps; rep++) {
    for (const peer of rep % 2 === 0 ? peers : [...peers].reverse()) {
      const child = startChild(
        `peers/${peer}-bench.ts`,
        { DATABASE_URL: env.databaseUrl, BENCH_N: String(peerN), BENCH_CONCURRENCY: String(CONCURRENCY), BENCH_SCHEMA_PREFIX: `${env.schema}_${rep}` },
        node22,
      );
      try {
        const line = await child.waitForLine((l) => l.msg === 'result', 15 * 60_000);
        await child.exited;
        log(`${peer}: ${Number(line.jobsPerSec).toFixed(0)} jobs/s`);
        runs.push(line);
      } finally {
        await child.stop();
      }
    }
  }
  // The same-run reference: plain BullMQ + the same transaction, if measured.
  const tp = results.throughput as { summary: Array<{ contender: string; duplicateRatio: number; jobsPerSec: Spread }> } | undefined;
  const reference = tp?.summary.find((s) => s.contender === 'bullmq-tx')?.jobsPerSec.median;
  const summary = peers.map((peer) => {
    const mine = runs.filter((r) => r.peer === peer);
    const jobsPerSec = spread(mine.map((r) => Number(r.jobsPerSec)));
    return {
      peer,
      version: mine[0]?.version,
      settings: mine[0]?.settings,
      dedupFeature: mine[0]?.dedupFeature,
      jobsPerSec,
      ratioToAtLeastOnce: reference ? jobsPerSec.median / reference : undefined,
      dedupWhileQueued: mine.every((r) => r.dedupWhileQueued === true),
      reRunsAfterCompletion: mine.some((r) => Number(r.effectsAfterReEnqueue) > 1),
    };
  });
  results.peers = { node: NODE_22, n: peerN, summary, runs };
  tables.push(
    table(
      `Peers on the same workload (N=${peerN}, ${CONCURRENCY} at once, same effect transaction; Node 22)`,
      ['peer', 'jobs/s', 'x at-least-once', 'dedup feature', 'dedup while queued', 're-enqueue after completion runs again'],
      summary.map((s) => [
        `${s.peer} ${s.version ?? ''}`,
        formatSpread(s.jobsPerSec),
        s.ratioToAtLeastOnce ? s.ratioToAtLeastOnce.toFixed(2) : 'n/a',
        String(s.dedupFeature),
        s.dedupWhileQueued ? 'yes' : 'no',
        s.reRunsAfterCompletion ? 'YES (effect twice)' : 'no',
      ]),
    ),
  );
}

// ---------------------------------------------------------------------------------------------

async function describeMachine(bench: BenchEnv) {
  const { rows } = await sql<{ version: string }>`select version()`.execute(bench.db);
  const redis = new Redis(bench.redisUrl);
  const info = await redis.info('server');
  redis.disconnect();
  let lscpu = '';
  try {
    lscpu = execFileSync('lscpu', { encoding: 'utf8' });
  } catch {
    // not Linux, or no lscpu: os.cpus() is enough
  }
  return {
    cpus: os.cpus().length,
    cpuModel: /Model name:\s*(.+)/.exec(lscpu)?.[1]?.trim() ?? os.cpus()[0]?.model,
    hypervisor: /Hypervisor vendor:\s*(.+)/.exec(lscpu)?.[1]?.trim(),
    memoryGb: Math.round(os.totalmem() / 2 ** 30),
    node: process.version,
    postgres: rows[0]?.version.split(',')[0],
    redis: /redis_version:(\S+)/.exec(info)?.[1],
    platform: `${os.type()} ${os.release()}`,
  };
}

/**
 * The commit this checkout is at (`git rev-parse --short HEAD`), which names the results file,
 * and whether tracked files differ from it (then the file names the commit the changes sit on).
 */
function measuredCommit(): { hash: string; uncommittedChanges: boolean } {
  const repository = fileURLToPath(new URL('..', import.meta.url));
  const git = (...gitArgs: string[]) => execFileSync('git', gitArgs, { cwd: repository, encoding: 'utf8' }).trim();
  try {
    return { hash: git('rev-parse', '--short', 'HEAD'), uncommittedChanges: git('status', '--porcelain', '--untracked-files=no') !== '' };
  } catch (error) {
    throw new Error(
      `bench/results files are named after the commit measured, and \`git rev-parse --short HEAD\` failed in ${repository}: run the benchmark from a git checkout of this repository.`,
      { cause: error },
    );
  }
}

/**
 * The data-layers section: the rows of `npm run bench:data-layers` (bench/support/data-layers.ts),
 * smaller (at most 500 jobs per contender and round, 300 with --quick; --reps rounds), so that
 * the whole run grows by well under a minute. Each ratio is to the lean baseline and to Kysely on
 * the same path, all measured in this section, alternating round by round.
 */
async function dataLayersSection(): Promise<void> {
  const jobs = Math.min(args.n, args.quick ? 300 : 500);
  const began = performance.now();
  const run = await runDataLayersBench({ jobs, rounds: args.reps, databaseUrl: env.databaseUrl });
  log(`data layers: ${run.rows.length} contenders × ${run.rounds} rounds × ${jobs} jobs in ${((performance.now() - began) / 1000).toFixed(0)} s`);
  results.dataLayers = {
    ...run,
    method:
      'In-process, the runner every consumer uses (no broker), concurrency 16, unique keys; the same one-row insert through Kysely, through each adapter (its own pool of 16), ' +
      'and as the lean baseline (node-postgres begin/insert/commit, at least once). Leased: ctx.transaction(dataLayer, fn); database-only: databaseOnly(dataLayer, fn), ' +
      'the fast path, never grouped (Kysely database-only: fast path with group commit). Contenders alternate round by round; rate = median of the rounds.',
  };
  tables.push(
    table(
      `Your data layer, in-process (concurrency ${run.concurrency}, ${jobs} unique jobs per contender and round, ${run.rounds} rounds): median jobs/s, ratios to the lean baseline and to Kysely on the same path, same run`,
      ['contender', 'jobs/s', 'x lean', 'x Kysely same path'],
      run.rows.map((row) => [row.name, row.jobsPerSec.toFixed(0), row.xLean.toFixed(2), row.xKyselySamePath === undefined ? '' : row.xKyselySamePath.toFixed(2)]),
    ),
  );
}

function table(title: string, header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) => cells.map((c, i) => c.padEnd(widths[i]!)).join('  ');
  return [title, line(header), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(line)].join('\n');
}

/** `total (node / postgres / redis)` or, without the total, `node / postgres / redis`, in ms; a part not measured is `–`. */
function formatCpuSplit(cpu: Omit<CpuPerThousandJobs, 'total'> & { total?: number }, withTotal = true): string {
  const part = (ms: number | undefined) => (ms === undefined || Number.isNaN(ms) ? '–' : ms.toFixed(0));
  const split = `${part(cpu.node)} / ${part(cpu.postgres)} / ${part(cpu.redis)}`;
  return withTotal && cpu.total !== undefined ? `${part(cpu.total)} (node / pg / redis ${split})` : split;
}

function fmt(s: Spread): string {
  return Number.isNaN(s.median) ? 'n/a' : s.median.toFixed(2);
}

function pick(s: Spread) {
  return { median: s.median, min: s.min, max: s.max };
}
