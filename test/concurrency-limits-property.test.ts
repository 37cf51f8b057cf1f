/**
 * Property test of per-key concurrency limits against a tiny reference model, on real Postgres:
 * random jobs of one concurrency key (limit 1 to 3) whose runs last half a lease, a lease, or
 * three leases, on the fast path or the leased path, delivered by three lanes at once through the
 * real runner; some runs are killed mid-run (the worker process dies: its transaction rolls back,
 * nothing it holds is freed or renewed, every later store call of it fails) or abandoned (the
 * shutdown deadline: its key given back, its handler's signal aborted). Every job is delivered
 * again until it is acknowledged.
 *
 * Checked against the model (`SlotModel`: the runs of the key going on now, and the jobs whose
 * effect committed): never more than `limit` runs at once, whatever their length (a handler's
 * run lasts until it returns; like any handler, it stops when `ctx.signal` aborts, which a run
 * that lost its slot is told before another run can take the slot); no job commits
 * twice; every job's effect is committed exactly once in the end. The invariants are those of
 * docs/architecture.md ("Invariants", "Per-key concurrency limits"). `PROPERTY_RUNS` (default 6)
 * sets the number of runs, `FC_SEED` the seed (printed by each run).
 */
import fc from 'fast-check';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { IdempotencyKeys, KeyedJobRunner, identityFromWireContract, resolveWorkerTiming, toWireJobData, type JobIdentity, type RunOutcome } from '../src/index.js';
import { PostgresKeyStore } from '../src/store/index.js';
import { InjectedCrash, faultingKeyStore } from './support/faulting-key-store.js';
import { propertyRuns } from './support/property-runs.js';
import { createEffectsTable } from './support/protocol-fixtures.js';
import { sleep } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const SCOPE = 'limits-prop';
const LEASE_MS = 300;
const HEARTBEAT_MS = 100;
const LANES = 3;
/** A deferred job is delivered again after its deferral, at most this long (the lanes poll; no broker here). */
const REDELIVERY_MAX_MS = 40;

let env: TestEnv;
let store: PostgresKeyStore;
const silent = pino({ level: 'silent' });

beforeAll(async () => {
  env = await createTestEnv('concurrency_limits_property');
  await createEffectsTable(env.db, env.schema);
  store = new PostgresKeyStore(env.db, env.schema);
});
afterAll(async () => {
  await env?.teardown();
});

/** The reference model: the runs of the concurrency key going on now, and the jobs whose effect committed. */
class SlotModel {
  readonly #running = new Set<string>();
  readonly #committed = new Set<string>();
  most = 0;

  constructor(readonly limit: number) {}

