/**
 * What tracing costs when no OpenTelemetry SDK is registered (the API installed, as it is here
 * as a devDependency; without the API the helpers do even less):
 *
 * 1. Micro: the tracing wrappers a leased job goes through (job span, claim, effect
 *    transaction, commit) around empty work, against the same empty work unwrapped. ns a job.
 * 2. A/B against a baseline checkout (`--baseline-src <dir>`: another commit's `src/`, say
 *    main's), in one process on one Postgres pool: N keys claimed and completed through
 *    `IdempotencyKeys.claim` + `commitEffect` (concurrency 8), rounds alternating A and B so
 *    that the machine's load falls on both alike; the ratio of the median rates.
 *
 *   npx tsx bench/tracing-overhead.ts [--baseline-src ../main/src] [--rounds 8] [--keys 2000] [--micro-jobs 500000]
 */
import { randomUUID } from 'node:crypto';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { sql } from 'kysely';
import { IdempotencyKeys, createPostgresDb } from '../src/index.js';
import { JobTracing } from '../src/telemetry/job-tracing.js';
import { traceClaim, traceCommit, traceEffectTransaction } from '../src/telemetry/claim-tracing.js';
import { createBenchEnv } from './support/bench-env.js';
import { optionReader } from './support/cli-args.js';

const argv = process.argv.slice(2);
const options = optionReader(argv);
const baselineSrc = options.value('--baseline-src');
const rounds = options.positive('--rounds', 8);
const keysPerRound = options.positive('--keys', 2_000);
const microJobs = options.positive('--micro-jobs', 500_000);
if (argv.length > 0) throw new Error(`unknown arguments: ${argv.join(' ')}`);

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;

async function micro(): Promise<void> {
  const tracing = new JobTracing('bench', () => false);
  const claim = { kind: 'claimed' as const, scope: 's', key: 'k', owner: 'o', fence: 1, attempts: 1, lockedUntil: null };
  const job = { id: 'j', data: { idempotencyKey: 'k', payload: {} }, attemptsMade: 0 };
  const bare = async () => {
    await (async () => claim)();
    await (async () => (async () => undefined)())();
  };
  const traced = () =>
    tracing.run(job, async () => {
      await traceClaim('s', 'k', 'bench', async () => claim);
      await traceEffectTransaction(claim, false, () => traceCommit(async () => undefined));
    });
  const time = async (run: () => Promise<void>) => {
    const start = process.hrtime.bigint();
    for (let i = 0; i < microJobs; i++) await run();
    return Number(process.hrtime.bigint() - start) / microJobs;
  };
  const bareNs: number[] = [];
  const tracedNs: number[] = [];
  for (let i = 0; i < 5; i++) {
    bareNs.push(await time(bare));
    tracedNs.push(await time(traced));
  }
  const b = median(bareNs);
  const t = median(tracedNs);
  console.log(`micro (${microJobs} jobs x 5 alternating runs, no SDK): bare ${b.toFixed(0)} ns/job, traced ${t.toFixed(0)} ns/job, overhead ${(t - b).toFixed(0)} ns/job`);
}

async function protocolAB(baselineDir: string): Promise<void> {
  const baseline = (await import(pathToFileURL(resolve(baselineDir, 'index.ts')).href)) as { IdempotencyKeys: typeof IdempotencyKeys };
  const env = await createBenchEnv();
  const db = createPostgresDb({ connectionString: env.databaseUrl, maxConnections: 10, applicationName: 'idempotent-jobs:bench-tracing' }, () => {});
  const variants = {
    baseline: new baseline.IdempotencyKeys({ db, schema: env.schema }),
    traced: new IdempotencyKeys({ db, schema: env.schema }),
  };
  const rate = async (keys: IdempotencyKeys) => {
    const prefix = randomUUID();
    let next = 0;
    const start = performance.now();
    await Promise.all(
      Array.from({ length: 8 }, async () => {
        while (next < keysPerRound) {
          const key = `${prefix}-${next++}`;
          const claim = await keys.claim('bench', key, 'f', { queue: 'bench' });
          if (claim.kind !== 'claimed') throw new Error(`unexpected ${claim.kind}`);
          await keys.commitEffect(claim, async (tx) => {
            await sql`insert into ${sql.id(env.schema, 'bench_effects')} (scope, key, worker) values ('bench', ${key}, 'a')`.execute(tx);
            return null;
          });
        }
      }),
    );
    return keysPerRound / ((performance.now() - start) / 1000);
  };
  const rates: Record<keyof typeof variants, number[]> = { baseline: [], traced: [] };
  try {
    await rate(variants.traced); // warm-up
    await rate(variants.baseline);
    for (let round = 0; round < rounds; round++) {
      const order = round % 2 === 0 ? (['baseline', 'traced'] as const) : (['traced', 'baseline'] as const);
      for (const name of order) rates[name].push(await rate(variants[name]));
      await env.resetTables();
      console.log(`round ${round + 1}: baseline ${rates.baseline.at(-1)!.toFixed(0)} jobs/s, traced ${rates.traced.at(-1)!.toFixed(0)} jobs/s`);
    }
  } finally {
    await db.destroy();
    await env.teardown();
  }
  const b = median(rates.baseline);
  const t = median(rates.traced);
  const ratios = rates.traced.map((r, i) => r / rates.baseline[i]!);
  console.log(
    `claim + commitEffect, ${keysPerRound} keys x ${rounds} alternating rounds, concurrency 8, no SDK: ` +
      `baseline median ${b.toFixed(0)} jobs/s, traced median ${t.toFixed(0)} jobs/s, ratio ${(t / b).toFixed(3)} ` +
      `(per-round ratios ${Math.min(...ratios).toFixed(3)}–${Math.max(...ratios).toFixed(3)})`,
  );
}

await micro();
if (baselineSrc) await protocolAB(baselineSrc);
