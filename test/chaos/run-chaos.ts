/**
 * The chaos suite's command:
 *
 *   npm run chaos                                                  # short profile (~2 min, CI)
 *   npm run chaos -- --jobs 50000 --minutes 10 --workers 6         # long profile
 *   npm run chaos -- --seed 1234                                   # the same fault schedule again
 *
 * Exits 0 when nothing was lost, duplicated or unexpected and no two overlapping owners both
 * committed; 1 when a check failed; 2 on bad flags or when the run could not be carried out.
 */
import { randomInt } from 'node:crypto';
import { parseArgs } from 'node:util';
import { runChaos, type ChaosOptions } from './harness.js';
import { parseFaultPoints } from './fault-injection.js';
import { formatTable, summarize, writeHistory, writeJsonReport } from './report.js';

const USAGE = `Usage: npm run chaos -- [flags]
  --seed N               seed of the fault schedule and the producer (default: random, printed)
  --jobs N               enqueue requests, duplicates included (default 3000)
  --minutes M            length of the chaos phase, decimals allowed (default 1.5)
  --workers K            worker processes (default 3)
  --concurrency C        jobs at once per worker (default 4)
  --duplicates P         percent of requests that repeat a key (default 20)
  --lease-ms MS          lease, BullMQ lock duration follows it (default 3000)
  --fault-interval-ms MS mean time between faults (default 3000)
  --max-work-ms MS       longest simulated work per job (default 250)
  --fault-points SPEC    extra random crashes, e.g. after-claim:0.001,before-commit:0.001 (default none)
  --drain-minutes M      how long the system may take to finish after the faults stop (default 1.5)
  --report-dir DIR       where report-<seed>.json goes (default .chaos)
  --fast-path            workers use the single-transaction fast path (FAST_PATH=true)
  --group-commit         workers share transactions between concurrent jobs (GROUP_COMMIT=true)
  --keep-schema          keep the run's Postgres schema for investigation
  --help`;

class UsageError extends Error {}

function parseOptions(argv: string[]): (ChaosOptions & { reportDir: string }) | undefined {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      seed: { type: 'string' },
      jobs: { type: 'string' },
      minutes: { type: 'string' },
      workers: { type: 'string' },
      concurrency: { type: 'string' },
      duplicates: { type: 'string' },
      'lease-ms': { type: 'string' },
      'fault-interval-ms': { type: 'string' },
      'max-work-ms': { type: 'string' },
      'fault-points': { type: 'string' },
      'drain-minutes': { type: 'string' },
      'report-dir': { type: 'string' },
      'keep-schema': { type: 'boolean' },
      'fast-path': { type: 'boolean' },
      'group-commit': { type: 'boolean' },
      help: { type: 'boolean' },
    },
  });
  if (values.help) return undefined;
  const number = (flag: keyof typeof values, fallback: number, min: number, max: number, integer = true) => {
    const raw = values[flag];
    if (raw === undefined) return fallback;
    const value = Number(raw);
    if (typeof raw !== 'string' || raw.trim() === '' || !Number.isFinite(value) || (integer && !Number.isInteger(value)) || value < min || value > max) {
      throw new UsageError(`--${flag}: expected ${integer ? 'an integer' : 'a number'} from ${min} to ${max}, got "${String(raw)}"`);
    }
    return value;
  };
  const faultPoints = values['fault-points'] ?? '';
  try {
    parseFaultPoints(faultPoints);
  } catch (error) {
    throw new UsageError(`--fault-points: ${(error as Error).message}`);
  }
  const leaseMs = number('lease-ms', 3_000, 500, 60_000);
  return {
    seed: number('seed', randomInt(1, 2 ** 31 - 1), 0, 2 ** 31 - 1),
    jobs: number('jobs', 3_000, 1, 10_000_000),
    durationMs: Math.round(number('minutes', 1.5, 0.1, 24 * 60, false) * 60_000),
    workers: number('workers', 3, 1, 64),
    concurrency: number('concurrency', 4, 1, 256),
    duplicateRatio: number('duplicates', 20, 0, 90) / 100,
    leaseMs,
    faultIntervalMs: number('fault-interval-ms', 3_000, 100, 3_600_000),
    maxWorkMs: number('max-work-ms', 250, 0, leaseMs),
    faultPoints,
    drainTimeoutMs: Math.round(number('drain-minutes', 1.5, 0.1, 24 * 60, false) * 60_000),
    databaseUrl: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres',
    keepSchema: values['keep-schema'] ?? false,
    fastPath: values['fast-path'] ?? false,
    groupCommit: values['group-commit'] ?? false,
    reportDir: values['report-dir'] ?? '.chaos',
    log: (line) => console.log(`[chaos] ${line}`),
  };
}

async function main(): Promise<number> {
  let options;
  try {
    options = parseOptions(process.argv.slice(2));
  } catch (error) {
    console.error(`${(error as Error).message}\n\n${USAGE}`);
    return 2;
  }
  if (!options) {
    console.log(USAGE);
    return 0;
  }
  const interrupt = new AbortController();
  let signals = 0;
  const onSignal = (signal: NodeJS.Signals) => {
    if (++signals > 1) process.exit(130);
    console.error(`[chaos] ${signal}: stopping and cleaning up (again to exit at once)`);
    interrupt.abort();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  options.log(`seed ${options.seed} (reproduce with --seed ${options.seed}); ${options.jobs} jobs, ${options.workers} workers`);
  let run;
  try {
    run = await runChaos(options, interrupt.signal);
  } catch (error) {
    console.error(`[chaos] the run could not be carried out: ${(error as Error).stack ?? String(error)}`);
    return interrupt.signal.aborted ? 130 : 2;
  }
  const summary = summarize(run);
  const path = writeJsonReport(run, summary, options.reportDir);
  console.log(`\n${formatTable(summary)}\n`);
  console.log(`[chaos] report: ${path}; history: ${writeHistory(run, options.reportDir)}`);
  if (summary.verdict === 'FAIL') {
    console.error(`[chaos] FAILED (seed ${summary.seed}): the history of each failing key is under "evidence" in ${path}`);
    return 1;
  }
  return 0;
}

process.exitCode = await main();
