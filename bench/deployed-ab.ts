/**
 * A/B of deployed worker processes: this checkout ("now") against another checkout ("old",
 * e.g. main) and the lean baseline, drains alternating in the same machine window.
 *
 * Usage: `npm run bench:deployed-ab -- <other-checkout> [--n 10000] [--reps 3] [--call-ms 0] [--specs "…"]`
 * (or `tsx bench/deployed-ab.ts …`). The other checkout is any commit of this repository with a
 * node_modules symlink, e.g. `git worktree add /tmp/ij-main main && ln -s "$PWD/node_modules" /tmp/ij-main/`.
 *
 * Specs (`--specs`, or the SPECS environment variable), separated by `|`:
 *   `lean <concurrency> [VAR=value …]`                       the lean baseline process (the first of a
 *                                                            concurrency is what the others at it are divided by)
 *   `<old|now> <contender> <concurrency> [VAR=value …]`      `idempotent-jobs worker` of that checkout
 * with contenders leased, fast-path, leased-group, fast-path-group, database-only (the `{ transaction }`
 * handler form, bench/support/deployed-database-only-handler.ts, with its defaults), and extra environment for
 * that drain, e.g. `"lean 64|old fast-path-group 64|now fast-path-group 64 GROUP_COMMIT_GROUPS=2"`.
 * `QUEUE_BACKEND=postgres` puts that drain's queue in BullMQ's PostgreSQL backend (a schema of the
 * bench's database); such a drain is divided by the first lean spec with the same setting.
 * `JOB_CONCURRENCY_LIMIT=<n>` gives every job of that drain one concurrency key of limit n (the
 * key `tenant:bench`; a limit above the concurrency is never reached).
 *
 * Only the worker binary (`bin/idempotent-jobs.js` and what it loads) comes from the other
 * checkout: the handler module (bench/support/deployed-handler.ts, which needs only `ctx` and
 * Kysely's `sql`), the lean baseline, the schema (migrated by this checkout; the workers run
 * with MIGRATE=false) and the measurement are this checkout's. Order: the specs forward in the
 * first repetition, backward in the second, and so on. Prints one line per drain (jobs/s and
 * CPU per 1,000 jobs: worker, its Postgres backends, Redis; see support/drain-cpu.ts), then
 * each ratio per repetition (now/old for the same contender and settings; each/lean at the same
 * concurrency) with its median (min–max), of jobs/s and of CPU per job.
 */
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { createBenchEnv } from './support/bench-env.js';
import { CLI_WORKER_SETTINGS, DEPLOYED_CONTENDERS, THIS_CHECKOUT, runDeployedDrain, type DeployedContender, type DeployedRun } from './support/deployed.js';
import { cpuPerThousandJobs } from './support/drain-cpu.js';
import { formatSpread, spread } from './support/stats.js';
import { optionReader } from './support/cli-args.js';

/** One drain of the list: which process, from which tree, with what settings. */
interface AbSpec {
  readonly tree: 'old' | 'now' | 'lean';
  readonly contender: DeployedContender;
  readonly concurrency: number;
  readonly extraEnv: Record<string, string>;
  /** Where the queue is: `QUEUE_BACKEND=postgres` in the spec puts it in BullMQ's PostgreSQL backend, the lean baseline's too. */
  readonly queueBackend: 'redis' | 'postgres';
  /** How it is printed, e.g. `now fast-path-group c 64 GROUP_COMMIT_GROUPS=2`. */
  readonly label: string;
  /** The same without the tree, to pair old with now. */
  readonly variant: string;
}

const DEFAULT_SPECS = 'lean 32|old leased 32|now leased 32|lean 64|old fast-path-group 64|now fast-path-group 64';

const args = parseArgs(process.argv.slice(2));
const env = await createBenchEnv();
const runs: Array<{ rep: number; spec: AbSpec; run: DeployedRun }> = [];
try {
  log(`deployed A/B: now ${THIS_CHECKOUT}, old ${args.other}, N ${args.n}, reps ${args.reps}, call ${args.callMs} ms, schema ${env.schema}`);
  for (let rep = 1; rep <= args.reps; rep++) {
    for (const spec of rep % 2 === 1 ? args.specs : [...args.specs].reverse()) {
      const run = await runDeployedDrain(env, {
        contender: spec.contender,
        concurrency: spec.concurrency,
        n: args.n,
        callMs: args.callMs,
        workerCheckout: spec.tree === 'old' ? args.other : THIS_CHECKOUT,
        extraEnv: spec.extraEnv,
        queueBackend: spec.queueBackend,
      });
      runs.push({ rep, spec, run });
      const cpu = cpuPerThousandJobs(run.cpu, run.n);
      const part = (ms: number | undefined) => (ms === undefined ? '–' : ms.toFixed(0));
      process.stdout.write(
        `rep ${rep} ${spec.label}: ${run.jobsPerSec.toFixed(0)} jobs/s (effects ${run.effects} over ${run.effectSpanMs.toFixed(0)} ms; ` +
          `drain ${run.wallMs.toFixed(0)} ms, start-up ${run.startupMs.toFixed(0)} ms), ` +
          `CPU ${part(cpu.total)} ms/1k jobs (node ${part(cpu.node)}, pg ${part(cpu.postgres)}, redis ${part(cpu.redis)})\n`,
      );
    }
  }
} finally {
  await env.teardown();
}
process.stdout.write(`\n${summarize().join('\n')}\n`);

// ---------------------------------------------------------------------------------------------

/**
 * Ratios per repetition: now/old per variant, then each drain against the lean baseline at its
 * concurrency; first of jobs/s, then of CPU per job (worker + its Postgres backends + Redis).
 */