  /** A run of `job` starts its handler: a problem when the key already runs `limit`. */
  start(job: string): string | undefined {
    this.#running.add(job);
    this.most = Math.max(this.most, this.#running.size);
    return this.#running.size > this.limit ? `${this.#running.size} runs at once (${[...this.#running].join(', ')}), limit ${this.limit}` : undefined;
  }

  end(job: string): void {
    this.#running.delete(job);
  }

  /** `job`'s effect committed: a problem the second time. */
  commit(job: string): string | undefined {
    if (this.#committed.has(job)) return `${job} committed twice`;
    this.#committed.add(job);
    return undefined;
  }

  get committed(): ReadonlySet<string> {
    return this.#committed;
  }
}

/**
 * Waits `ms`, or throws the signal's reason once it aborts: the handlers here stop when told to,
 * as the contract asks (a run whose slot is lost is told through `ctx.signal`; the library cannot
 * stop a handler's code, only refuse its commit).
 */
async function sleepUnlessAborted(ms: number, signal: AbortSignal): Promise<void> {
  if (signal.aborted) throw signal.reason;
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason as Error);
    };
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

type Fate = 'runs' | 'killed' | 'abandoned';

interface JobPlan {
  /** The run's length, in leases. */
  readonly leases: 0.5 | 1 | 3;
  readonly fastPath: boolean;
  /** What befalls its first delivery, at `at` of its run. */
  readonly fate: Fate;
  readonly at: number;
}

const jobPlan: fc.Arbitrary<JobPlan> = fc.record({
  leases: fc.constantFrom<JobPlan['leases']>(0.5, 1, 3),
  fastPath: fc.boolean(),
  fate: fc.constantFrom<Fate>('runs', 'runs', 'runs', 'killed', 'abandoned'),
  at: fc.constantFrom(0.2, 0.6),
});

const covered = { runs: 0, deliveries: 0, deferrals: 0, killed: 0, abandoned: 0, longRuns: 0, fastPath: 0, atLimit: 0 };
let scenarioCount = 0;

it('never more than `limit` runs of a key at once, whatever their length, kills and abandons; every job commits exactly once', { timeout: 600_000 }, async () => {
  const { numRuns, seed } = propertyRuns('concurrency limits property', 6);
  await fc.assert(
    fc.asyncProperty(fc.integer({ min: 1, max: 3 }), fc.array(jobPlan, { minLength: 2, maxLength: 5 }), async (limit, plans) => {
      await scenario(limit, plans);
    }),
    { numRuns, seed },
  );
  console.log(`concurrency limits property covered: ${JSON.stringify(covered)}`);
});

async function scenario(limit: number, plans: readonly JobPlan[]): Promise<void> {
  scenarioCount++;
  const group = `tenant:p${scenarioCount}`;
  const model = new SlotModel(limit);
  const problems: string[] = [];
  const queue = plans.map((plan, n) => ({ id: `s${scenarioCount}-j${n}`, plan, deliveries: 0, readyAt: 0 }));
  const all = [...queue];

  const deliver = async (job: (typeof queue)[number]): Promise<boolean> => {
    job.deliveries++;
    covered.deliveries++;
    const first = job.deliveries === 1;
    let dead = false;
    const faulty = faultingKeyStore(store, () => (dead ? { kind: 'crash', timing: 'before' } : undefined));
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: LEASE_MS, groupCommit: false }, faulty);
    const runMs = job.plan.leases * LEASE_MS;
    const runner: KeyedJobRunner<{ n: number }, unknown, { id: string; data: unknown }> = new KeyedJobRunner<{ n: number }, unknown, { id: string; data: unknown }>({
      keys,
      timing: resolveWorkerTiming({ heartbeatMs: HEARTBEAT_MS, deferMinMs: 5, deferMaxMs: REDELIVERY_MAX_MS }, LEASE_MS),
      fastPath: job.plan.fastPath,
      identityOf: (message) => identityFromWireContract({ id: message.id, name: 'sync', data: message.data }) as JobIdentity<{ n: number }>,
      handler: async (ctx) => {
        covered.runs++;
        const problem = model.start(job.id);
        if (problem) problems.push(problem);
        if (model.most === limit) covered.atLimit++;
        try {
          if (first && job.plan.fate !== 'runs') {
            await sleep(runMs * job.plan.at);
            if (job.plan.fate === 'killed') {
              covered.killed++;
              // The process dies here: nothing it holds is freed or renewed from now on.
              dead = true;
              throw new InjectedCrash('handler');
            }
            covered.abandoned++;
            void runner.abandonActive();
            if (!ctx.signal.aborted) await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve, { once: true }));
            throw ctx.signal.reason;
          }
          await sleepUnlessAborted(runMs, ctx.signal);
          return await ctx.transaction(async (tx) => {
            await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, 'w')`.execute(tx);
            return ctx.data.n;
          });
        } finally {
          model.end(job.id);
        }
      },
      logger: silent,
    });
    const data = toWireJobData(SCOPE, job.id, { n: 1 }, { concurrency: { key: group, limit } });
    let outcome: RunOutcome | undefined;
    try {
      outcome = await runner.run({ message: { id: job.id, data }, id: job.id, label: `Job ${job.id}`, queue: 'q', name: 'sync', lastAttempt: false, deferrals: 0 });
    } catch (error) {
      if (!faulty.crashed()) throw error;
    }
    if (outcome?.kind === 'completed') {
      const problem = model.commit(job.id);
      if (problem) problems.push(problem);
    }
    if (outcome?.kind === 'deferred' || outcome?.kind === 'store-unavailable') covered.deferrals++;
    const acknowledged = outcome !== undefined && ['completed', 'replayed'].includes(outcome.kind);
    if (outcome && !acknowledged && !['deferred', 'store-unavailable', 'retry', 'abandoned'].includes(outcome.kind)) problems.push(`${job.id} came to ${outcome.kind}`);
    job.readyAt = performance.now() + (outcome && 'retryAfterMs' in outcome ? Math.min(outcome.retryAfterMs, REDELIVERY_MAX_MS) : REDELIVERY_MAX_MS);
    return acknowledged;
  };

  for (const plan of plans) {
    if (plan.leases === 3) covered.longRuns++;
    if (plan.fastPath) covered.fastPath++;
  }
  const deadline = performance.now() + 60_000;
  const lane = async () => {
    while (queue.length > 0 && performance.now() < deadline) {
      const now = performance.now();
      const index = queue.findIndex((job) => job.readyAt <= now);
      if (index < 0) {
        await sleep(5);
        continue;
      }
      const [job] = queue.splice(index, 1);
      if (!(await deliver(job!))) queue.push(job!);
    }
  };
  await Promise.all(Array.from({ length: LANES }, lane));

  expect(problems).toEqual([]);
  expect(queue.map((job) => job.id)).toEqual([]);
  expect([...model.committed].sort()).toEqual(all.map((job) => job.id).sort());
  const { rows } = await sql<{ key: string; n: number }>`
    select key, count(*)::int as n from ${sql.id(env.schema, 'effects')} where scope = ${SCOPE} and key like ${`s${scenarioCount}-%`} group by key order by key`.execute(env.db);
  expect(rows).toEqual(all.map((job) => ({ key: job.id, n: 1 })).sort((a, b) => (a.key < b.key ? -1 : 1)));
}
