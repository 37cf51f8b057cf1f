/**
 * One throughput drain, for profiling: `node --cpu-prof --import tsx bench/profile-throughput.ts
 * <contender> [n] [duplicateRatio]`. Prints the run as JSON.
 */
import { createBenchEnv, RoundTripCounter } from './support/bench-env.js';
import { runThroughput, type Contender } from './support/throughput.js';

const contenders: Contender[] = ['bullmq-noop', 'bullmq-tx', 'leased', 'fast-path', 'leased-group', 'fast-path-group', 'leased-async-claim', 'leased-unbatched', 'fast-path-no-probe', 'leased-two-trip-commit', 'fast-path-two-trip-commit', 'leased-3-writes', 'leased-3-steps'];
const contender = process.argv[2] as Contender;
if (!contenders.includes(contender)) throw new Error(`first argument: one of ${contenders.join(', ')} (got ${JSON.stringify(process.argv[2])})`);
const n = Number(process.argv[3] ?? 5000);
const duplicateRatio = Number(process.argv[4] ?? 0);
if (!Number.isInteger(n) || n < 1) throw new Error(`n must be a positive integer (got ${process.argv[3]})`);
if (!(duplicateRatio >= 0 && duplicateRatio < 1)) throw new Error(`duplicateRatio must be in [0, 1) (got ${process.argv[4]})`);

const counter = new RoundTripCounter();
counter.install();
const env = await createBenchEnv();
try {
  console.log(JSON.stringify(await runThroughput(env, counter, { contender, n, concurrency: Number(process.env.BENCH_CONCURRENCY ?? 16), duplicateRatio })));
} finally {
  await env.teardown();
}
