/**
 * Deployed worker processes through PgBouncer in transaction mode against the same processes on
 * direct connections: the leased path and the fast path with group commit, drains alternating
 * in the same machine window.
 *
 * Usage: `npm run bench:pgbouncer -- [--n 20000] [--reps 3] [--concurrency 64] [--pool-size 20]`
 * (or `tsx bench/pgbouncer-ab.ts …`).
 *
 * Each drain is bench/support/deployed.ts's: N unique jobs in a paused queue, one
 * `idempotent-jobs worker` process (CONCURRENCY jobs at once, a pool of CONCURRENCY + 2), the
 * rate read from the effects' timestamps. Through PgBouncer, the worker's `DATABASE_URL` is a
 * PgBouncer started for the run (test/support/pgbouncer.ts: transaction mode, `--pool-size`
 * server connections, the configuration docs/operations.md gives) in front of the bench's
 * Postgres, and its `DATABASE_DIRECT_URL` that Postgres (migrations and maintenance locks). Order:
 * direct then pooled for each contender in odd repetitions, the reverse in even ones. Prints one
 * line per drain, then pooled/direct per contender and repetition with its median (min–max).
 */
import { createBenchEnv } from './support/bench-env.js';
import { runDeployedDrain, type DeployedContender, type DeployedRun } from './support/deployed.js';
import { formatSpread, spread } from './support/stats.js';
import { PgBouncer } from '../test/support/pgbouncer.js';
import { optionReader } from './support/cli-args.js';

type Route = 'direct' | 'pgbouncer';
const CONTENDERS: readonly DeployedContender[] = ['leased', 'fast-path-group'];

const args = parseArgs(process.argv.slice(2));
const env = await createBenchEnv();
const bouncer = await PgBouncer.start({ upstream: env.databaseUrl, poolSize: args.poolSize });
const runs: Array<{ rep: number; contender: DeployedContender; route: Route; run: DeployedRun }> = [];
try {
  log(`PgBouncer A/B: N ${args.n}, reps ${args.reps}, concurrency ${args.concurrency}, PgBouncer ${bouncer.url()} (transaction mode, ${args.poolSize} server connections), schema ${env.schema}`);
  for (let rep = 1; rep <= args.reps; rep++) {
    const routes: Route[] = rep % 2 === 1 ? ['direct', 'pgbouncer'] : ['pgbouncer', 'direct'];
    for (const contender of CONTENDERS) {
      for (const route of routes) {
        const run = await runDeployedDrain(env, {
          contender,
          concurrency: args.concurrency,
          n: args.n,
          databaseUrl: route === 'pgbouncer' ? bouncer.url() : undefined,
        });
        runs.push({ rep, contender, route, run });
        process.stdout.write(
          `rep ${rep} ${contender} c ${args.concurrency} ${route}: ${run.jobsPerSec.toFixed(0)} jobs/s ` +
            `(effects ${run.effects} over ${run.effectSpanMs.toFixed(0)} ms; drain ${run.wallMs.toFixed(0)} ms)\n`,
        );
      }
    }
  }
} finally {
  await bouncer.stop();
  await env.teardown();
}
process.stdout.write(`\n${summarize().join('\n')}\n`);

// ---------------------------------------------------------------------------------------------

function summarize(): string[] {
  const reps = Array.from({ length: args.reps }, (_, i) => i + 1);
  const rate = (rep: number, contender: DeployedContender, route: Route) =>
    runs.find((r) => r.rep === rep && r.contender === contender && r.route === route)?.run.jobsPerSec;
  const out = [`jobs/s median (min–max), and pgbouncer/direct per repetition (${reps.map((r) => `rep ${r}`).join(', ')}) with its median (min–max)`];
  for (const contender of CONTENDERS) {
    const of = (route: Route) => reps.map((rep) => rate(rep, contender, route)).filter((v): v is number => v !== undefined);
    const ratios = reps.map((rep) => {
      const pooled = rate(rep, contender, 'pgbouncer');
      const direct = rate(rep, contender, 'direct');
      return pooled !== undefined && direct !== undefined ? pooled / direct : undefined;
    });
    const present = ratios.filter((r): r is number => r !== undefined);
    out.push(
      `${contender} c ${args.concurrency}: direct ${formatSpread(spread(of('direct')))}, pgbouncer ${formatSpread(spread(of('pgbouncer')))}; ` +
        `pgbouncer/direct ${ratios.map((r) => (r === undefined ? 'n/a' : r.toFixed(2))).join(' ')}  median ${formatSpread(spread(present), 2)}`,
    );
  }
  return out;
}

function parseArgs(argv: string[]) {
  const { positive } = optionReader(argv);
  const parsed = {
    n: positive('--n', 20_000),
    reps: positive('--reps', 3),
    concurrency: positive('--concurrency', 64),
    poolSize: positive('--pool-size', 20),
  };
  if (argv.length > 0) throw new Error(`unknown arguments: ${argv.join(' ')} (usage: tsx bench/pgbouncer-ab.ts [--n N] [--reps N] [--concurrency C] [--pool-size P])`);
  return parsed;
}

function log(line: string): void {
  process.stderr.write(`${new Date().toISOString().slice(11, 19)} ${line}\n`);
}
