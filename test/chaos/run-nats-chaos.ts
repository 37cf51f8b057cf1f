/**
 * `npm run chaos -- --broker nats [--seed N] [--jobs N] [--minutes M] [--consumers K]
 * [--concurrency C] [--lease-ms MS] [--fault-interval-ms MS] [--drain-minutes M]`: the short
 * NATS JetStream profile (about 2 minutes; see nats-chaos.ts). Exits 0 when the checker found
 * nothing lost, duplicated, unexpected, failed or left processing; 1 when a check failed; 2 on
 * bad flags or when the run could not be carried out.
 */
import { randomInt } from 'node:crypto';
import { parseArgs } from 'node:util';
import { runNatsChaos } from './nats-chaos.js';

export async function runNatsChaosCommand(argv: string[]): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      strict: true,
      options: Object.fromEntries(
        ['seed', 'jobs', 'minutes', 'consumers', 'concurrency', 'lease-ms', 'fault-interval-ms', 'drain-minutes', 'fault-points'].map((name) => [name, { type: 'string' as const }]),
      ),
    }));
  } catch (error) {
    console.error(`${(error as Error).message}\n\nUsage: npm run chaos -- --broker nats [--seed N] [--jobs N] [--minutes M] [--consumers K] [--concurrency C] [--lease-ms MS] [--fault-interval-ms MS] [--drain-minutes M] [--fault-points SPEC]`);
    return 2;
  }
  const number = (name: string, fallback: number) => {
    const raw = values[name];
    const value = raw === undefined ? fallback : Number(raw);
    if (!Number.isFinite(value) || value < 0) throw new Error(`--${name}: expected a number, got "${raw}"`);
    return value;
  };
  const seed = number('seed', randomInt(1, 2 ** 31 - 1));
  const log = (line: string) => console.log(`[chaos:nats] ${new Date().toISOString().slice(11, 19)} ${line}`);
  const options = {
    seed,
    jobs: number('jobs', 400),
    durationMs: Math.round(number('minutes', 1) * 60_000),
    consumers: number('consumers', 3),
    concurrency: number('concurrency', 4),
    duplicateRatio: 0.2,
    leaseMs: number('lease-ms', 3_000),
    faultIntervalMs: number('fault-interval-ms', 3_000),
    maxWorkMs: 250,
    faultPoints: (values['fault-points'] as string | undefined) ?? 'after-claim:0.002,before-commit:0.002,after-commit:0.002',
    drainTimeoutMs: Math.round(number('drain-minutes', 1.5) * 60_000),
    log,
  };
  log(`seed ${seed} (reproduce with --seed ${seed}); ${options.jobs} keys, ${options.consumers} consumers × ${options.concurrency}`);
  let run;
  try {
    run = await runNatsChaos(options);
  } catch (error) {
    console.error(`[chaos:nats] the run could not be carried out: ${(error as Error).stack ?? String(error)}`);
    return 2;
  }
  const { result, faults } = run;
  log(`faults: ${Object.entries(faults).map(([kind, n]) => `${kind} ${n}`).join(', ') || 'none'}`);
  log(
    `acknowledged keys ${result.acknowledgedKeys}; lost ${result.lost.length}, duplicated ${result.duplicated.length}, unexpected ${result.unexpected.length}, ` +
      `unfinished ${result.unfinished.length}, failed keys ${result.failedKeys.length}, left processing ${result.leftProcessing.length}, ` +
      `committed overlaps ${result.committedOverlaps.length}, fence mismatches ${result.fenceMismatches.length}; lease overlaps (fenced) ${result.leaseOverlaps}`,
  );
  if (!result.ok) {
    console.error(`[chaos:nats] FAILED (seed ${seed}): lost ${result.lost.slice(0, 10).join(' ')} duplicated ${result.duplicated.slice(0, 10).join(' ')} processing ${result.leftProcessing.slice(0, 10).join(' ')}`);
    return 1;
  }
  log('PASS');
  return 0;
}