function summarize(): string[] {
  return [...summarizeBy('jobs/s', (run) => run.jobsPerSec), '', ...summarizeBy('CPU per job', (run) => cpuPerThousandJobs(run.cpu, run.n).total)];
}

function summarizeBy(what: string, measure: (run: DeployedRun) => number): string[] {
  const rate = (rep: number, match: (spec: AbSpec) => boolean) => {
    const found = runs.find((r) => r.rep === rep && match(r.spec));
    return found && measure(found.run);
  };
  const reps = Array.from({ length: args.reps }, (_, i) => i + 1);
  const line = (title: string, ratios: Array<number | undefined>) => {
    const present = ratios.filter((r): r is number => r !== undefined);
    if (present.length === 0) return undefined;
    return `${title}: ${ratios.map((r) => (r === undefined ? 'n/a' : r.toFixed(2))).join(' ')}  median ${formatSpread(spread(present), 2)}`;
  };
  const out: string[] = [`${what}: ratios per repetition (${reps.map((r) => `rep ${r}`).join(', ')}), then median (min–max)`];
  const variants = [...new Set(args.specs.filter((s) => s.tree !== 'lean').map((s) => s.variant))];
  for (const variant of variants) {
    const ratios = reps.map((rep) => {
      const now = rate(rep, (s) => s.tree === 'now' && s.variant === variant);
      const old = rate(rep, (s) => s.tree === 'old' && s.variant === variant);
      return now !== undefined && old !== undefined ? now / old : undefined;
    });
    const text = line(`now/old ${variant}`, ratios);
    if (text) out.push(text);
  }
  // Each drain against the first lean spec of its concurrency in the list (another lean spec at
  // that concurrency, e.g. LEAN_PROTOCOL=keyed, is a contender like the others).
  const referenceOf = (spec: AbSpec) => args.specs.find((s) => s.tree === 'lean' && s.concurrency === spec.concurrency && s.queueBackend === spec.queueBackend);
  for (const spec of args.specs.filter((s) => referenceOf(s) !== s)) {
    const ratios = reps.map((rep) => {
      const mine = rate(rep, (s) => s === spec);
      const lean = rate(rep, (s) => s === referenceOf(spec));
      return mine !== undefined && lean !== undefined ? mine / lean : undefined;
    });
    const text = line(`${spec.label} / lean c ${spec.concurrency}`, ratios);
    if (text) out.push(text);
  }
  return out;
}

function parseArgs(argv: string[]) {
  const { value, positive } = optionReader(argv);
  const n = positive('--n', 10_000);
  const reps = positive('--reps', 3);
  // Each job waits this long outside its transaction first (a provider's call), the lean baseline's too.
  const callMs = positive('--call-ms', 0);
  const specs = (value('--specs') ?? process.env.SPECS ?? DEFAULT_SPECS).split('|').map((text) => parseSpec(text.trim()));
  const [otherArg, ...rest] = argv;
  if (!otherArg || rest.length > 0) throw new Error(`usage: tsx bench/deployed-ab.ts <other-checkout> [--n N] [--reps N] [--call-ms MS] [--specs "${DEFAULT_SPECS}"]`);
  const other = resolve(otherArg);
  if (!existsSync(resolve(other, 'bin/idempotent-jobs.js'))) throw new Error(`${other}: no bin/idempotent-jobs.js (not a checkout of this repository?)`);
  if (!existsSync(resolve(other, 'node_modules'))) throw new Error(`${other}: no node_modules (add a symlink to this checkout's: ln -s ${THIS_CHECKOUT}/node_modules ${other}/)`);
  if (specs.some((s) => s.tree === 'old') && other === THIS_CHECKOUT) log('note: the other checkout is this checkout, so "old" and "now" run the same code');
  return { n, reps, specs, other, callMs };
}

/** `lean 64 [VAR=value …]` or `now fast-path-group 64 [VAR=value …]`. */
function parseSpec(text: string): AbSpec {
  const words = text.split(/\s+/).filter(Boolean);
  const fail = (why: string): never => {
    throw new Error(`spec "${text}": ${why} (expected "lean <concurrency> [VAR=value …]" or "<old|now> <contender> <concurrency> [VAR=value …]")`);
  };
  const tree = words.shift();
  if (tree !== 'lean' && tree !== 'old' && tree !== 'now') return fail('starts with neither lean, old nor now');
  const contender = tree === 'lean' ? 'lean' : words.shift();
  const known = tree === 'lean' || (contender !== undefined && contender in CLI_WORKER_SETTINGS);
  if (!known) return fail(`unknown contender "${contender}" (known: ${DEPLOYED_CONTENDERS.filter((c) => c !== 'lean').join(', ')})`);
  const concurrency = Number(words.shift());
  if (!Number.isInteger(concurrency) || concurrency < 1) return fail('the concurrency must be a positive integer');
  const extraEnv: Record<string, string> = {};
  for (const word of words) {
    const match = /^([A-Z_][A-Z0-9_]*)=(.*)$/.exec(word);
    if (!match) return fail(`"${word}" is not VAR=value`);
    extraEnv[match[1]!] = match[2]!;
  }
  const queueBackend = extraEnv.QUEUE_BACKEND ?? 'redis';
  if (queueBackend !== 'redis' && queueBackend !== 'postgres') return fail(`QUEUE_BACKEND=${queueBackend}: expected redis or postgres`);
  // The drain sets the variable itself, with the queue's schema.
  delete extraEnv.QUEUE_BACKEND;
  const variant = [contender, `c ${concurrency}`, ...words].join(' ');
  return { tree, contender: contender as DeployedContender, concurrency, extraEnv, queueBackend, variant, label: tree === 'lean' ? variant : `${tree} ${variant}` };
}

function log(line: string): void {
  process.stderr.write(`${new Date().toISOString().slice(11, 19)} ${line}\n`);
}
